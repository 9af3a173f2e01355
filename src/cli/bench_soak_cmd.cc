// `attic bench soak`: a stability run. It starts `attic serve` with the KV store on
// (DRAM + SSD tiers) and, for --minutes, keeps --streams concurrent multi-turn chat
// streams going against it, with:
//   - sessions: every conversation has a session id; some have a short session_ttl
//     (--short-ttl) so that stored sessions expire while the run goes on;
//   - sparse requests: every --sparse-every-th request decodes with PQ sparse attention
//     over a context longer than its min_tokens;
//   - client disconnects: every --disconnect-every-th request is cut by the client after
//     its first pieces (the conversation then starts again);
//   - context caches: one more client creates a cache, links it in a chat and deletes it,
//     over and over (every fourth one is left to expire instead).
// Every --sample-s it samples the server's memory (/proc/PID/status: VmRSS, RssAnon,
// RssFile, Threads) and its /metrics (the tiers' bytes, the memory budget). It prints a
// table per minute (requests, errors, disconnects, TTFT and latency percentiles, RSS,
// tier bytes, threads) and a JSON summary (last stdout line; --json FILE adds every
// sample), and --plot FILE.svg draws RSS, anonymous memory and the DRAM tier over time
// against the server's budget (docs/fuzzing.md, "Soak").
//
// The run passes (exit 0) when no request failed, the server stayed up, a normal request
// succeeds at the end, and RSS grew less than --max-growth over the second half (the
// mean of the last minute against the mean of the minute after half-way).
//
//   build/attic bench soak --minutes 30 --json out/soak/soak.json --plot out/soak/rss.svg
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "attic/core/byte_size.h"
#include "bench/client/openai_client.h"
#include "bench/sessions/server_process.h"
#include "bench/soak/soak_report.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using bench::soak::MemorySample;
using bench::soak::RequestEvent;

struct SoakFlags {
  std::string model;  // "" = the default model
  double minutes = 30;
  int streams = 16;
  int turns = 4;
  int max_tokens = 24;
  int threads = 2;
  uint64_t kv_dram = 64ull << 20;
  uint64_t kv_ssd = 256ull << 20;
  double session_ttl = 600;  // the server's default for sessions
  int short_ttl = 5;         // seconds; every third conversation asks for it
  int sparse_every = 5;
  int disconnect_every = 9;
  double sample_s = 2;
  double max_growth = 0.02;
  std::string serve_args;
  std::string ssd_parent;
  std::string json_out, plot_out, log_out;
};

const char* kWords[] = {"the",  "cat",   "sat",  "on",    "a",     "mat",   "and",   "dog",   "ran",  "far",
                        "away", "from",  "big",  "red",   "house", "near",  "tree",  "river", "sun",  "light",
                        "girl", "named", "Lily", "loved", "play",  "park",  "ball",  "happy", "day",  "friend"};

std::string Words(std::mt19937_64& rng, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += ' ';
    s += kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
  }
  return s;
}

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// One streamed chat request; `cut_after` > 0 closes the connection after that many
// content pieces (a client that goes away mid-stream).
struct StreamResult {
  bool ok = false, cut = false;
  std::string error, text;
  double ttft_ms = -1, latency_ms = 0;
};

// One streamed chat turn (bench/client's StreamCompletion), closed by the client after
// cut_after pieces when cut_after > 0.
StreamResult StreamChat(httplib::Client& cli, const json& body, int cut_after) {
  const bench::StreamedCompletion c =
      bench::StreamCompletion(cli, "/v1/chat/completions", /*api_key=*/"", body, nullptr, cut_after);
  StreamResult r;
  r.ok = c.ok;
  r.cut = c.cut;
  r.error = c.error;
  r.text = c.text;
  r.latency_ms = Seconds(c.sent, Clock::now()) * 1e3;
  if (c.first != Clock::time_point{}) r.ttft_ms = Seconds(c.sent, c.first) * 1e3;
  return r;
}

struct Shared {
  const SoakFlags* f = nullptr;
  std::string url, model;
  Clock::time_point t0, deadline;
  std::mutex mu;
  std::vector<RequestEvent> events;  // guarded by mu
  std::atomic<uint64_t> request_count{0};

  void Record(RequestEvent e) {
    e.t_s = Seconds(t0, Clock::now());
    std::lock_guard<std::mutex> lock(mu);
    if (!e.ok && e.error.size() > 300) e.error.resize(300);
    events.push_back(std::move(e));
  }
};

