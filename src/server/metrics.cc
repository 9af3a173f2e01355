#include "attic/server/metrics.h"

#include <charconv>
#include <cmath>
#include <type_traits>

#include "attic/pq/sparse_planner.h"
#include "attic/store/store_planner.h"

namespace attic::server {

namespace {

// Integers (counters, gauges, bucket counts) print exactly; other values in the shortest
// form that reads back as the same double (std::to_chars), so a scrape never rounds a
// large counter or a long-running sum (printf's %.9g rounded anything past 9 significant digits).
template <typename T>
std::string Num(T v) {
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else {
    const double d = v;
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "+Inf" : "-Inf";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof(buf), d);
    return std::string(buf, r.ptr);
  }
}

template <typename T>
void Line(std::string* out, const std::string& name, const std::string& labels, T v) {
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
    Line(out, name + "_bucket", "le=\"" + Num(bounds_[i]) + "\"", cum);
  }
  cum += counts_.back();
  Line(out, name + "_bucket", "le=\"+Inf\"", cum);
  Line(out, name + "_sum", "", sum_);
  Line(out, name + "_count", "", count_);
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      queue_({0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}) {}

void Metrics::CountHttp(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_[{endpoint, status}];
}

void Metrics::CountLink(const LinkPrep& prep, bool linked) {
  std::lock_guard<std::mutex> lock(mu_);
  linked_requests_ += linked ? 1 : 0;
  for (const auto& [tier, n] : prep.hits_by_tier) chunk_hits_[tier] += n;
  chunk_misses_ += prep.regenerated;
  chunk_regenerated_tokens_ += prep.regenerated_tokens;
}

void Metrics::Observe(const engine::RequestRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string outcome = r.finish_reason;
  if (outcome.empty()) {
    outcome = r.code == StatusCode::kCancelled          ? "cancelled"
              : r.code == StatusCode::kDeadlineExceeded ? "timeout"
                                                        : "error";
  }
  // A request of n choices ends once per choice: counted (and timed to its first token)
  // as one request, by choice 0; every choice's tokens count.
  if (r.index == 0) ++finished_[outcome];
  prompt_tokens_ += r.usage.prompt_tokens;
  cached_tokens_ += r.usage.cached_tokens;
  recomputed_tokens_ += r.usage.recomputed_tokens;
  generated_tokens_ += r.usage.completion_tokens;
  if (r.ttft_seconds >= 0 && r.index == 0) {
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
    Line(&out, "attic_http_requests_total",
         "endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"", n);
  }
  Header(&out, "attic_requests_finished_total", "counter",
         "Generation requests by outcome (stop, length, cancelled, timeout, error).");
  for (const auto& [outcome, n] : finished_) {
    Line(&out, "attic_requests_finished_total", "outcome=\"" + outcome + "\"", n);
  }
  Header(&out, "attic_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
  Line(&out, "attic_prompt_tokens_total", "", prompt_tokens_);
  Header(&out, "attic_prompt_tokens_computed_total", "counter",
         "Prompt tokens computed by forward steps (prefilled; reused KV is not computed): "
         "a prompt shared by n choices counts once.");
  Line(&out, "attic_prompt_tokens_computed_total", "", s.prompt_tokens_computed);
  Header(&out, "attic_prompt_tokens_reused_total", "counter",
         "Prompt tokens whose KV was reused from resident sequences instead of prefilled.");
  Line(&out, "attic_prompt_tokens_reused_total", "", cached_tokens_);
  Header(&out, "attic_link_recomputed_tokens_total", "counter",
         "Cached prompt tokens (linked context-cache chunks) recomputed to link them.");
  Line(&out, "attic_link_recomputed_tokens_total", "", recomputed_tokens_);
  Header(&out, "attic_linked_requests_total", "counter", "Requests whose prompt linked cached chunks.");
  Line(&out, "attic_linked_requests_total", "", linked_requests_);
  Header(&out, "attic_context_chunk_hits_total", "counter",
         "Context-cache chunks a request found stored, by the tier that held them.");
  for (const auto& [tier, n] : chunk_hits_) Line(&out, "attic_context_chunk_hits_total", "tier=\"" + tier + "\"", n);
  Header(&out, "attic_context_chunk_misses_total", "counter",
         "Context-cache chunks whose KV was gone (evicted, lost) and was prefilled again.");
  Line(&out, "attic_context_chunk_misses_total", "", chunk_misses_);
  Header(&out, "attic_context_chunk_regenerated_tokens_total", "counter", "Tokens prefilled again for those chunks.");
  Line(&out, "attic_context_chunk_regenerated_tokens_total", "", chunk_regenerated_tokens_);
  Header(&out, "attic_generation_tokens_total", "counter", "Generated (sampled) tokens.");
  Line(&out, "attic_generation_tokens_total", "", generated_tokens_);
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
  Line(&out, "attic_resident_evictions_total", "", s.evicted_sequences);
  Header(&out, "attic_decode_batch_peak", "gauge", "Most sequences decoded together in one forward step.");
  Line(&out, "attic_decode_batch_peak", "", s.peak_decode_batch);
  Header(&out, "attic_scheduler_steps_total", "counter", "Forward steps run by the scheduler.");
  Line(&out, "attic_scheduler_steps_total", "", s.steps);
  // Loading stored KV into the compute buffer (paper 001 section 3.2).
  const store::KvLoadStats k = s.kv.Value<store::KvLoadStats>();
  Header(&out, "attic_kv_load_total", "counter", "Stored KV entries entered into the compute buffer, by mode.");
  Line(&out, "attic_kv_load_total", "mode=\"layerwise\"", k.layerwise_loads);
  Line(&out, "attic_kv_load_total", "mode=\"sync\"", k.loads - k.layerwise_loads);
  Header(&out, "attic_kv_load_failed_total", "counter",
         "Loads whose streamed read broke off after the request started: the request recomputed its prompt.");
  Line(&out, "attic_kv_load_failed_total", "", k.failed_loads);
  Header(&out, "attic_kv_read_buffer_fetches_total", "counter",
         "Stored entries of waiting jobs fetched ahead of admission (read buffer), and how many were used.");
  Line(&out, "attic_kv_read_buffer_fetches_total", "result=\"issued\"", k.staged);
  Line(&out, "attic_kv_read_buffer_fetches_total", "result=\"used\"", k.staged_used);
  Header(&out, "attic_kv_admissions_deferred_total", "counter",
         "Requests left waiting (not blocking the step loop) until their session's queued save was stored.");
  Line(&out, "attic_kv_admissions_deferred_total", "", k.deferred_for_save);
  Header(&out, "attic_kv_load_seconds_total", "counter",
         "Time spent loading stored KV: fetch (step loop, not hidden by the read buffer), enter (RoPE + copy "
         "into the compute buffer, any thread), wait (step loop waiting for a layer to be entered).");
  Line(&out, "attic_kv_load_seconds_total", "phase=\"fetch\"", k.fetch_seconds);
  Line(&out, "attic_kv_load_seconds_total", "phase=\"enter\"", k.enter_seconds);
  Line(&out, "attic_kv_load_seconds_total", "phase=\"wait\"", k.wait_seconds);
  Header(&out, "attic_kv_entered_bytes_total", "counter",
         "Bytes of stored KV entered into the compute buffer (with the enter seconds above: the entering rate).");
  Line(&out, "attic_kv_entered_bytes_total", "", k.entered_bytes);
  // Sparse decoding (paper 004, PQCache): requests' selector statistics, added when they end.
  const pq::SparseDecodeStats sp = s.kv.Value<pq::SparseDecodeStats>();
  Header(&out, "attic_sparse_requests_total", "counter",
         "Finished requests that decoded with a sparse-attention selector, by method.");
  for (pq::SparseMethod m : pq::kSparseMethods) {
    if (m == pq::SparseMethod::kFull) continue;  // a request without a selector
    const char* method = pq::SparseMethodName(m);
    auto it = sp.requests.find(method);
    Line(&out, "attic_sparse_requests_total", std::string("method=\"") + method + "\"",
         it == sp.requests.end() ? uint64_t{0} : it->second);
  }
  Header(&out, "attic_sparse_decode_steps_total", "counter",
         "Decode steps of those requests that attended to a selection of the context.");
  Line(&out, "attic_sparse_decode_steps_total", "", sp.sparse_steps);
  Header(&out, "attic_sparse_full_decode_steps_total", "counter",
         "Decode steps of those requests that attended in full (context shorter than min_tokens).");
  Line(&out, "attic_sparse_full_decode_steps_total", "", sp.full_steps);
  Header(&out, "attic_sparse_attended_slots_total", "counter",
         "Context slots attended at sparse decode steps, per layer and KV head (over the next: the share attended).");
  Line(&out, "attic_sparse_attended_slots_total", "", sp.attended_slots);
  Header(&out, "attic_sparse_context_slots_total", "counter",
         "Context slots at sparse decode steps, per layer and KV head.");
  Line(&out, "attic_sparse_context_slots_total", "", sp.context_slots);
  Header(&out, "attic_sparse_select_seconds_total", "counter",
         "Time spent scoring slots and choosing the top ones (pq, oracle, h2o).");
  Line(&out, "attic_sparse_select_seconds_total", "", sp.select_seconds);
  Header(&out, "attic_pq_clustered_keys_total", "counter", "Keys product-quantized by k-means, per layer and KV head.");
  Line(&out, "attic_pq_clustered_keys_total", "", sp.clustered_keys);
  Header(&out, "attic_pq_cluster_seconds_total", "counter", "Time spent clustering keys (k-means).");
  Line(&out, "attic_pq_cluster_seconds_total", "", sp.cluster_seconds);
  Header(&out, "attic_pq_encoded_keys_total", "counter",
         "Keys coded by nearest centroid after leaving the local window, per layer and KV head.");
  Line(&out, "attic_pq_encoded_keys_total", "", sp.encoded_keys);
  Header(&out, "attic_pq_imported_indexes_total", "counter",
         "Requests whose PQ index came with the KV they reused (a stored conversation, a resident sequence): no clustering.");
  Line(&out, "attic_pq_imported_indexes_total", "", sp.imported_indexes);
  Header(&out, "attic_pq_imported_keys_total", "counter",
         "Coded keys those indexes held, per layer and KV head.");
  Line(&out, "attic_pq_imported_keys_total", "", sp.imported_keys);
  Header(&out, "attic_pq_rejected_indexes_total", "counter",
         "Saved PQ indexes found damaged or built with other m / bits (left out: the request clustered).");
  Line(&out, "attic_pq_rejected_indexes_total", "", sp.rejected_indexes);
  Header(&out, "attic_sparse_offload_requests_total", "counter",
         "Finished sparse requests whose KV was offloaded below the compute buffer.");
  Line(&out, "attic_sparse_offload_requests_total", "", sp.offloaded_requests);
  Header(&out, "attic_sparse_offload_blocks_total", "counter",
         "KV blocks such requests wrote to the offload tier and released from the compute buffer.");
  Line(&out, "attic_sparse_offload_blocks_total", "", sp.offloaded_blocks);
  Header(&out, "attic_sparse_offload_cache_hits_total", "counter",
         "Selected slots of offloaded blocks found in the block cache, per layer and KV head.");
  Line(&out, "attic_sparse_offload_cache_hits_total", "", sp.offload_cache_hits);
  Header(&out, "attic_sparse_offload_cache_misses_total", "counter",
         "Selected slots of offloaded blocks fetched from the offload tier, per layer and KV head.");
  Line(&out, "attic_sparse_offload_cache_misses_total", "", sp.offload_cache_misses);
  Header(&out, "attic_sparse_offload_fetched_bytes_total", "counter",
         "Bytes read from the offload tier (cache fills, single slots, whole-layer staging).");
  Line(&out, "attic_sparse_offload_fetched_bytes_total", "", sp.offload_fetched_bytes);
  Header(&out, "attic_sparse_offload_fetch_seconds_total", "counter",
         "Time spent reading the offload tier and applying RoPE to what it returned.");
  Line(&out, "attic_sparse_offload_fetch_seconds_total", "", sp.offload_fetch_seconds);
  Header(&out, "attic_sparse_offload_errors_total", "counter",
         "Offload tier failures: a block it refused (stayed resident) or a read that failed (slots left out).");
  Line(&out, "attic_sparse_offload_errors_total", "", sp.offload_errors);
  return out;
}

}  // namespace attic::server

namespace attic::server {

std::string RenderStoreMetrics(const store::StoreStats& s) {
  std::string out;
  auto counter = [&](const std::string& name, const char* help, auto v, const std::string& labels = "") {
    Header(&out, name, "counter", help);
    Line(&out, name, labels, v);
  };
  counter("attic_kv_store_lookups_total", "KV store lookups (one per admitted request).", s.lookups);
  Header(&out, "attic_kv_store_hits_total", "counter", "KV store lookups that found stored KV, by tier.");
  Line(&out, "attic_kv_store_hits_total", "tier=\"dram\"", s.hits_dram);
  Line(&out, "attic_kv_store_hits_total", "tier=\"ssd\"", s.hits_ssd);
  counter("attic_kv_store_misses_total", "KV store lookups that found nothing.", s.misses);
  counter("attic_kv_store_write_buffer_hits_total",
          "DRAM hits read from a save still in the write buffer (the session's next turn did not wait for it).",
          s.write_buffer_hits);
  counter("attic_kv_store_reused_tokens_total", "Prompt tokens whose KV came from the store.", s.reused_tokens);
  counter("attic_kv_store_saves_total", "Turns saved into the store.", s.saves);
  counter("attic_kv_store_async_saves_total", "Saves done by the store's writer thread.", s.async_saves);
  counter("attic_kv_store_save_waits_total", "Saves that waited for room in the write buffer.", s.save_waits);
  Header(&out, "attic_kv_store_pending_saves", "gauge", "Saves queued in the write buffer.");
  Line(&out, "attic_kv_store_pending_saves", "", s.pending_saves);
  Header(&out, "attic_kv_store_bytes_total", "counter", "Bytes moved by the store, by direction.");
  Line(&out, "attic_kv_store_bytes_total", "direction=\"save\"", s.bytes_saved);
  Line(&out, "attic_kv_store_bytes_total", "direction=\"load\"", s.bytes_loaded);
  Line(&out, "attic_kv_store_bytes_total", "direction=\"dram_to_ssd\"", s.bytes_dram_to_ssd);
  Line(&out, "attic_kv_store_bytes_total", "direction=\"ssd_to_dram\"", s.bytes_ssd_to_dram);
  Header(&out, "attic_kv_store_evictions_total", "counter",
         "Entries moved out of a tier (dram: demoted to SSD or dropped; ssd: dropped).");
  Line(&out, "attic_kv_store_evictions_total", "tier=\"dram\"", s.evictions_dram);
  Line(&out, "attic_kv_store_evictions_total", "tier=\"ssd\"", s.evictions_ssd);
  counter("attic_kv_store_prefetches_total", "Entries prefetched SSD -> DRAM for queued requests.", s.prefetches);
  counter("attic_kv_store_prefetches_useful_total",
          "Prefetched entries a request then found in DRAM (before they left it).", s.prefetches_useful);
  counter("attic_kv_store_saves_not_kept_total",
          "Saves the scheduler-aware policy did not keep (every queued job needs the stored entries sooner).",
          s.saves_not_kept);
  counter("attic_kv_store_save_wait_seconds_total", "Time saves waited for room in the write buffer.",
          s.save_wait_ms / 1000.0);
  counter("attic_kv_store_lookup_waits_total", "Lookups that waited for the tenant's queued saves.", s.lookup_waits);
  counter("attic_kv_store_lookup_wait_seconds_total", "Time lookups waited for the tenant's queued saves.",
          s.lookup_wait_ms / 1000.0);
  counter("attic_kv_store_expired_total", "Entries freed after their TTL.", s.expired);
  counter("attic_kv_store_corrupt_total", "Entries found corrupt, truncated or of another model (deleted).",
          s.corrupt);
  counter("attic_kv_store_other_type_misses_total",
          "Lookups that missed although an entry of another store type (--kv-store-dtype) matched: never served "
          "as the wrong type, the request recomputes.",
          s.other_type_misses);
  counter("attic_kv_store_corrupt_attachments_total",
          "Reads that found an entry's attachment (its PQ index) damaged: dropped, the KV served.", s.corrupt_attachments);
  counter("attic_kv_store_read_errors_total",
          "Tier reads that failed for now (a network error, a timeout): misses that kept their entry.", s.read_errors);
  counter("attic_kv_store_write_errors_total",
          "Tier writes that failed (a full or failing disk, a remote tier that does not answer): the store serves "
          "from the tiers that work.", s.write_errors);
  counter("attic_kv_store_vanished_total",
          "Entries gone from a shared or self-evicting tier (evicted by the cluster, deleted by another server).",
          s.vanished);
  counter("attic_kv_store_shared_found_total",
          "Entries another server saved, found by session in the shared remote tier.", s.shared_found);
  counter("attic_kv_store_shared_superseded_total",
          "Later turns another server saved of a session this server holds, found in the shared remote tier "
          "(the older turn dropped).",
          s.shared_superseded);
  counter("attic_kv_store_write_throughs_total", "Saves also written to the shared remote tier.", s.write_throughs);
  counter("attic_kv_store_write_through_errors_total",
          "Saves that could not be written to the shared remote tier (kept locally).", s.write_through_errors);
  counter("attic_kv_store_streamed_loads_total",
          "Entries read layer by layer from the shared remote tier while their turn computed.", s.streamed_loads);
  counter("attic_kv_store_stream_failures_total",
          "Streamed reads that broke off after their turn started (its request recomputed).", s.stream_failures);
  Header(&out, "attic_kv_store_tier_hits_total", "counter", "Lookups that found their entry in a tier, by tier.");
  for (const auto& t : s.tiers) Line(&out, "attic_kv_store_tier_hits_total", "tier=\"" + t.name + "\"", t.hits);
  Header(&out, "attic_kv_store_tier_bytes", "gauge",
         "Bytes per tier (the remote tier: what this server wrote and has not seen go, an estimate).");
  for (const auto& t : s.tiers) Line(&out, "attic_kv_store_tier_bytes", "tier=\"" + t.name + "\"", t.bytes);
  Header(&out, "attic_kv_store_entries", "gauge", "Entries in the store.");
  Line(&out, "attic_kv_store_entries", "", s.entries);
  Header(&out, "attic_kv_store_bytes", "gauge", "Bytes held per tier.");
  Line(&out, "attic_kv_store_bytes", "tier=\"dram\"", s.dram_bytes);
  Line(&out, "attic_kv_store_bytes", "tier=\"ssd\"", s.ssd_bytes);
  Header(&out, "attic_kv_store_capacity_bytes", "gauge", "Capacity per tier.");
  Line(&out, "attic_kv_store_capacity_bytes", "tier=\"dram\"", s.dram_capacity);
  Line(&out, "attic_kv_store_capacity_bytes", "tier=\"ssd\"", s.ssd_capacity);
  return out;
}

}  // namespace attic::server
