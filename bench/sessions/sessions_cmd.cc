// `attic bench sessions`: multi-turn conversations replayed against the real server,
// once with the KV store (CA, CachedAttention, paper 001) and once with recomputation
// (RE, the paper's baseline), and the paper's section 4.2 metrics compared. This file is
// the command: its flags, the servers it starts and the output it writes. The parts:
//   workload.h        sessions and turns from the ShareGPT / MT-Bench datasets
//   server_process.h  the `attic serve` children and Ctrl-C handling
//   replay.h          the chat clients that replay the workload against one server
//   summary.h         the metrics of one replay (hit rates, TTFT, prefill throughput)
//   report.h          the tables and the CA / RE ratios
//   plot.h            the --plot SVG
//
// Defaults: --max-turns 16 (the clamp barely moves the ShareGPT mean of 5.75 turns),
// answers of [16, 1024] tokens (the real lengths, bar a few outliers), --max-context 90%
// of the servers' 4K window (the paper's LLaMA-2 context). The paper's sessions are long
// (47% over 2K tokens); these defaults let the real conversations grow toward the
// window: with the default 12 sessions and seed, 3 end past 2K and the longest reaches
// 3.4K (the previous defaults, at most 6 turns of at most 256 answer tokens in 2K, kept
// every session under 2K). With ignore_eos (unless --no-ignore-eos) the random-weight
// model produces exactly max_tokens tokens a turn.
//
// Servers: by default the benchmark starts `attic serve` (this same binary) twice, one
// after the other on a free port, waits for /health, replays the same trace, and stops
// it: CA = --kv-dram-bytes (+ --kv-ssd-dir in a fresh temporary directory unless
// --no-ssd) and --max-resident 0 (--ca-max-resident) so that every reused token comes
// from the store's DRAM or SSD tier, not from KV left in the compute buffer; RE = no
// store and --max-resident 0, so every turn recomputes its whole history. --ca-url /
// --re-url use already running servers instead (then no server CPU time is measured).
//
// Output: a table, the JSON summary as the last stdout line, --json FILE (the summary
// plus every turn), --plot FILE.svg (TTFT CDF and median TTFT by turn index);
// --trace-only prints the generated workload as JSON and exits.
//
// Default run (a few minutes on 2 cores; the model is random-weight, answers are
// gibberish, which does not matter for KV reuse):
//   build/attic make-model --config ../shared/models/smollm2-135m-instruct-tokenizer/config.json
//     --tokenizer ../shared/models/smollm2-135m-instruct-tokenizer --dtype bf16
//     --out-gguf out/models/smollm2-135m-bf16.gguf
//   build/attic bench sessions --json out/bench-sessions/sessions.json --plot out/bench-sessions/sessions.svg
#include <signal.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include "attic/core/byte_size.h"
#include "attic/core/file.h"
#include "bench/sessions/plot.h"
#include "bench/sessions/replay.h"
#include "bench/sessions/report.h"
#include "bench/sessions/server_process.h"
#include "bench/sessions/summary.h"
#include "bench/sessions/workload.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {

using json = nlohmann::json;
using bench::sessions::Num;
using bench::sessions::RunResult;
using bench::sessions::ServerProcess;
using bench::sessions::SessionSpec;

constexpr char kDefaultModel[] = "out/models/smollm2-135m-bf16.gguf";  // in the project folder

struct SessionsFlags {
  std::string model;  // "" = <project>/out/models/smollm2-135m-bf16.gguf
  std::string datasets;
  std::string ca_url, re_url;
  std::string only = "both";  // both, ca, re
  std::string api_key;
  bench::sessions::WorkloadOptions workload;  // max_context 0: 90% of --ctx
  bool no_ignore_eos = false;
  // Servers started by the benchmark.
  int threads = 2;
  int ctx = 4096;
  uint64_t kv_budget = 4ull << 30;
  int max_running = 16;
  uint64_t kv_dram = 512ull << 20;
  uint64_t kv_ssd = 8ull << 30;
  bool no_ssd = false;
  std::string ssd_parent;
  int ca_max_resident = 0;
  std::string serve_args;
  // Output.
  std::string json_out, plot_out;
  bool trace_only = false;
  bool quiet = false;
};

std::string DefaultDatasets() { return JoinPath(SharedDir(), "datasets"); }

