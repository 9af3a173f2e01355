#include "attic/server/metrics.h"

#include <cstdio>

namespace attic::server {

namespace {

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

void Line(std::string* out, const std::string& name, const std::string& labels, double v) {
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += " " + Num(v) + "\n";
}

void Header(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, std::string* out) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    Line(out, name + "_bucket", "le=\"" + Num(bounds_[i]) + "\"", static_cast<double>(cum));
  }
  cum += counts_.back();
  Line(out, name + "_bucket", "le=\"+Inf\"", static_cast<double>(cum));
  Line(out, name + "_sum", "", sum_);
  Line(out, name + "_count", "", static_cast<double>(count_));
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      queue_({0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}) {}

void Metrics::CountHttp(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_[{endpoint, status}];
}

void Metrics::Observe(const engine::RequestRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string outcome = r.finish_reason;
  if (outcome.empty()) {
    outcome = r.code == StatusCode::kCancelled          ? "cancelled"
              : r.code == StatusCode::kDeadlineExceeded ? "timeout"
                                                        : "error";
  }
  ++finished_[outcome];
  prompt_tokens_ += r.usage.prompt_tokens;
  cached_tokens_ += r.usage.cached_tokens;
  generated_tokens_ += r.usage.completion_tokens;
  if (r.ttft_seconds >= 0) {
    ttft_.Observe(r.ttft_seconds);
    queue_.Observe(r.queue_seconds);
  }
  for (double g : r.inter_token_seconds) tpot_.Observe(g);
}

std::string Metrics::Render(const engine::SchedulerStats& s) const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  Header(&out, "attic_http_requests_total", "counter", "HTTP responses by endpoint and status code.");
  for (const auto& [key, n] : http_) {
    Line(&out, "attic_http_requests_total", "endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"",
         static_cast<double>(n));
  }
  Header(&out, "attic_requests_finished_total", "counter",
         "Generation requests by outcome (stop, length, cancelled, timeout, error).");
  for (const auto& [outcome, n] : finished_) {
    Line(&out, "attic_requests_finished_total", "outcome=\"" + outcome + "\"", static_cast<double>(n));
  }
  Header(&out, "attic_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
  Line(&out, "attic_prompt_tokens_total", "", static_cast<double>(prompt_tokens_));
  Header(&out, "attic_prompt_tokens_reused_total", "counter",
         "Prompt tokens whose KV was reused from resident sequences instead of prefilled.");
  Line(&out, "attic_prompt_tokens_reused_total", "", static_cast<double>(cached_tokens_));
  Header(&out, "attic_generation_tokens_total", "counter", "Generated (sampled) tokens.");
  Line(&out, "attic_generation_tokens_total", "", static_cast<double>(generated_tokens_));
  Header(&out, "attic_time_to_first_token_seconds", "histogram", "Request arrival to first sampled token.");
  ttft_.Render("attic_time_to_first_token_seconds", &out);
  Header(&out, "attic_time_per_output_token_seconds", "histogram", "Gap between consecutive sampled tokens.");
  tpot_.Render("attic_time_per_output_token_seconds", &out);
  Header(&out, "attic_queue_wait_seconds", "histogram", "Request arrival to admission.");
  queue_.Render("attic_queue_wait_seconds", &out);
  Header(&out, "attic_requests_waiting", "gauge", "Requests in the waiting queue.");
  Line(&out, "attic_requests_waiting", "", s.waiting);
  Header(&out, "attic_requests_running", "gauge", "Admitted sequences (prefilling or decoding).");
  Line(&out, "attic_requests_running", "", s.running);
  Header(&out, "attic_requests_prefilling", "gauge", "Admitted sequences still prefilling.");
  Line(&out, "attic_requests_prefilling", "", s.prefilling);
  Header(&out, "attic_kv_blocks_total", "gauge", "KV blocks in the compute-buffer pool.");
  Line(&out, "attic_kv_blocks_total", "", s.kv_blocks_total);
  Header(&out, "attic_kv_blocks_used", "gauge", "KV blocks held by running and resident sequences.");
  Line(&out, "attic_kv_blocks_used", "", s.kv_blocks_used);
  Header(&out, "attic_kv_blocks_free", "gauge", "Free KV blocks.");
  Line(&out, "attic_kv_blocks_free", "", s.kv_blocks_free);
  Header(&out, "attic_kv_blocks_resident", "gauge", "KV blocks held by finished sequences kept for reuse.");
  Line(&out, "attic_kv_blocks_resident", "", s.kv_blocks_resident);
  Header(&out, "attic_resident_sequences", "gauge", "Finished sequences whose KV is resident.");
  Line(&out, "attic_resident_sequences", "", s.resident_sequences);
  Header(&out, "attic_resident_evictions_total", "counter", "Resident sequences evicted (LRU) to free KV blocks.");
  Line(&out, "attic_resident_evictions_total", "", static_cast<double>(s.evicted_sequences));
  Header(&out, "attic_decode_batch_peak", "gauge", "Most sequences decoded together in one forward step.");
  Line(&out, "attic_decode_batch_peak", "", s.peak_decode_batch);
  Header(&out, "attic_scheduler_steps_total", "counter", "Forward steps run by the scheduler.");
  Line(&out, "attic_scheduler_steps_total", "", static_cast<double>(s.steps));
  return out;
}

}  // namespace attic::server
