// `attic serve`: the OpenAI-compatible HTTP server (see docs/serving.md).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <optional>
#include <thread>

#include "attic/core/byte_size.h"
#include "attic/core/log.h"
#include "attic/pic/link.h"
#include "attic/pq/offload.h"
#include "attic/pq/sparse.h"
#include "attic/server/server.h"
#include "attic/store/dram_size.h"
#include "attic/store/kv_store.h"
#include "attic/store/redis_tier.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {

struct ServeFlags {
  ModelFlags model;
  server::ServerOptions server;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  uint64_t kv_budget = 0;
  uint64_t kv_budget_cap = 2ull << 30;
  uint64_t max_body = 8ull << 20;
  // KV store (paper 001): a host-DRAM tier sized automatically (store/dram_size.h) unless
  // --kv-dram is given (0 = no DRAM tier); the store is off with neither a DRAM tier nor
  // --kv-ssd-dir.
  std::optional<uint64_t> kv_dram;
  std::string kv_ssd_dir;
  uint64_t kv_ssd = 16ull << 30;
  std::string kv_store_dtype;  // the stored entries' type; "" = the compute buffer's (--kv-dtype)
  // Shared remote tier (Redis Cluster); on when --kv-remote is given.
  std::string kv_remote;
  uint64_t kv_remote_bytes = 8ull << 30;
  std::string kv_remote_write = "through";
  int kv_remote_timeout_ms = 1500;
  uint64_t sparse_offload = 4ull << 30;
  std::string kv_read_buffer = "auto";
  std::string kv_policy = "scheduler-aware";
  double session_ttl_s = 86400;
  std::string kv_preload = "auto";
  std::string kv_truncate_mode = "decoupled";
  std::string log_level = "info";
  std::string link = "attnlink-16";
  bool link_chunk_bos = true;
  std::string sparse = "full";
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

// The KV store in the start-up line, e.g. "KV store: DRAM 6G (automatic) + SSD 16G in
// out/kv-ssd", or why there is none.
std::string DescribeStore(const ServeFlags& f, bool dram_auto) {
  if (!f.server.kv_store)
    return dram_auto ? "no KV store (too little memory available for the automatic DRAM tier: give --kv-dram SIZE)"
                     : "no KV store (--kv-dram 0)";
  const uint64_t dram = f.server.store.dram_bytes;
  std::string s = "KV store: ";
  s += dram > 0 ? "DRAM " + FormatByteSize(dram) + (dram_auto ? " (automatic)" : "") : "no DRAM tier";
  if (!f.kv_ssd_dir.empty()) s += " + SSD " + FormatByteSize(f.kv_ssd) + " in " + f.kv_ssd_dir;
  if (!f.kv_remote.empty()) s += " + remote";
  return s;
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
  if (f.max_body < 1024) return UsageError("--max-body must be at least 1K");
  f.server.max_body_bytes = static_cast<size_t>(f.max_body);
  if (f.kv_read_buffer == "auto") {
    f.server.kv.kv_read_buffer_bytes = -1;
  } else {
    auto rb = ParseByteSize(f.kv_read_buffer);
    if (!rb.ok()) return UsageError("--kv-read-buffer: " + rb.status().message() + " or auto");
    f.server.kv.kv_read_buffer_bytes = static_cast<int64_t>(*rb);
  }
  f.server.kv.truncate_recompute = f.kv_truncate_mode == "recompute";
  // auto: a loader thread only where a core is left for it. With every core computing,
  // the loader only time-slices with the forward (store.md, "Entering"), and the compute
  // threads enter faster themselves.
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  const bool spare_core = f.model.threads > 0 && static_cast<unsigned>(f.model.threads) < cpus;
  f.server.kv.kv_preload = f.kv_preload == "sync"        ? store::Preload::kSync
                           : f.kv_preload == "inline"    ? store::Preload::kInline
                           : f.kv_preload == "layerwise" ? store::Preload::kLayerwise
                           : spare_core                  ? store::Preload::kLayerwise
                                                         : store::Preload::kInline;
  if (!f.kv_remote.empty()) {
    if (f.kv_remote_write != "through" && f.kv_remote_write != "back")
      return UsageError("--kv-remote-write must be 'through' (write each save to the cluster) or 'back' (only what "
                        "is demoted there)");
    if (f.kv_remote_timeout_ms < 1) return UsageError("--kv-remote-timeout must be at least 1 ms");
    if (f.kv_remote_bytes == 0) return UsageError("--kv-remote-bytes must be positive");
    if (f.kv_dram == 0u) return UsageError("--kv-remote needs the DRAM tier above it: not --kv-dram 0");
    f.server.remote.url = f.kv_remote;
    f.server.remote.capacity = f.kv_remote_bytes;
    f.server.remote.retry_budget = std::chrono::milliseconds(f.kv_remote_timeout_ms);
    f.server.remote.command_timeout = std::chrono::milliseconds(std::min(1000, f.kv_remote_timeout_ms));
    f.server.store.write_through = f.kv_remote_write == "through";
    // The URL is checked now (nothing connects yet), before the model loads.
    if (auto check = store::RedisTier::Open(f.server.remote); !check.ok())
      return UsageError("--kv-remote: " + check.status().message());
  }
  // The store's type, of its entries in every tier and of the sparse offload tier's
  // blocks: the compute buffer's unless given (any enters any buffer type):
  // the store type whose K and V rows are the buffer's K and V types (q8_0 K with q4_0
  // V: q8_0/q4_0); for a pair no store type holds, the more exact of the two (f32, then
  // f16, then q8_0, then q4_0), so the store loses nothing the buffer holds.
  const std::string& k_type = f.model.kv_dtype_k.empty() ? f.model.kv_dtype : f.model.kv_dtype_k;
  const std::string& v_type = f.model.kv_dtype_v.empty() ? f.model.kv_dtype : f.model.kv_dtype_v;
  auto exactness = [](const std::string& t) { return t == "f32" ? 3 : t == "f16" ? 2 : t == "q8_0" ? 1 : 0; };
  std::string buffer_type = exactness(k_type) >= exactness(v_type) ? k_type : v_type;
  store::KvDtype k, v;
  if (store::ParseKvDtype(k_type, &k) && store::ParseKvDtype(v_type, &v))
    for (store::KvDtype t : store::kKvDtypes)
      if (store::KvTensorDtype(t, false) == k && store::KvTensorDtype(t, true) == v) buffer_type = store::KvDtypeName(t);
  const std::string& type = f.kv_store_dtype.empty() ? buffer_type : f.kv_store_dtype;
  if (!store::ParseKvDtype(type, &f.server.store.kv_dtype))
    return UsageError("--kv-store-dtype must be " + store::KvDtypeChoices() + ", not '" + type + "'");
  f.server.kv.sparse_offload_dtype = f.server.store.kv_dtype;
  // The KV store's options; the automatic DRAM tier is sized once the model is loaded
  // (below), so that what the model takes is no longer counted as available.
  const bool dram_auto = !f.kv_dram.has_value();
  if (dram_auto || *f.kv_dram > 0 || !f.kv_ssd_dir.empty()) {
    auto policy = store::ParsePolicy(f.kv_policy);
    if (!policy.ok()) return Fail(policy.status());
    if (f.session_ttl_s < 0) return Fail(InvalidArgumentError("--session-ttl must be >= 0"));
    f.server.kv_store = true;
    f.server.store.dram_bytes = f.kv_dram.value_or(0);
    f.server.store.ssd_dir = f.kv_ssd_dir;
    f.server.store.ssd_bytes = f.kv_ssd;
    f.server.store.policy = *policy;
    f.server.store.default_ttl_ms = static_cast<int64_t>(f.session_ttl_s * 1000);
    // A size the operator chose is faulted in at start-up (saves then never fault fresh
    // pages on the serving path); the automatic one grows with use (docs/store.md, "The
    // DRAM tier by default").
    f.server.store.reserve_dram = dram_auto ? store::DramReserve::kOnDemand : store::DramReserve::kAtOpen;
  }
  auto link = pic::ParseLinkOptions(f.link);
  if (!link.ok()) return UsageError("--link: " + link.status().message());
  f.server.link = *link;
  f.server.link_chunk_bos = f.link_chunk_bos;
  auto sparse = pq::ParseSparseOptions(f.sparse);
  if (!sparse.ok()) return UsageError("--sparse: " + sparse.status().message());
  if (sparse->method != pq::SparseMethod::kFull)
    f.server.kv.sparse = std::make_shared<const pq::SparseOptions>(*sparse);
  f.server.kv.sparse_offload_bytes = static_cast<int64_t>(f.sparse_offload);
  engine::EngineOptions eo = ToEngineOptions(f.model, true);
  // The KV pool: --kv-budget, else room for --max-running full contexts, at most
  // --kv-budget-cap, at least one context.
  eo.kv_cache_bytes = static_cast<int64_t>(f.kv_budget);
  eo.kv_cache_contexts = f.server.scheduler.max_running;
  eo.kv_cache_auto_cap_bytes = static_cast<int64_t>(f.kv_budget_cap);
  auto eng = engine::Engine::Load(eo);
  if (!eng.ok()) return Fail(eng.status());
  engine::Engine& e = **eng;
  PrintChatTemplate(e);
  if (dram_auto) {
    const store::HostMemory host = store::ReadHostMemory();
    f.server.store.dram_bytes = store::AutoDramTierBytes(host.physical_bytes, host.available_bytes);
    auto gib = [](uint64_t bytes) { return static_cast<double>(bytes) / (1ull << 30); };
    Log(LogLevel::kInfo,
        "KV store: DRAM tier %s, chosen automatically as min(8G, 1/4 of %.1fG physical, 1/2 of %.1fG available) in "
        "whole 64M, its pages faulted in as it fills (--kv-dram SIZE sets it, --kv-dram 0 turns it off)",
        FormatByteSize(f.server.store.dram_bytes).c_str(), gib(host.physical_bytes), gib(host.available_bytes));
    if (f.server.store.dram_bytes == 0) {
      if (!f.kv_remote.empty())
        return Fail(ResourceExhaustedError(
            "--kv-remote needs the DRAM tier above it, and too little memory is available for the automatic one: "
            "give --kv-dram SIZE"));
      f.server.kv_store = !f.kv_ssd_dir.empty();
    }
  }
  // The store's write buffer (saves queued for the writer thread, reserved with the DRAM
  // tier) follows the DRAM tier: a quarter of it, 16M to 256M. A fixed 256M made a 64M
  // tier a 320M server (the soak's footprint, docs/fuzzing.md).
  if (f.server.kv_store) {
    const uint64_t quarter = f.server.store.dram_bytes / 4;
    f.server.store.write_buffer_bytes = std::clamp<uint64_t>(quarter, 16ull << 20, 256ull << 20);
  }
  // The memory budget: what the configuration bounds, plus a fixed overhead measured on
  // the soak (docs/serving.md, "Memory budget"): 48M (code, main heap, thread stacks)
  // and 12M for each malloc arena glibc may create (8 per core).
  {
    const auto& kv = e.kv_pool();
    auto& b = f.server.memory_budget;
    b.emplace_back("weights", e.model().weight_bytes());
    // The kernels' packed copies (bf16 panels within an eighth of RAM; block-quantized
    // matrices always): resident beside the mapped file.
    if (e.packed_weight_bytes() > 0) b.emplace_back("packed_weights", e.packed_weight_bytes());
    b.emplace_back("kv_pool", kv.mapped_bytes());
    if (f.server.kv_store) {
      b.emplace_back("kv_dram_tier", f.server.store.dram_bytes);
      b.emplace_back("kv_write_buffer", f.server.store.write_buffer_bytes);
    }
    b.emplace_back("sparse_offload", f.sparse_offload);
    b.emplace_back("fixed_overhead", (48ull << 20) + (12ull << 20) * 8 * cpus);
    auto mib = [](uint64_t bytes) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.1fM", static_cast<double>(bytes) / (1 << 20));
      return std::string(buf);
    };
    uint64_t sum = 0;
    std::string parts;
    for (const auto& [name, bytes] : b) {
      sum += bytes;
      parts += (parts.empty() ? "" : " + ") + name + " " + mib(bytes);
    }
    Log(LogLevel::kInfo, "memory budget %s = %s (metric attic_memory_budget_bytes)", mib(sum).c_str(), parts.c_str());
  }
  auto srv = server::Server::Create(e, f.server);
  if (!srv.ok()) return Fail(srv.status());
  // What the KV store found at start-up (restored entries, removed leftovers, other
  // models' entries kept, files that are not Attic's).
  if (const store::KvStore* kv = (*srv)->kv_store(); kv != nullptr)
    Log(LogLevel::kInfo, "%s; entries hold %s K/V", store::FormatOpenReport(kv->open_report()).c_str(),
        store::KvDtypeName(kv->kv_dtype()));
  if (!f.kv_remote.empty())
    Log(LogLevel::kInfo, "KV store: remote tier %s (shared; this server's share %s, write-%s, reads time out after %d ms)",
        f.kv_remote.c_str(), FormatByteSize(f.kv_remote_bytes).c_str(), f.kv_remote_write.c_str(),
        f.kv_remote_timeout_ms);

