// `attic serve`: the OpenAI-compatible HTTP server (see docs/serving.md).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <thread>

#include "attic/core/log.h"
#include "attic/server/server.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {

struct ServeFlags {
  ModelFlags model;
  server::ServerOptions server;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  int64_t kv_budget_mib = 0;
  int64_t auto_kv_cap_mib = 2048;
  double max_body_mib = 8;
  // KV store (paper 001); on when --kv-dram-bytes > 0 or --kv-ssd-dir is given.
  uint64_t kv_dram_bytes = 0;
  std::string kv_ssd_dir;
  uint64_t kv_ssd_bytes = 16ull << 30;
  std::string kv_policy = "scheduler-aware";
  double session_ttl_s = 86400;
  std::string kv_preload = "layerwise";
  std::string kv_truncate_mode = "decoupled";
  std::string log_level = "info";
};

// One key per line; blank lines and lines starting with '#' are ignored.
StatusOr<std::vector<std::string>> ReadKeyFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return NotFoundError("cannot read API key file '" + path + "'");
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(f, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    keys.push_back(line.substr(start));
  }
  if (keys.empty()) return InvalidArgumentError("API key file '" + path + "' holds no keys");
  return keys;
}

void RaiseFileLimit() {
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

int RunServe(ServeFlags f) {
  // SIGINT/SIGTERM stop the server gracefully (or exit if it is not serving yet). The
  // handler only writes to a pipe: a waiter thread does the work. (Blocking the signals
  // instead would not cover threads that libraries start before main.)
  static int sig_pipe[2] = {-1, -1};
  static std::atomic<server::Server*> live{nullptr};
  if (pipe(sig_pipe) != 0) return Fail(InternalError("pipe() failed"));
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    unsigned char b = static_cast<unsigned char>(sig);
    ssize_t ignored = write(sig_pipe[1], &b, 1);
    (void)ignored;
  };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::thread([] {
    unsigned char sig = 0;
    while (read(sig_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    std::fprintf(stderr, "attic: %s received, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server::Server* s = live.load();
    if (s == nullptr) std::_Exit(128 + sig);
    s->Stop();
  }).detach();
  auto log_level = ParseLogLevel(f.log_level);
  if (!log_level.ok()) return Fail(log_level.status());
  SetLogLevel(*log_level);
  for (const auto& k : f.api_keys) f.server.api_keys.push_back(k);
  if (!f.api_key_file.empty()) {
    auto keys = ReadKeyFile(f.api_key_file);
    if (!keys.ok()) return Fail(keys.status());
    f.server.api_keys.insert(f.server.api_keys.end(), keys->begin(), keys->end());
  }
  if (f.max_body_mib <= 0) return Fail(InvalidArgumentError("--max-body-mib must be positive"));
  f.server.max_body_bytes = static_cast<size_t>(f.max_body_mib * (1 << 20));
  f.server.scheduler.truncate_recompute = f.kv_truncate_mode == "recompute";
  f.server.scheduler.kv_preload = f.kv_preload == "sync"     ? engine::KvPreload::kSync
                                  : f.kv_preload == "inline" ? engine::KvPreload::kInline
                                                             : engine::KvPreload::kLayerwise;
  if (f.kv_dram_bytes > 0 || !f.kv_ssd_dir.empty()) {
    auto policy = store::ParsePolicy(f.kv_policy);
    if (!policy.ok()) return Fail(policy.status());
    if (f.session_ttl_s < 0) return Fail(InvalidArgumentError("--session-ttl must be >= 0"));
    f.server.kv_store = true;
    f.server.store.dram_bytes = f.kv_dram_bytes;
    f.server.store.ssd_dir = f.kv_ssd_dir;
    f.server.store.ssd_bytes = f.kv_ssd_bytes;
    f.server.store.policy = *policy;
    f.server.store.default_ttl_ms = static_cast<int64_t>(f.session_ttl_s * 1000);
    f.server.store.reserve_dram = true;  // the tier's pages are faulted in at start-up
  }
  engine::EngineOptions eo = ToEngineOptions(f.model, true);
  if (f.kv_budget_mib > 0) eo.kv_cache_bytes = f.kv_budget_mib << 20;
  auto eng = engine::Engine::Load(eo);
  if (!eng.ok()) return Fail(eng.status());
  engine::Engine& e = **eng;
  if (f.kv_budget_mib <= 0) {
    // Auto: room for --max-running full contexts, capped, but at least one context.
    const kv::KvShape shape = e.kv_pool().shape();
    const int64_t per_token = shape.block_bytes() / shape.block_size;
    const int64_t one_context = (static_cast<int64_t>(e.context_length()) + shape.block_size) * per_token;
    int64_t want = one_context * f.server.scheduler.max_running;
    want = std::max(one_context, std::min(want, f.auto_kv_cap_mib << 20));
    e.ResizeKvCache(want);
  }
  if (!e.chat_template_kind().ok()) {
    std::fprintf(stderr,
                 "attic: the model has no chat template Attic recognises; chat requests use ChatML "
                 "(choose another with --chat-template)\n");
  }
  auto srv = server::Server::Create(e, f.server);
  if (!srv.ok()) return Fail(srv.status());

  RaiseFileLimit();
  Status st = (*srv)->Start();
  if (!st.ok()) return Fail(st);
  const auto& pool = e.kv_pool();
  std::fprintf(stderr,
               "attic: serving '%s' (context %d tokens, %d tokens per step, up to %d running / %d waiting, "
               "KV %d blocks = %.0f MiB, %s%s)\n",
               (*srv)->model_name().c_str(), e.context_length(), e.transformer().max_batch_tokens(),
               (*srv)->scheduler().options().max_running, (*srv)->scheduler().options().max_waiting, pool.n_blocks(),
               static_cast<double>(pool.n_blocks()) * pool.shape().block_bytes() / (1 << 20),
               f.server.api_keys.empty() ? "no API keys" : "API keys required",
               e.options().deterministic ? ", deterministic" : "");
  std::fprintf(stderr, "attic: listening on http://%s:%d\n", f.server.host.c_str(), (*srv)->port());
  std::fflush(stderr);
  live.store(srv->get());
  (*srv)->Wait();
  live.store(nullptr);
  return 0;
}

}  // namespace

void AddServeCommand(CLI::App& app, RunFn* run) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  auto f = std::make_shared<ServeFlags>();
  AddModelFlags(cmd, &f->model);
  auto& s = f->server;
  cmd->add_option("--host", s.host, "listen address")->capture_default_str();
  cmd->add_option("--port", s.port, "listen port (0 = any free port, printed on stderr)")->capture_default_str();
  cmd->add_option("--api-key", f->api_keys, "accepted API key; each key is its own tenant (repeatable)");
  cmd->add_option("--api-key-file", f->api_key_file, "file of API keys, one per line ('#' comments)");
  cmd->add_option("--model-name", s.model_name, "model id clients send (default: model file/dir name)");
  cmd->add_option("--max-running", s.scheduler.max_running, "sequences batched together (prefilling or decoding)")
      ->capture_default_str();
  cmd->add_option("--max-waiting", s.scheduler.max_waiting, "waiting-queue bound; beyond it requests get 429")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", s.scheduler.max_prefill_tokens_per_step,
                  "prefill tokens per step (0 = what --batch leaves after decode rows)")
      ->capture_default_str();
  cmd->add_option("--kv-budget-mib", f->kv_budget_mib,
                  "KV cache budget in MiB (0 = room for --max-running full contexts, at most --auto-kv-cap-mib)")
      ->capture_default_str();
  cmd->add_option("--auto-kv-cap-mib", f->auto_kv_cap_mib, "cap of the automatic KV budget")->capture_default_str();
  cmd->add_option("--max-resident", s.scheduler.max_resident, "finished sequences whose KV stays resident for reuse")
      ->capture_default_str();
  cmd->add_option("--max-tokens-limit", s.max_tokens_limit, "cap on a request's max_tokens (0 = context window)")
      ->capture_default_str();
  cmd->add_option("--timeout", s.request_timeout_s, "per-request timeout in seconds")->capture_default_str();
  cmd->add_option("--max-body-mib", f->max_body_mib, "largest accepted request body in MiB (else 413)")
      ->capture_default_str();
  cmd->add_option("--http-threads", s.http_threads, "HTTP worker threads (0 = max-running + max-waiting + 16)")
      ->capture_default_str();
  cmd->add_option("--kv-dram-bytes", f->kv_dram_bytes,
                  "host-DRAM tier of the KV store in bytes, faulted in at start-up (0 with no --kv-ssd-dir = store off)")
      ->capture_default_str();
  cmd->add_option("--kv-ssd-dir", f->kv_ssd_dir, "directory of the SSD tier of the KV store (survives restarts)");
  cmd->add_option("--kv-ssd-bytes", f->kv_ssd_bytes, "SSD tier capacity in bytes")->capture_default_str();
  cmd->add_option("--kv-policy", f->kv_policy, "KV store eviction: scheduler-aware, lru or fifo")->capture_default_str();
  cmd->add_option("--session-ttl", f->session_ttl_s, "seconds a stored session lives (0 = forever)")
      ->capture_default_str();
  cmd->add_option("--kv-truncate-ratio", s.scheduler.truncate_ratio,
                  "with the KV store: on context overflow drop at least this ratio of the history in the "
                  "stored KV instead of rejecting (0 = off)")
      ->capture_default_str();
  cmd->add_option("--kv-truncate-keep", s.scheduler.truncate_keep_first,
                  "tokens at the start of a conversation never dropped by truncation")
      ->capture_default_str();
  cmd->add_option("--kv-truncate-mode", f->kv_truncate_mode,
                  "on context overflow: decoupled (reuse the kept tokens' stored KV at new positions) or recompute "
                  "(prefill the kept tokens again)")
      ->check(CLI::IsMember({"decoupled", "recompute"}))
      ->capture_default_str();
  cmd->add_option("--kv-preload", f->kv_preload,
                  "how stored KV enters the compute buffer: layerwise (a loader thread enters layer l+1 while layer "
                  "l computes), inline (the compute threads enter layer l just before computing it) or sync (all "
                  "layers before the first step)")
      ->check(CLI::IsMember({"layerwise", "inline", "sync"}))
      ->capture_default_str();
  cmd->add_option("--kv-read-buffer-bytes", s.scheduler.kv_read_buffer_bytes,
                  "stored KV of waiting jobs fetched ahead of admission (-1 = sized by S_buf from measured rates, "
                  "0 = none)")
      ->capture_default_str();
  cmd->add_option("--log-level", f->log_level,
                  "debug (also request bodies), info (one access line per request), warn, error or off")
      ->capture_default_str();
  cmd->callback([run, f] { *run = [f] { return RunServe(*f); }; });
}

}  // namespace attic::cli