// A chat client: conversations of f.turns turns, each turn streamed.
void ChatClient(Shared* sh, int id) {
  const SoakFlags& f = *sh->f;
  std::mt19937_64 rng(1000 + id);
  httplib::Client cli(sh->url);
  cli.set_read_timeout(300, 0);
  cli.set_tcp_nodelay(true);
  for (int conv = 0; Clock::now() < sh->deadline; ++conv) {
    json messages = json::array();
    const std::string session = "soak-" + std::to_string(id) + "-" + std::to_string(conv);
    const bool short_ttl = conv % 3 == 2;
    for (int turn = 0; turn < f.turns && Clock::now() < sh->deadline; ++turn) {
      const uint64_t n = sh->request_count.fetch_add(1) + 1;
      const bool sparse = f.sparse_every > 0 && n % f.sparse_every == 0;
      const bool cut = !sparse && f.disconnect_every > 0 && n % f.disconnect_every == 0;
      // A sparse turn carries a longer message, so that its context passes min_tokens (a
      // conversation stays inside stories260K's 512-token window).
      messages.push_back({{"role", "user"}, {"content", Words(rng, sparse ? 40 : 8 + static_cast<int>(rng() % 12))}});
      json body{{"model", sh->model},  {"messages", messages}, {"max_tokens", f.max_tokens}, {"stream", true},
                {"temperature", 0.8},  {"seed", static_cast<int>(rng() % 100000)},
                {"ignore_eos", true},  {"session_id", session}};
      if (short_ttl) body["session_ttl"] = f.short_ttl;
      if (sparse) body["sparse"] = {{"method", "pq"}, {"ratio", 0.3}, {"min_tokens", 64}};
      StreamResult r = StreamChat(cli, body, cut ? 2 : 0);
      RequestEvent e;
      e.kind = cut ? "disconnect" : sparse ? "sparse" : "chat";
      e.ok = r.ok;
      e.ttft_ms = r.ttft_ms;
      e.latency_ms = r.latency_ms;
      e.error = r.error;
      sh->Record(e);
      if (!r.ok || cut) break;  // a new conversation
      messages.push_back({{"role", "assistant"}, {"content", r.text}});
    }
  }
}

// Context caches created, linked in a chat and deleted; every fourth is left to expire.
void CacheClient(Shared* sh) {
  std::mt19937_64 rng(7);
  httplib::Client cli(sh->url);
  cli.set_read_timeout(300, 0);
  auto op = [&](const std::string& what, const Clock::time_point sent, const httplib::Result& res) {
    RequestEvent e;
    e.kind = "cache";
    e.latency_ms = Seconds(sent, Clock::now()) * 1e3;
    e.ok = res && res->status == 200;
    if (!e.ok) e.error = what + ": " + (res ? "HTTP " + std::to_string(res->status) + ": " + res->body : "connection error");
    sh->Record(e);
    return e.ok;
  };
  for (int i = 0; Clock::now() < sh->deadline; ++i) {
    const bool expire = i % 4 == 3;
    json create{{"model", sh->model},
                {"documents", {"Document " + std::to_string(i) + ". " + Words(rng, 60), Words(rng, 40)}},
                {"ttl", expire ? 5 : 3600}};
    auto t = Clock::now();
    auto res = cli.Post("/v1/context_caches", create.dump(), "application/json");
    if (!op("create", t, res)) continue;
    const std::string id = json::parse(res->body).value("id", "");
    json chat{{"model", sh->model},
              {"max_tokens", 8},
              {"messages",
               {{{"role", "user"},
                 {"content", {{{"type", "context_cache"}, {"id", id}}, {{"type", "text"}, {"text", "What happened?"}}}}}}}};
    t = Clock::now();
    res = cli.Post("/v1/chat/completions", chat.dump(), "application/json");
    if (!op("link", t, res) || expire) continue;
    t = Clock::now();
    res = cli.Delete("/v1/context_caches/" + id);
    op("delete", t, res);
  }
}

