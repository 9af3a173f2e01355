#include "bench/sessions/replay.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <tuple>

#include "bench/client/openai_client.h"

namespace attic::bench::sessions {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

TurnResult SendTurn(httplib::Client& cli, const std::string& model, const std::string& api_key, const json& messages,
                    const std::string& session_id, int max_tokens, bool ignore_eos, Clock::time_point run_start) {
  TurnResult r;
  json body{{"model", model},
            {"messages", messages},
            {"session_id", session_id},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}}};
  if (ignore_eos) body["ignore_eos"] = true;
  StreamedCompletion c = StreamCompletion(cli, "/v1/chat/completions", api_key, body);
  r.sent_s = std::chrono::duration<double>(c.sent - run_start).count();
  r.total_s = std::chrono::duration<double>(Clock::now() - c.sent).count();
  r.error = c.error;
  r.prompt_tokens = c.prompt_tokens;
  r.completion_tokens = c.completion_tokens;
  r.cached_tokens = c.cached_tokens;
  r.answer = std::move(c.text);
  if (!c.ok) return r;
  r.ok = true;
  r.ttft_s = std::chrono::duration<double>(c.first - c.sent).count();
  return r;
}

// First-use costs are not the workload: one short request; with the store on its
// stored session is deleted again.
Status WarmUp(const std::string& mode, const std::string& url, const std::string& model, const ReplayOptions& o,
              const std::string& sid) {
  httplib::Client cli(url);
  cli.set_read_timeout(600, 0);
  TurnResult w = SendTurn(cli, model, o.api_key, json::array({{{"role", "user"}, {"content", "Hello there."}}}), sid, 8,
                          o.ignore_eos, Clock::now());
  if (!w.ok) return InternalError(mode + " warm-up request failed (" + url + "): " + w.error);
  if (o.store) {
    // The turn is saved when it retires, maybe just after the reply: wait for it (2 s
    // at most) so that the delete finds it.
    for (int i = 0; i < 40; ++i) {
      auto g = cli.Get("/v1/sessions/" + sid, AuthHeaders(o.api_key));
      if (g && g->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    cli.Delete("/v1/sessions/" + sid, AuthHeaders(o.api_key));
  }
  return OkStatus();
}

}  // namespace

StatusOr<RunResult> Replay(const std::string& mode, const std::string& url, const std::vector<SessionSpec>& work,
                           const ReplayOptions& o) {
  const std::vector<std::string> servers = o.instance_urls.empty() ? std::vector<std::string>{url} : o.instance_urls;
  std::string model_id;
  for (size_t i = 0; i < servers.size(); ++i) {
    auto model = ServedModelId(servers[i], o.api_key);
    if (!model.ok()) return model.status();
    model_id = *model;
    if (Status st = WarmUp(mode, servers[i], *model, o, "warmup-" + o.nonce + "-" + std::to_string(i)); !st.ok())
      return st;
  }
  RunResult out;
  out.mode = mode;
  out.url = url;
  std::vector<MetricValues> before;
  for (const auto& u : servers) before.push_back(ScrapeMetrics(u));
  const double cpu0 = o.server_cpu_seconds ? o.server_cpu_seconds() : -1;
  int total_turns = 0;
  for (const auto& s : work) total_turns += static_cast<int>(s.turns.size());
  std::mutex mu;
  std::atomic<int> done{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (const auto& s : work) {
    threads.emplace_back([&, s] {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(s.arrival_s)));
      httplib::Client cli(url);
      cli.set_read_timeout(900, 0);
      cli.set_keep_alive(true);
      const std::string sid = "bench-" + o.nonce + "-s" + std::to_string(s.index);
      cli.set_default_headers({{"X-Session-Id", sid}});
      json messages = json::array();
      int prev_prompt = 0, prev_completion = 0;
      for (size_t k = 0; k < s.turns.size(); ++k) {
        const TurnSpec& t = s.turns[k];
        messages.push_back({{"role", "user"}, {"content", t.user}});
        TurnResult r = SendTurn(cli, model_id, o.api_key, messages, sid, t.answer_tokens, o.ignore_eos, start);
        r.session = s.index;
        r.turn = static_cast<int>(k);
        if (r.ok && k > 0) r.history_tokens = std::min(r.prompt_tokens, prev_prompt + prev_completion);
        const int n = done.fetch_add(1) + 1;
        if (!o.quiet) {
          std::lock_guard<std::mutex> lock(mu);
          if (r.ok) {
            std::fprintf(stderr, "attic: %s %3d/%d  session %2d turn %zu: prompt %5d (history %5d, cached %5d)  TTFT %7.1f ms\n",
                         mode.c_str(), n, total_turns, s.index, k + 1, r.prompt_tokens, r.history_tokens,
                         r.cached_tokens, r.ttft_s * 1e3);
          } else {
            std::fprintf(stderr, "attic: %s %3d/%d  session %2d turn %zu: error: %s\n", mode.c_str(), n, total_turns,
                         s.index, k + 1, r.error.c_str());
          }
        }
        const bool ok = r.ok;
        messages.push_back({{"role", "assistant"}, {"content", r.answer}});
        prev_prompt = r.prompt_tokens;
        prev_completion = r.completion_tokens;
        r.answer.clear();
        r.answer.shrink_to_fit();
        {
          std::lock_guard<std::mutex> lock(mu);
          out.turns.push_back(std::move(r));
        }
        if (!ok) {  // the conversation cannot go on faithfully
          done.fetch_add(static_cast<int>(s.turns.size() - k - 1));
          break;
        }
        if (k + 1 < s.turns.size()) std::this_thread::sleep_for(std::chrono::duration<double>(t.think_s));
      }
    });
  }
  for (auto& t : threads) t.join();
  out.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (o.server_cpu_seconds && cpu0 >= 0) out.cpu_s = o.server_cpu_seconds() - cpu0;
  for (size_t i = 0; i < servers.size(); ++i) {
    MetricValues d = MetricsDelta(before[i], ScrapeMetrics(servers[i]));
    for (const auto& [k, v] : d) out.metrics_delta[k] += v;
    if (!o.instance_urls.empty()) out.instance_deltas.push_back(std::move(d));
  }
  std::sort(out.turns.begin(), out.turns.end(), [](const TurnResult& a, const TurnResult& b) {
    return std::tie(a.session, a.turn) < std::tie(b.session, b.turn);
  });
  return out;
}

}  // namespace attic::bench::sessions