std::vector<std::string> SplitWords(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

std::vector<std::string> CommonServeArgs(const SessionsFlags& f) {
  std::vector<std::string> a{"-m",           f.model,
                             "-t",           std::to_string(f.threads),
                             "--ctx",        std::to_string(f.ctx),
                             "--host",       "127.0.0.1",
                             "--port",       "0",
                             "--kv-budget", FormatByteSize(f.kv_budget),
                             "--max-running", std::to_string(f.max_running)};
  for (auto& w : SplitWords(f.serve_args)) a.push_back(w);
  return a;
}

// The flags of the `attic serve` started for `mode` ("CA" or "RE").
std::vector<std::string> ServeArgs(const SessionsFlags& f, bool ca, const std::string& tmp, const std::string& nonce) {
  std::vector<std::string> args = CommonServeArgs(f);
  if (!ca) {
    args.insert(args.end(), {"--max-resident", "0"});
    return args;
  }
  args.insert(args.end(), {"--kv-dram", FormatByteSize(f.kv_dram), "--max-resident", std::to_string(f.ca_max_resident)});
  if (!f.no_ssd) {
    std::string parent = f.ssd_parent.empty() ? tmp : f.ssd_parent;
    std::string dir = parent + "/ssd-" + nonce;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    args.insert(args.end(), {"--kv-ssd-dir", dir, "--kv-ssd", FormatByteSize(f.kv_ssd)});
  }
  return args;
}

// The "servers" object of the JSON: how the two servers were configured.
json ServersJson(const SessionsFlags& f) {
  return json{{"threads", f.threads},
              {"ctx", f.ctx},
              {"kv_budget_bytes", f.kv_budget},
              {"max_running", f.max_running},
              {"ca_kv_dram_bytes", f.kv_dram},
              {"ca_kv_ssd_bytes", f.no_ssd ? json(nullptr) : json(f.kv_ssd)},
              {"ca_max_resident", f.ca_max_resident},
              {"re_max_resident", 0},
              {"serve_args", f.serve_args},
              {"ca_url", f.ca_url.empty() ? json("started by the benchmark") : json(f.ca_url)},
              {"re_url", f.re_url.empty() ? json("started by the benchmark") : json(f.re_url)}};
}

Status CheckFlags(SessionsFlags* f) {
  bench::sessions::WorkloadOptions& w = f->workload;
  if (w.sessions < 1) return InvalidArgumentError("--sessions must be >= 1");
  if (w.rate < 0 || w.think < 0) return InvalidArgumentError("--rate and --think must be >= 0");
  if (w.min_turns < 1 || w.max_turns < w.min_turns)
    return InvalidArgumentError("--min-turns must be >= 1 and <= --max-turns");
  if (w.min_answer < 1 || w.max_answer < w.min_answer)
    return InvalidArgumentError("--min-answer must be >= 1 and <= --max-answer");
  if (w.max_context == 0) w.max_context = f->ctx * 9 / 10;
  if (w.max_prompt_chars < 1 || w.max_context < 1 || w.mean_turns < 1)
    return InvalidArgumentError("--max-prompt-chars, --max-context and --mean-turns must be >= 1");
  if (f->only != "both" && f->only != "ca" && f->only != "re")
    return InvalidArgumentError("--only must be both, ca or re");
  if (f->datasets.empty()) f->datasets = DefaultDatasets();
  if (f->model.empty()) f->model = JoinPath(ProjectDir(), kDefaultModel);
  return OkStatus();
}

// The workload's parameters as the JSON reports them ("workload"; --trace-only adds the
// trace).
json WorkloadSummaryJson(const SessionsFlags& f, int n_turns, size_t n_conversations) {
  const bench::sessions::WorkloadOptions& w = f.workload;
  return json{{"sessions", w.sessions},
              {"turns", n_turns},
              {"rate_per_s", w.rate},
              {"think_mean_s", w.think},
              {"turns_min_max_mean", {w.min_turns, w.max_turns, w.mean_turns}},
              {"answer_tokens_min_max", {w.min_answer, w.max_answer}},
              {"max_prompt_chars", w.max_prompt_chars},
              {"max_context_est", w.max_context},
              {"ignore_eos", !f.no_ignore_eos},
              {"seed", w.seed},
              {"conversations_in_pool", n_conversations}};
}

// Runs CA then RE (or the one --only names), each on its own server: started here
// (logs and SSD tier under `tmp`) or the --ca-url / --re-url one.
StatusOr<std::vector<RunResult>> RunModes(const SessionsFlags& f, const std::vector<SessionSpec>& work,
                                          const std::string& tmp, const std::string& nonce) {
  std::vector<RunResult> runs;
  for (const std::string mode : {"CA", "RE"}) {
    const bool ca = mode == "CA";
    if ((ca && f.only == "re") || (!ca && f.only == "ca")) continue;
    std::string url = ca ? f.ca_url : f.re_url;
    ServerProcess proc;
    bool spawned = false;
    if (url.empty()) {
      const std::vector<std::string> args = ServeArgs(f, ca, tmp, nonce);
      if (!f.quiet) {
        std::string cmd = "attic serve";
        for (const auto& a : args) cmd += " " + a;
        std::fprintf(stderr, "attic: %s: starting %s\n", mode.c_str(), cmd.c_str());
      }
      if (Status st = proc.Start(mode, args, tmp + "/" + mode + ".log"); !st.ok()) return st;
      url = proc.url();
      spawned = true;
      if (!f.quiet) std::fprintf(stderr, "attic: %s: server on %s\n", mode.c_str(), url.c_str());
    }
    bench::sessions::ReplayOptions ro;
    ro.api_key = f.api_key;
    ro.ignore_eos = !f.no_ignore_eos;
    ro.quiet = f.quiet;
    ro.nonce = nonce;
    if (spawned) ro.server_cpu_seconds = [&proc] { return proc.CpuSeconds(); };
    auto r = bench::sessions::Replay(mode, url, work, ro);
    if (spawned) proc.Stop();
    if (!r.ok()) return r.status();
    // With the store on, make sure the server was really configured as asked.
    if (ca && r->metrics_delta.count("attic_kv_store_lookups_total") == 0)
      std::fprintf(stderr, "attic: warning: the CA server reports no attic_kv_store_* metrics (is its KV store on?)\n");
    runs.push_back(std::move(*r));
  }
  return runs;
}

int RunBenchSessions(SessionsFlags f) {
  if (Status st = CheckFlags(&f); !st.ok()) return Fail(st);
  if (Status st = PrepareOutput(f.json_out, "--json"); !st.ok()) return Fail(st);
  if (Status st = PrepareOutput(f.plot_out, "--plot"); !st.ok()) return Fail(st);
  auto pool = bench::sessions::LoadConversations(f.datasets);
  if (!pool.ok()) return Fail(pool.status());
  const std::vector<SessionSpec> work = bench::sessions::GenerateWorkload(*pool, f.workload);
  int n_turns = 0;
  for (const auto& s : work) n_turns += static_cast<int>(s.turns.size());
  json workload = WorkloadSummaryJson(f, n_turns, pool->conversations.size());
  if (f.trace_only) {
    workload["trace"] = bench::sessions::WorkloadJson(work, true);
    std::printf("%s\n", workload.dump().c_str());
    return 0;
  }
  const bool need_spawn = (f.only != "re" && f.ca_url.empty()) || (f.only != "ca" && f.re_url.empty());
  if (need_spawn && !std::filesystem::exists(f.model)) {
    return Fail(NotFoundError(
        "model '" + f.model +
        "' not found (pass --model, or make it, from " + ProjectDir() +
        ", with: build/attic make-model --config ../shared/models/smollm2-135m-instruct-tokenizer/config.json "
        "--tokenizer ../shared/models/smollm2-135m-instruct-tokenizer --dtype bf16 --out-gguf " +
        kDefaultModel + ")"));
  }
  signal(SIGPIPE, SIG_IGN);
  std::string tmpl = (std::filesystem::temp_directory_path() / "attic-bench-sessions-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) return Fail(InternalError("cannot create a temporary directory"));
  const std::string tmp = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmp};
  bench::sessions::StopServersOnSignal(tmp);
  const std::string nonce = std::to_string(std::chrono::system_clock::now().time_since_epoch().count() % 100000000);
  if (!f.quiet) {
    std::fprintf(stderr, "attic: workload: %d sessions, %d turns, Poisson arrivals %.2f/s, think %.1f s (seed %llu)\n",
                 f.workload.sessions, n_turns, f.workload.rate, f.workload.think,
                 static_cast<unsigned long long>(f.workload.seed));
  }
  auto runs = RunModes(f, work, tmp, nonce);
  if (!runs.ok()) return Fail(runs.status());

  // Report.
  std::vector<json> sums;
  for (const auto& r : *runs) sums.push_back(bench::sessions::Summarize(r));
  bench::sessions::PrintSummaryTable(sums);
  json out{{"benchmark", "sessions"}, {"model", f.model}, {"workload", workload}, {"servers", ServersJson(f)}};
  for (const auto& s : sums) out[s["mode"] == "CA" ? "ca" : "re"] = s;
  if (out.contains("ca") && out.contains("re")) {
    out["ca_over_re"] = bench::sessions::CaOverRe(out["ca"], out["re"]);
    bench::sessions::PrintVerdict(out["ca_over_re"]);
  }
  if (!f.json_out.empty()) {
    json full = out;
    full["workload"]["trace"] = bench::sessions::WorkloadJson(work, false);
    for (const auto& r : *runs) full[r.mode == "CA" ? "ca_turns" : "re_turns"] = bench::sessions::TurnsJson(r);
    if (Status st = WriteOutput(f.json_out, full.dump(2) + "\n", "--json"); !st.ok()) return Fail(st);
  }
  if (!f.plot_out.empty()) {
    std::vector<const RunResult*> rp;
    for (const auto& r : *runs) rp.push_back(&r);
    const std::string svg = bench::sessions::PlotSvg(
        rp, "attic bench sessions: " + std::to_string(f.workload.sessions) + " sessions, " + std::to_string(n_turns) +
                " turns, " + std::filesystem::path(f.model).filename().string());
    if (Status st = WriteOutput(f.plot_out, svg, "--plot"); !st.ok()) return Fail(st);
  }
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  for (const auto& s : sums)
    if (Num(s, "turns_failed") > 0) return 1;
  return 0;
}

}  // namespace