// The value of the first metric line that starts with `prefix` (name and labels), or 0.
double MetricValue(const std::string& text, const std::string& prefix) {
  size_t at = 0;
  while ((at = text.find(prefix, at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') {
      const size_t sp = text.find(' ', at + prefix.size());
      if (sp != std::string::npos && (at + prefix.size() == sp || text[at + prefix.size()] == ' '))
        return std::strtod(text.c_str() + sp + 1, nullptr);
    }
    at += prefix.size();
  }
  return 0;
}

MemorySample Sample(pid_t pid, httplib::Client& metrics, double t_s) {
  MemorySample s;
  s.t_s = t_s;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  auto kib = [](const std::string& l) { return std::strtoull(l.c_str() + l.find(':') + 1, nullptr, 10) * 1024; };
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_bytes = kib(line);
    else if (line.rfind("RssAnon:", 0) == 0) s.rss_anon_bytes = kib(line);
    else if (line.rfind("RssFile:", 0) == 0) s.rss_file_bytes = kib(line);
    else if (line.rfind("Threads:", 0) == 0) s.threads = std::atoi(line.c_str() + 8);
  }
  if (auto res = metrics.Get("/metrics"); res && res->status == 200) {
    s.dram_tier_bytes = static_cast<uint64_t>(MetricValue(res->body, "attic_kv_store_bytes{tier=\"dram\"}"));
    s.ssd_tier_bytes = static_cast<uint64_t>(MetricValue(res->body, "attic_kv_store_bytes{tier=\"ssd\"}"));
    s.budget_bytes = static_cast<uint64_t>(MetricValue(res->body, "attic_memory_budget_bytes"));
  }
  return s;
}

