// `attic bench serve`: a load generator for a running `attic serve` (or any
// OpenAI-compatible server). For each concurrency level N, N clients each send
// --requests streaming completions back to back; the table and JSON report aggregate
// output tokens/s, summed per-stream decode tokens/s, and TTFT / TPOT p50 and p99.
// With --long-prompt T, once every stream of the first round has produced 16 chunks a
// T-token prompt is sent as well, and the report adds how long the streams' tokens were
// delayed while it was prefilled (continuous batching with chunked prefill should keep
// that to about one prefill chunk).
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "bench/client/openai_client.h"
#include "bench/common/format.h"
#include "bench/common/measure.h"
#include "bench/common/stats.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using bench::AuthHeaders;
using bench::Percentile;
using bench::ServedModelId;
using bench::StreamCompletion;
using bench::StreamedCompletion;

struct BenchServeFlags {
  std::string url = "http://127.0.0.1:8080";
  std::string api_key;
  std::string model;
  std::vector<int> concurrency{1, 2, 4, 8, 16};
  int requests = 2;  // per client per level
  int max_tokens = 128;
  int prompt_words = 32;
  bool chat = false;
  int long_prompt = 0;  // tokens of the interfering prompt (0 = none)
  double temperature = 0;  // of the streams (0 = greedy; >0 includes sampling's cost)
  double top_p = 1;
  std::string json_out;
};

struct Sample {
  bool ok = false;
  std::string error;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  double ttft = 0;      // seconds, send -> first content chunk
  double decode_s = 0;  // first -> last content chunk
  std::vector<Clock::time_point> chunk_times;  // arrival of each content chunk
};

// Shared by the streams of one level and the interfering long prompt.
struct Interference {
  int ready_after = 16;               // content chunks a stream must have produced
  std::atomic<int> streams_ready{0};  // streams with >= ready_after content chunks
  Clock::time_point sent{}, done{};
  double ttft_ms = 0;
  std::string error;
};

// A prompt of `words` pseudo-random common words, different per (level, client, request)
// so that no two requests share a reusable prefix.
std::string MakePrompt(int words, uint64_t seed) {
  static const char* kWords[] = {"the",  "cat",   "sat",  "on",    "a",     "mat",   "and",   "dog",
                                 "ran",  "far",   "away", "from",  "big",   "red",   "house", "near",
                                 "tree", "river", "sun",  "light", "green", "field", "small", "bird"};
  std::mt19937_64 rng(seed);
  std::string s = "Story " + std::to_string(seed) + ":";
  for (int i = 0; i < words; ++i) s += std::string(" ") + kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
  return s;
}

Sample RunOne(httplib::Client& cli, const BenchServeFlags& f, const std::string& prompt,
               Interference* watch = nullptr) {
  json body{{"model", f.model},      {"max_tokens", f.max_tokens}, {"temperature", f.temperature},
            {"top_p", f.top_p},       {"stream", true},             {"ignore_eos", true},
            {"stream_options", {{"include_usage", true}}}};
  if (f.chat) body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
  else body["prompt"] = prompt;
  Sample s;
  StreamedCompletion c =
      StreamCompletion(cli, f.chat ? "/v1/chat/completions" : "/v1/completions", f.api_key, body, [&](const std::string&) {
        s.chunk_times.push_back(Clock::now());
        if (watch != nullptr && static_cast<int>(s.chunk_times.size()) == watch->ready_after)
          watch->streams_ready.fetch_add(1);
      });
  s.ok = c.ok;
  s.error = c.error;
  s.prompt_tokens = c.prompt_tokens;
  s.completion_tokens = c.completion_tokens;
  if (!s.ok) return s;
  s.ttft = std::chrono::duration<double>(c.first - c.sent).count();
  s.decode_s = std::chrono::duration<double>(c.last - c.first).count();
  return s;
}

// Sends one prompt of --long-prompt random token ids (non-streaming, one output token)
// and records when it was sent and answered.
void SendLongPrompt(const BenchServeFlags& f, uint64_t seed, Interference* in) {
  const json ids = bench::RandomTokens(f.long_prompt, seed, 10, 500);  // a new prompt each time: nothing to reuse
  json body{{"model", f.model}, {"prompt", ids}, {"max_tokens", 1}, {"temperature", 0}};
  httplib::Client cli(f.url);
  cli.set_read_timeout(600, 0);
  in->sent = Clock::now();
  auto res = cli.Post("/v1/completions", AuthHeaders(f.api_key), body.dump(), "application/json");
  in->done = Clock::now();
  in->ttft_ms = std::chrono::duration<double, std::milli>(in->done - in->sent).count();
  if (!res) in->error = "connection error: " + httplib::to_string(res.error());
  else if (res->status != 200) in->error = "HTTP " + std::to_string(res->status) + ": " + res->body;
}