void AddBenchSessionsCommand(CLI::App& app, RunFn* run) {
  CLI::App* bench = app.get_subcommand("bench");
  auto* cmd = bench->add_subcommand(
      "sessions", "multi-turn conversations against the server: KV store (CA) vs recomputation (RE)");
  auto f = std::make_shared<SessionsFlags>();
  cmd->add_option("-m,--model", f->model,
                  std::string("model the benchmark's servers load (default: ") + kDefaultModel +
                      " in the project folder, " + ProjectDir() + ")");
  cmd->add_option("--datasets", f->datasets, "datasets folder (default: " + DefaultDatasets() + ")");
  cmd->add_option("--ca-url", f->ca_url, "use this running server (KV store on) for CA instead of starting one");
  cmd->add_option("--re-url", f->re_url, "use this running server (no store, --max-resident 0) for RE");
  cmd->add_option("--only", f->only, "run both modes, or only ca / re")->capture_default_str();
  cmd->add_option("--api-key", f->api_key, "API key for --ca-url / --re-url servers");
  cmd->add_option("-s,--sessions", f->workload.sessions, "conversation sessions")->capture_default_str();
  cmd->add_option("--rate", f->workload.rate, "session arrivals per second (Poisson)")->capture_default_str();
  cmd->add_option("--think", f->workload.think, "mean think time between an answer and the next turn, s (exponential)")
      ->capture_default_str();
  cmd->add_option("--min-turns", f->workload.min_turns, "fewest turns per session")->capture_default_str();
  cmd->add_option("--max-turns", f->workload.max_turns, "most turns per session")->capture_default_str();
  cmd->add_option("--mean-turns", f->workload.mean_turns, "mean of the (clamped) turn-count distribution (ShareGPT: 5.75)")
      ->capture_default_str();
  cmd->add_option("--max-prompt-chars", f->workload.max_prompt_chars, "user messages are cut to this many bytes")
      ->capture_default_str();
  cmd->add_option("--min-answer", f->workload.min_answer, "fewest answer tokens")->capture_default_str();
  cmd->add_option("--max-answer", f->workload.max_answer, "most answer tokens")->capture_default_str();
  cmd->add_option("--max-context", f->workload.max_context,
                  "a session ends before its estimated context passes this (0 = 90% of --ctx)")
      ->capture_default_str();
  cmd->add_option("--seed", f->workload.seed, "workload seed")->capture_default_str();
  cmd->add_flag("--no-ignore-eos", f->no_ignore_eos, "let answers end at EOS instead of at max_tokens");
  cmd->add_option("-t,--threads", f->threads, "compute threads of the servers")->capture_default_str();
  cmd->add_option("-c,--ctx", f->ctx, "context window of the servers")->capture_default_str();
  AddSizeOption(cmd, "--kv-budget", "--kv-budget-mib", 1 << 20, &f->kv_budget,
                "compute-buffer KV cache of the servers (default 4G)");
  cmd->add_option("--max-running", f->max_running, "sequences batched together")->capture_default_str();
  AddSizeOption(cmd, "--kv-dram", "--kv-dram-mib", 1 << 20, &f->kv_dram, "CA: DRAM tier of the KV store (default 512M)");
  AddSizeOption(cmd, "--kv-ssd", "--kv-ssd-mib", 1 << 20, &f->kv_ssd, "CA: SSD tier of the KV store (default 8G)");
  cmd->add_flag("--no-ssd", f->no_ssd, "CA: no SSD tier");
  cmd->add_option("--ssd-dir", f->ssd_parent, "CA: parent of the SSD tier's fresh directory (default: a temp dir)");
  cmd->add_option("--ca-max-resident", f->ca_max_resident,
                  "CA: finished sequences kept in the compute buffer (0: all reuse goes through the store)")
      ->capture_default_str();
  cmd->add_option("--serve-args", f->serve_args, "extra `attic serve` flags for both servers (one string)");
  cmd->add_option("--json", f->json_out, "write the summary and every turn as JSON to this file");
  cmd->add_option("--plot", f->plot_out, "write an SVG plot (TTFT CDF, median TTFT by turn) to this file");
  cmd->add_flag("--trace-only", f->trace_only, "print the generated workload as JSON and exit (no servers)");
  cmd->add_flag("-q,--quiet", f->quiet, "no per-turn progress on stderr");
  cmd->callback([run, f] { *run = [f] { return RunBenchSessions(*f); }; });
}

}  // namespace attic::cli