int RunSoak(const SoakFlags& f) {
  if (f.minutes <= 0 || f.streams < 1 || f.turns < 1 || f.max_tokens < 1 || f.sample_s <= 0)
    return UsageError("--minutes, --streams, --turns, --max-tokens and --sample-s must be positive");
  if (Status st = PrepareOutput(f.json_out, "--json"); !st.ok()) return Fail(st);
  if (Status st = PrepareOutput(f.plot_out, "--plot"); !st.ok()) return Fail(st);
  const std::string model = f.model.empty() ? DefaultModelPath() : f.model;
  std::error_code ec;
  const std::string parent = f.ssd_parent.empty() ? std::filesystem::temp_directory_path().string() : f.ssd_parent;
  const std::string tmp = parent + "/attic-soak-" + std::to_string(getpid());
  std::filesystem::create_directories(tmp + "/ssd", ec);
  if (ec) return Fail(InternalError("cannot create " + tmp + ": " + ec.message()));
  bench::sessions::StopServersOnSignal(tmp);
  std::vector<std::string> args{"-m", model, "-t", std::to_string(f.threads), "--host", "127.0.0.1", "--port", "0",
                                "--chat-template", "chatml", "--kv-dram", FormatByteSize(f.kv_dram), "--kv-ssd-dir",
                                tmp + "/ssd", "--kv-ssd", FormatByteSize(f.kv_ssd), "--session-ttl",
                                std::to_string(f.session_ttl)};
  std::istringstream extra(f.serve_args);
  for (std::string w; extra >> w;) args.push_back(w);
  const std::string log = f.log_out.empty() ? tmp + "/serve.log" : f.log_out;
  bench::sessions::ServerProcess server;
  if (Status st = server.Start("soak", args, log); !st.ok()) return Fail(st);
  const pid_t pid = server.pid();
  auto id = bench::ServedModelId(server.url(), "");
  if (!id.ok()) return Fail(id.status());

  Shared sh;
  sh.f = &f;
  sh.url = server.url();
  sh.model = *id;
  sh.t0 = Clock::now();
  sh.deadline = sh.t0 + std::chrono::milliseconds(static_cast<int64_t>(f.minutes * 60e3));
  std::vector<MemorySample> samples;  // written by the sampler; read after it is joined
  std::atomic<uint64_t> last_rss{0};
  std::thread sampler([&] {
    httplib::Client metrics(sh.url);
    metrics.set_read_timeout(30, 0);
    for (int i = 0;; ++i) {
      const auto at = sh.t0 + std::chrono::milliseconds(static_cast<int64_t>(i * f.sample_s * 1e3));
      if (at > sh.deadline) break;
      std::this_thread::sleep_until(at);
      samples.push_back(Sample(pid, metrics, Seconds(sh.t0, Clock::now())));
      last_rss.store(samples.back().rss_bytes);
    }
  });
  std::vector<std::thread> clients;
  for (int i = 0; i < f.streams; ++i) clients.emplace_back(ChatClient, &sh, i);
  clients.emplace_back(CacheClient, &sh);
  // Progress, once a minute, on stderr.
  for (int m = 1; Clock::now() < sh.deadline; ++m) {
    std::this_thread::sleep_until(std::min(sh.deadline, sh.t0 + std::chrono::minutes(m)));
    size_t n, errors = 0;
    {
      std::lock_guard<std::mutex> lock(sh.mu);
      n = sh.events.size();
      for (const auto& e : sh.events) errors += e.ok ? 0 : 1;
    }
    std::fprintf(stderr, "attic: soak %.1f min: %zu requests, %zu errors, RSS %.0f MiB\n",
                 Seconds(sh.t0, Clock::now()) / 60, n, errors,
                 static_cast<double>(last_rss.load()) / (1 << 20));
  }
  for (auto& t : clients) t.join();
  sampler.join();
  const double duration_s = Seconds(sh.t0, sh.deadline);

  // Still serving: a normal request after the run.
  httplib::Client after(sh.url);
  after.set_read_timeout(120, 0);
  json normal{{"model", sh.model}, {"messages", {{{"role", "user"}, {"content", "Hello"}}}}, {"max_tokens", 4}};
  auto res = after.Post("/v1/chat/completions", normal.dump(), "application/json");
  const bool normal_after = res && res->status == 200;
  const bool alive = kill(pid, 0) == 0;
  server.Stop();
  std::filesystem::remove_all(tmp, ec);

  const auto rows = bench::soak::PerMinute(sh.events, samples, duration_s);
  const double growth = bench::soak::SecondHalfGrowth(samples, duration_s, 60);
  uint64_t peak = 0, budget = 0;
  for (const auto& s : samples) peak = std::max(peak, s.rss_bytes), budget = std::max(budget, s.budget_bytes);
  size_t errors = 0;
  json first_errors = json::array();
  for (const auto& e : sh.events)
    if (!e.ok && errors++ < 10) first_errors.push_back({{"t_s", e.t_s}, {"kind", e.kind}, {"error", e.error}});
  std::fputs(bench::soak::MinuteTable(rows).c_str(), stdout);
  const bool inside_budget = budget == 0 || peak <= budget;
  const bool pass = errors == 0 && alive && normal_after && growth < f.max_growth;
  std::printf("requests %zu in %.1f min; errors %zu; peak RSS %.1f MiB; budget %s; RSS growth over the second half "
              "%+.2f%%; server alive %s; normal request after %s\n",
              sh.events.size(), duration_s / 60, errors, static_cast<double>(peak) / (1 << 20),
              budget == 0 ? "not reported" : (FormatByteSize(budget) + (inside_budget ? " (inside)" : " (EXCEEDED)")).c_str(),
              growth * 100, alive ? "yes" : "no", normal_after ? "yes" : "no");
  json minutes = json::array();
  for (const auto& r : rows)
    minutes.push_back({{"minute", r.minute + 1}, {"requests", r.requests}, {"errors", r.errors},
                       {"disconnects", r.disconnects}, {"cache_ops", r.cache_ops}, {"sparse", r.sparse},
                       {"ttft_ms_p50", r.ttft_ms_p50}, {"ttft_ms_p99", r.ttft_ms_p99},
                       {"latency_ms_p50", r.latency_ms_p50}, {"latency_ms_p99", r.latency_ms_p99},
                       {"rss_mib_mean", r.rss_mib_mean}, {"rss_mib_max", r.rss_mib_max},
                       {"anon_mib_mean", r.anon_mib_mean}, {"dram_tier_mib", r.dram_tier_mib},
                       {"ssd_tier_mib", r.ssd_tier_mib}, {"threads", r.threads}});
  json summary{{"model", model},
               {"minutes", f.minutes},
               {"streams", f.streams},
               {"turns", f.turns},
               {"max_tokens", f.max_tokens},
               {"kv_dram_bytes", f.kv_dram},
               {"kv_ssd_bytes", f.kv_ssd},
               {"serve_args", args},
               {"requests", sh.events.size()},
               {"errors", errors},
               {"first_errors", first_errors},
               {"peak_rss_bytes", peak},
               {"budget_bytes", budget == 0 ? json(nullptr) : json(budget)},
               {"inside_budget", budget == 0 ? json(nullptr) : json(inside_budget)},
               {"rss_growth_second_half", growth},
               {"server_alive", alive},
               {"normal_request_after", normal_after},
               {"pass", pass},
               {"per_minute", minutes}};
  if (!f.json_out.empty()) {
    json full = summary;
    json js = json::array();
    for (const auto& s : samples)
      js.push_back({{"t_s", s.t_s}, {"rss", s.rss_bytes}, {"anon", s.rss_anon_bytes}, {"file", s.rss_file_bytes},
                    {"threads", s.threads}, {"dram_tier", s.dram_tier_bytes}, {"ssd_tier", s.ssd_tier_bytes}});
    full["samples"] = js;
    if (Status st = WriteOutput(f.json_out, full.dump(1) + "\n", "--json"); !st.ok()) return Fail(st);
  }
  if (!f.plot_out.empty()) {
    std::vector<double> x;
    std::vector<std::vector<double>> y(3);
    for (const auto& s : samples) {
      x.push_back(s.t_s / 60);
      y[0].push_back(static_cast<double>(s.rss_bytes) / (1 << 20));
      y[1].push_back(static_cast<double>(s.rss_anon_bytes) / (1 << 20));
      y[2].push_back(static_cast<double>(s.dram_tier_bytes) / (1 << 20));
    }
    const std::string title = "attic bench soak: server memory, " + std::to_string(f.streams) + " streams";
    Status st = WriteOutput(f.plot_out,
                            bench::soak::RssPlotSvg(x, {"RSS", "anonymous", "DRAM tier (stored)"}, y,
                                                    static_cast<double>(budget) / (1 << 20), title),
                            "--plot");
    if (!st.ok()) return Fail(st);
  }
  std::printf("%s\n", summary.dump().c_str());
  return pass ? kExitOk : kExitError;
}

}  // namespace