int RunBenchServe(BenchServeFlags f) {
  if (Status st = PrepareOutput(f.json_out, "--json"); !st.ok()) return Fail(st);
  {
    auto id = ServedModelId(f.url, f.api_key);
    if (!id.ok()) return Fail(id.status());
    if (f.model.empty()) f.model = *id;
    // Warm-up: first-use costs are not throughput.
    httplib::Client warm(f.url);
    warm.set_read_timeout(600, 0);
    Sample w = RunOne(warm, f, MakePrompt(f.prompt_words, 1));
    if (!w.ok) return Fail(InternalError("warm-up request failed: " + w.error));
  }
  json levels = json::array();
  std::fputs(bench::TableHeader({"streams", "requests", "output tok/s", "decode tok/s (sum of streams)", "TTFT p50 ms",
                                  "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "errors"})
                 .c_str(),
             stdout);
  std::fflush(stdout);
  for (int n : f.concurrency) {
    if (n <= 0) continue;
    std::vector<Sample> samples;
    std::vector<Sample> first_round(n);
    std::mutex mu;
    Interference interference;
    interference.ready_after = std::max(1, std::min(16, f.max_tokens / 4));
    Clock::time_point t0 = Clock::now();
    std::vector<std::thread> clients;
    for (int c = 0; c < n; ++c) {
      clients.emplace_back([&, c] {
        httplib::Client cli(f.url);
        cli.set_read_timeout(600, 0);
        cli.set_keep_alive(true);
        for (int r = 0; r < f.requests; ++r) {
          uint64_t seed = 1000000ull * n + 1000ull * c + r + 7;
          Sample s = RunOne(cli, f, MakePrompt(f.prompt_words, seed), r == 0 ? &interference : nullptr);
          std::lock_guard<std::mutex> lock(mu);
          if (r == 0) first_round[c] = s;
          samples.push_back(std::move(s));
        }
      });
    }
    std::thread interferer;
    if (f.long_prompt > 0) {
      interferer = std::thread([&] {
        while (interference.streams_ready.load() < n) {
          if (std::chrono::duration<double>(Clock::now() - t0).count() > 600) return;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        SendLongPrompt(f, 99 + n, &interference);
      });
    }
    for (auto& t : clients) t.join();
    if (interferer.joinable()) interferer.join();
    double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<double> ttft, tpot;
    double tokens = 0, decode_rate_sum = 0;
    int errors = 0, prompt_tokens = 0;
    std::string first_error;
    for (const auto& s : samples) {
      if (!s.ok) {
        if (first_error.empty()) first_error = s.error;
        ++errors;
        continue;
      }
      tokens += s.completion_tokens;
      prompt_tokens = s.prompt_tokens;
      ttft.push_back(s.ttft);
      if (s.completion_tokens > 1 && s.decode_s > 0) {
        double per_token = s.decode_s / (s.completion_tokens - 1);
        tpot.push_back(per_token);
        decode_rate_sum += 1.0 / per_token;
      }
    }
    double decode_tps = tpot.empty() ? 0 : decode_rate_sum / tpot.size() * n;
    json level{{"streams", n},
               {"requests", samples.size()},
               {"errors", errors},
               {"prompt_tokens", prompt_tokens},
               {"max_tokens", f.max_tokens},
               {"wall_s", wall},
               {"output_tokens", tokens},
               {"output_tokens_per_s", tokens / wall},
               {"decode_tokens_per_s", decode_tps},
               {"ttft_ms_p50", Percentile(ttft, 50) * 1e3},
               {"ttft_ms_p99", Percentile(ttft, 99) * 1e3},
               {"tpot_ms_p50", Percentile(tpot, 50) * 1e3},
               {"tpot_ms_p99", Percentile(tpot, 99) * 1e3}};
    if (!first_error.empty()) level["first_error"] = first_error;
    std::string interference_note;
    if (f.long_prompt > 0) {
      // Gaps between consecutive chunks of the first-round streams, before the long
      // prompt was sent and while it was being prefilled.
      std::vector<double> before, during;
      for (const auto& s : first_round) {
        for (size_t k = 1; k < s.chunk_times.size(); ++k) {
          double gap = std::chrono::duration<double, std::milli>(s.chunk_times[k] - s.chunk_times[k - 1]).count();
          if (s.chunk_times[k] <= interference.sent) before.push_back(gap);
          else if (s.chunk_times[k - 1] < interference.done) during.push_back(gap);
        }
      }
      json li{{"prompt_tokens", f.long_prompt},
              {"ttft_ms", interference.ttft_ms},
              {"stream_gap_ms_p50_before", Percentile(before, 50)},
              {"stream_gap_ms_max_during", during.empty() ? 0.0 : *std::max_element(during.begin(), during.end())},
              {"stream_gaps_during", during.size()}};
      if (!interference.error.empty()) li["error"] = interference.error;
      level["long_prompt"] = li;
      char buf[200];
      std::snprintf(buf, sizeof(buf), "  (a %d-token prompt took %.0f ms; stream gaps: p50 %.1f ms before, max %.1f ms during)",
                    f.long_prompt, interference.ttft_ms, li["stream_gap_ms_p50_before"].get<double>(),
                    li["stream_gap_ms_max_during"].get<double>());
      interference_note = buf;
    }
    std::printf("| %d | %zu | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %d |\n", n, samples.size(), tokens / wall,
                decode_tps, level["ttft_ms_p50"].get<double>(), level["ttft_ms_p99"].get<double>(),
                level["tpot_ms_p50"].get<double>(), level["tpot_ms_p99"].get<double>(), errors);
    if (!interference_note.empty()) std::fprintf(stderr, "attic: %d streams%s\n", n, interference_note.c_str());
    std::fflush(stdout);
    if (!first_error.empty()) std::fprintf(stderr, "attic: first error at %d streams: %s\n", n, first_error.c_str());
    levels.push_back(level);
  }
  json out{{"url", f.url},           {"model", f.model},       {"endpoint", f.chat ? "chat" : "completions"},
           {"max_tokens", f.max_tokens}, {"prompt_words", f.prompt_words}, {"requests_per_client", f.requests},
           {"levels", levels}};
  if (levels.size() > 1 && levels[0]["streams"] == 1 && levels[0]["output_tokens_per_s"].get<double>() > 0) {
    double base = levels[0]["output_tokens_per_s"].get<double>();
    json speedup = json::object();
    for (const auto& l : levels) {
      speedup[std::to_string(l["streams"].get<int>())] = l["output_tokens_per_s"].get<double>() / base;
    }
    out["output_speedup_vs_1"] = speedup;
  }
  std::string js = out.dump(2);
  std::printf("%s\n", js.c_str());
  Status st = WriteOutput(f.json_out, js + "\n", "--json");
  if (!st.ok()) return Fail(st);
  return kExitOk;
}

}  // namespace

void AddBenchServeCommand(CLI::App& app, RunFn* run) {
  CLI::App* bench = app.get_subcommand("bench");
  auto* cmd = bench->add_subcommand("serve", "load-test a running server: N concurrent streaming clients");
  auto f = std::make_shared<BenchServeFlags>();
  cmd->add_option("--url", f->url, "server base URL")->capture_default_str();
  cmd->add_option("--api-key", f->api_key, "API key (Authorization: Bearer)");
  cmd->add_option("--model", f->model, "model id (default: the first from /v1/models)");
  // Long name only: -c is the context window in every other command.
  cmd->add_option("--concurrency", f->concurrency, "concurrent streams per level (e.g. --concurrency 1 2 4 8)")
      ->capture_default_str();
  cmd->add_option_function<std::vector<int>>(
         "-c",
         [](const std::vector<int>&) {
           throw CLI::ValidationError("-c", "is the context window in attic; bench serve's streams are --concurrency");
         },
         "")
      ->group("");
  cmd->add_option("-r,--requests", f->requests, "requests per client per level")->capture_default_str();
  cmd->add_option("-n,--max-tokens", f->max_tokens, "tokens generated per request (EOS ignored)")
      ->capture_default_str();
  cmd->add_option("--prompt-words", f->prompt_words, "words in each prompt")->capture_default_str();
  cmd->add_flag("--chat", f->chat, "use /v1/chat/completions instead of /v1/completions");
  cmd->add_option("--long-prompt", f->long_prompt,
                  "also send one prompt of this many tokens mid-run and report the streams' delay (0 = off)")
      ->capture_default_str();
  cmd->add_option("--temperature", f->temperature, "sampling temperature of the streams (0 = greedy)")
      ->capture_default_str();
  cmd->add_option("--top-p", f->top_p, "nucleus sampling of the streams")->capture_default_str();
  cmd->add_option("--json", f->json_out, "also write the JSON to this file");
  cmd->callback([run, f] { *run = [f] { return RunBenchServe(*f); }; });
}

}  // namespace attic::cli