  RaiseFileLimit();
  Status st = (*srv)->Start();
  if (!st.ok()) return Fail(st);
  const auto& pool = e.kv_pool();
  std::fprintf(stderr,
               "attic: serving '%s' (context %d tokens, %d tokens per step, up to %d running / %d waiting, "
               "KV %d blocks = %.0f MiB, %s, %s%s)\n",
               (*srv)->model_name().c_str(), e.context_length(), e.transformer().max_batch_tokens(),
               (*srv)->scheduler().options().max_running, (*srv)->scheduler().options().max_waiting, pool.n_blocks(),
               static_cast<double>(pool.mapped_bytes()) / (1 << 20),
               DescribeStore(f, dram_auto).c_str(), f.server.api_keys.empty() ? "no API keys" : "API keys required",
               e.options().deterministic ? ", deterministic" : "");
  live.store(srv->get());  // before "listening": a signal from then on stops the server gracefully
  std::fprintf(stderr, "attic: listening on http://%s:%d\n", f.server.host.c_str(), (*srv)->port());
  std::fflush(stderr);
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
  AddSizeOption(cmd, "--kv-budget", "--kv-budget-mib", 1 << 20, &f->kv_budget,
                "compute-buffer KV cache size (default 0 = room for --max-running full contexts, at most "
                "--kv-budget-cap)");
  AddSizeOption(cmd, "--kv-budget-cap", "--auto-kv-cap-mib", 1 << 20, &f->kv_budget_cap,
                "cap of the automatic KV cache size (default 2G)");
  cmd->add_option("--max-resident", s.scheduler.max_resident, "finished sequences whose KV stays resident for reuse")
      ->capture_default_str();
  cmd->add_option("--max-tokens-limit", s.max_tokens_limit, "cap on a request's max_tokens (0 = context window)")
      ->capture_default_str();
  cmd->add_option("--timeout", s.request_timeout_s, "per-request timeout in seconds")->capture_default_str();
  AddSizeOption(cmd, "--max-body", "--max-body-mib", 1 << 20, &f->max_body,
                "largest accepted request body (default 8M; larger: 413)");
  cmd->add_option("--http-threads", s.http_threads, "HTTP worker threads (0 = max-running + max-waiting + 16)")
      ->capture_default_str();
  AddSizeOption(cmd, "--kv-dram", "--kv-dram-bytes", 1, &f->kv_dram,
                "host-DRAM tier of the KV store: a size (faulted in at start-up), or 0 = none (and without "
                "--kv-ssd-dir no store); default: automatic, min(8G, physical memory / 4, available memory / 2), "
                "growing with use");
  cmd->add_option("--kv-ssd-dir", f->kv_ssd_dir,
                  "directory of the SSD tier of the KV store (survives restarts): a new or empty directory, or one "
                  "Attic made (its ATTIC_KV_STORE marker); entries of other models there are kept, never touched");
  AddSizeOption(cmd, "--kv-ssd", "--kv-ssd-bytes", 1, &f->kv_ssd, "SSD tier capacity (default 16G)");
  cmd->add_option("--kv-store-dtype", f->kv_store_dtype,
                  "type of the KV store's entries in every tier, and of offloaded sparse requests' blocks "
                  "(--sparse-offload-bytes): f32, f16, q8_0 (8-bit, one f16 scale per 32 "
                  "values of a head's row: ~0.27x f32's bytes, so a tier holds ~2x f16's entries) or q4_0 (4-bit, "
                  "the same groups: ~0.14x f32's bytes, ~3.6x f16's entries; per-token 4-bit K loses accuracy on "
                  "models with outlier channels, docs/store.md) or q8_0/q4_0 (K in q8_0, V in q4_0: ~2.5x f16's "
                  "entries) or kivi4 (K in 4 bits per channel over groups of 128 tokens, as KIVI, V in q4_0: ~3.5x "
                  "f16's entries, without per-token 4-bit K's loss); default: the compute buffer's (--kv-dtype; K "
                  "in q8_0 with V in q4_0: q8_0/q4_0; other "
                  "pairs of --kv-dtype-k and --kv-dtype-v: the more exact). Entries of another type are kept but "
                  "never served (a miss, counted in attic_kv_store_other_type_misses_total)")
      ->check(CLI::IsMember({"f32", "f16", "q8_0", "q4_0", "q8_0/q4_0", "kivi4"}));
  cmd->add_option("--kv-remote", f->kv_remote,
                  "shared remote tier of the KV store below DRAM/SSD: a Redis Cluster, redis://host:port[,host:port...] "
                  "(several servers on one cluster reuse each other's sessions; needs the DRAM tier)");
  AddSizeOption(cmd, "--kv-remote-bytes", "", 1, &f->kv_remote_bytes,
                "this server's share of the remote tier: its oldest writes beyond it are deleted; the cluster's "
                "maxmemory policy governs the rest (default 8G)");
  cmd->add_option("--kv-remote-write", f->kv_remote_write,
                  "through: every save is also written to the remote tier (other servers find it at once); back: "
                  "only entries demoted from DRAM/SSD go there")
      ->capture_default_str();
  cmd->add_option("--kv-remote-timeout", f->kv_remote_timeout_ms,
                  "milliseconds one remote call may take, retries included; then it is a miss")
      ->capture_default_str();
  cmd->add_option("--link", f->link,
                  "context caches: how a request links cached chunks when it names no method: attnlink-K (recompute K "
                  "tokens at each chunk boundary), cacheblend-RATIO[@LAYER], naive or full (docs/linking.md)")
      ->capture_default_str();
  cmd->add_option("--link-chunk-bos", f->link_chunk_bos,
                  "context caches: prefill each chunk after a BOS token (true) or from its first token (false)")
      ->capture_default_str();
  cmd->add_option("--sparse", f->sparse,
                  "sparse decoding (PQCache) for requests that name none: METHOD[-RATIO|-COUNT][@key=value,...] "
                  "with METHOD pq, oracle, streaming or h2o, e.g. pq-0.2 (attend to 1/5 of the context), "
                  "streaming-2048, pq-0.1@iters=8,min=2048, pq-0.1@offload=32 (the KV below the compute buffer, "
                  "a block cache of 32 blocks); full = off (docs/serving.md)")
      ->capture_default_str();
  AddSizeOption(cmd, "--sparse-offload-bytes", "", 1, &f->sparse_offload,
                "host memory for the KV of offloaded sparse requests (pre-RoPE f32; default 4G): a request waits "
                "until its context fits beside the running ones'");
  cmd->add_option("--kv-policy", f->kv_policy, "KV store eviction: scheduler-aware, lru or fifo")->capture_default_str();
  cmd->add_option("--session-ttl", f->session_ttl_s, "seconds a stored session lives (0 = forever)")
      ->capture_default_str();
  cmd->add_option("--kv-truncate-ratio", s.kv.truncate_ratio,
                  "with the KV store: on context overflow drop at least this ratio of the history in the "
                  "stored KV instead of rejecting (0 = off)")
      ->capture_default_str();
  cmd->add_option("--kv-truncate-keep", s.kv.truncate_keep_first,
                  "tokens at the start of a conversation never dropped by truncation")
      ->capture_default_str();
  cmd->add_option("--kv-truncate-mode", f->kv_truncate_mode,
                  "on context overflow: decoupled (reuse the kept tokens' stored KV at new positions) or recompute "
                  "(prefill the kept tokens again)")
      ->check(CLI::IsMember({"decoupled", "recompute"}))
      ->capture_default_str();
  cmd->add_option("--kv-preload", f->kv_preload,
                  "how stored KV enters the compute buffer: layerwise (a loader thread enters layer l+1 while layer "
                  "l computes), inline (the compute threads enter layer l just before computing it), sync (all "
                  "layers before the first step) or auto (layerwise when --threads leaves a CPU free, else inline)")
      ->check(CLI::IsMember({"auto", "layerwise", "inline", "sync"}))
      ->capture_default_str();
  cmd->add_option("--kv-read-buffer", f->kv_read_buffer,
                  "stored KV of waiting jobs fetched ahead of admission: a size, 0 = none, or auto = sized by S_buf "
                  "from measured rates")
      ->type_name("SIZE|auto")
      ->capture_default_str();
  cmd->add_option_function<int64_t>(
         "--kv-read-buffer-bytes",
         [f](int64_t v) { f->kv_read_buffer = v < 0 ? "auto" : std::to_string(v); }, "old spelling of --kv-read-buffer")
      ->group("");
  cmd->add_option("--log-level", f->log_level,
                  "debug (also request bodies), info (one access line per request), warn, error or off")
      ->capture_default_str();
  cmd->callback([run, f] { *run = [f] { return RunServe(*f); }; });
}

}  // namespace attic::cli