void AddBenchSoakCommand(CLI::App& app, RunFn* run) {
  CLI::App* bench = app.get_subcommand("bench");
  auto* cmd = bench->add_subcommand("soak", "stability run: concurrent chat streams, caches, sparse, disconnects and "
                                            "expiring sessions against a started server; RSS per minute");
  auto f = std::make_shared<SoakFlags>();
  cmd->add_option("-m,--model", f->model, "model (default: the default model)");
  cmd->add_option("--minutes", f->minutes, "how long the load runs")->capture_default_str();
  cmd->add_option("--streams", f->streams, "concurrent chat streams")->capture_default_str();
  cmd->add_option("--turns", f->turns, "turns of each conversation")->capture_default_str();
  cmd->add_option("-n,--max-tokens", f->max_tokens, "tokens generated per turn (EOS ignored)")->capture_default_str();
  cmd->add_option("-t,--threads", f->threads, "the server's compute threads")->capture_default_str();
  AddSizeOption(cmd, "--kv-dram", "", 1, &f->kv_dram, "the server's DRAM tier (default 64M)");
  AddSizeOption(cmd, "--kv-ssd", "", 1, &f->kv_ssd, "the server's SSD tier (default 256M)");
  cmd->add_option("--session-ttl", f->session_ttl, "the server's --session-ttl")->capture_default_str();
  cmd->add_option("--short-ttl", f->short_ttl, "session_ttl of every third conversation (seconds)")
      ->capture_default_str();
  cmd->add_option("--sparse-every", f->sparse_every, "every N-th request decodes sparsely (0 = none)")
      ->capture_default_str();
  cmd->add_option("--disconnect-every", f->disconnect_every, "every N-th request is cut mid-stream (0 = none)")
      ->capture_default_str();
  cmd->add_option("--sample-s", f->sample_s, "seconds between memory samples")->capture_default_str();
  cmd->add_option("--max-growth", f->max_growth, "RSS growth over the second half that fails the run (fraction)")
      ->capture_default_str();
  cmd->add_option("--serve-args", f->serve_args, "more flags for the server, e.g. \"--max-running 8\"");
  cmd->add_option("--ssd-parent", f->ssd_parent, "folder for the run's SSD tier (default: the temporary folder)");
  cmd->add_option("--log", f->log_out, "the server's log file (default: removed with the run's folder)");
  cmd->add_option("--json", f->json_out, "also write the summary, every minute and every sample to this file");
  cmd->add_option("--plot", f->plot_out, "write the memory plot (SVG) to this file");
  cmd->callback([run, f] { *run = [f] { return RunSoak(*f); }; });
}

}  // namespace attic::cli
