// Server: Attic's OpenAI-compatible HTTP front end.
//
//   POST /v1/chat/completions   chat (JSON, or SSE when "stream": true)
//   POST /v1/completions        text completion (JSON or SSE)
//   GET  /v1/models             the served model
//   POST /tokenize, /detokenize  text or chat -> token ids, ids -> text (also under /v1)
//   GET  /health                liveness ({"status":"ok"})
//   GET  /metrics               Prometheus text
//   GET  /v1/sessions           the tenant's stored conversations (cursor-paginated list)
//   GET  /v1/sessions/{id}      stored KV of a conversation (tokens, bytes, tier, expiry)
//   DELETE /v1/sessions/{id}    erase a conversation's stored KV
//   /v1/context_caches          create, list, get, update (TTL), delete context caches:
//                               documents cached once, linked into any later prompt
//
// One step-loop thread owns the Engine (its Transformer and KV pool) through a
// Scheduler. HTTP handler threads only parse, authenticate, tokenize, submit to the
// scheduler's bounded queue and relay the request's ResultChannel to the client; they
// never touch engine state. A client that disconnects cancels its request.
//
// Logging: one access line per request at LogLevel::kInfo once its response is complete
// (method, path, status, a completion's token counts and TTFT, duration; never prompt
// text or keys), request bodies at kDebug (src/server/access_log.h).
//
// Tenancy: with API keys configured, the key identifies the tenant and resident KV is
// scoped to it; without keys every request belongs to the tenant "default".
//
// Thread-safety: Start/Stop/Wait may be called from any thread; Stop is idempotent.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attic/core/status.h"
#include "attic/engine/engine.h"
#include "attic/engine/kv_features.h"
#include "attic/engine/scheduler.h"
#include "attic/pic/link.h"
#include "attic/store/kv_store.h"
#include "attic/store/redis_tier.h"

namespace attic::server {

struct ServerOptions {
  std::string host = "127.0.0.1";   // listen address
  int port = 8080;                  // 0 = any free port (see port())
  std::vector<std::string> api_keys;  // empty = no authentication
  std::string model_name;           // id in /v1/models and responses ("" = model file/dir name)
  engine::SchedulerOptions scheduler;
  engine::KvFeatureOptions kv;      // the KV connector's planners (engine/kv_features.h)
  int64_t max_tokens_limit = 0;     // cap on max_tokens (0 = the context window)
  double request_timeout_s = 600;   // per request, from arrival to the last token
  size_t max_body_bytes = 8 << 20;  // larger request bodies get 413
  int http_threads = 0;             // 0 = max_running + max_waiting + 16
  int keep_alive_timeout_s = 5;     // idle keep-alive connections are closed after this
  // KV store (DRAM/SSD tiers, paper 001). Off unless enabled; store.fingerprint is
  // filled from the engine's model.
  bool kv_store = false;
  store::StoreOptions store;
  // A shared remote tier below DRAM (and SSD): a Redis Cluster (--kv-remote; off when
  // remote.url is empty). Turns the store on. docs/store.md "Remote tier".
  store::RedisTierOptions remote;
  int64_t store_expire_interval_ms = 1000;  // how often expired sessions (and context caches) are freed
  // Context caches (paper 002; need the KV store): the linking method a request gets
  // when it names none (--link), and whether chunks are prefilled after a BOS token
  // (--link-chunk-bos).
  pic::LinkOptions link;
  bool link_chunk_bos = true;
  // The memory budget `attic serve` computed from its configuration (name, bytes): the
  // weights, the KV pool, the store's DRAM tier and write buffer, the sparse-offload tier
  // and a fixed overhead (docs/serving.md, "Memory budget"). /metrics reports the sum as
  // attic_memory_budget_bytes and each part as attic_memory_budget_part_bytes{part}.
  std::vector<std::pair<std::string, uint64_t>> memory_budget;
};

class Server {
 public:
  // `engine` must outlive the server. InvalidArgument for bad options.
  static StatusOr<std::unique_ptr<Server>> Create(engine::Engine& engine, const ServerOptions& options);
  ~Server();

  // Binds and starts serving (HTTP threads and the step loop); returns once listening.
  // Unavailable if the address cannot be bound.
  Status Start();
  // The bound port (after Start).
  int port() const { return port_; }
  const std::string& model_name() const { return model_name_; }
  // Blocks until Stop().
  void Wait();
  // Stops accepting, fails queued and running requests, joins every thread.
  void Stop();

  engine::Scheduler& scheduler();
  // Null when the KV store is off.
  store::KvStore* kv_store();

 private:
  struct Impl;
  Server() = default;
  std::unique_ptr<Impl> impl_;
  std::string model_name_;
  int port_ = 0;
};

}  // namespace attic::server
