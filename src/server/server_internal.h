// Internal: the Server's state, shared by server.cc (setup, routes, auth, step loop),
// completion_handler.cc (the two completion endpoints), messages_handler.cc (the
// Anthropic Messages API) and tokenize_handler.cc.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attic/pic/registry.h"
#include "attic/server/context_caches.h"
#include "attic/server/metrics.h"
#include "attic/server/openai_api.h"
#include "attic/server/server.h"
#include "server/http_transport.h"

namespace attic::server {

// 404 for a `model` other than the served one.
ApiError ModelNotFound(const std::string& model);

struct Server::Impl {
  Impl(engine::Engine& e, const ServerOptions& o) : engine(e), options(o) {}

  engine::Engine& engine;
  ServerOptions options;
  std::string model_name;
  std::string system_fingerprint;
  int64_t created = 0;
  std::unique_ptr<store::KvStore> store;  // outlives the scheduler that uses it
  std::unique_ptr<engine::Scheduler> scheduler;
  // Context caches (with the KV store): the registry (persisted beside an SSD tier) and
  // the service that prefills, links and sweeps them.
  std::unique_ptr<pic::ContextCacheRegistry> registry;
  std::unique_ptr<ContextCacheService> caches;
  Metrics metrics;
  HttpTransport http;
  std::thread step_thread;
  std::thread http_thread;
  // Drops expired context caches and erases their chunks' KV every
  // store_expire_interval_ms: off the step loop, since the shared registry's sweep asks
  // the cluster (a slow one must not stall decoding).
  std::thread sweep_thread;
  std::mutex sweep_mu;
  std::condition_variable sweep_cv;
  std::atomic<bool> stopping{false};
  std::mutex state_mu;
  std::condition_variable state_cv;
  bool started = false;
  bool stopped = false;

  // Longest byte string of any token: a text longer than context * this cannot fit.
  size_t max_token_bytes = 1;
  // API key -> tenant id ("key-" + hash prefix; keys never appear in logs or metrics).
  std::vector<std::pair<std::string, std::string>> tenants;

  // The tokenizer's vocabulary for constrained decoding (response_format), built once.
  std::once_flag grammar_vocab_once;
  std::shared_ptr<const grammar::Vocabulary> grammar_vocab;
  std::shared_ptr<const grammar::Vocabulary> GrammarVocab();

  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};

  void SetupRoutes();
  void StepLoop();
  void SweepLoop();
  void WakeSweep();  // after `stopping` is set: SweepLoop returns
  // Tenant of the request, or a 401.
  std::optional<ApiError> Authenticate(const httplib::Request& req, std::string* tenant) const;
  void SendError(httplib::Response& res, const ApiError& error) const;
  // SendError in the shape of the request's API (Anthropic's on /v1/messages).
  void SendErrorFor(const httplib::Request& req, httplib::Response& res, const ApiError& error) const;
  void HandleCompletion(ApiKind kind, const httplib::Request& req, const std::string& body, httplib::Response& res);
  // POST /v1/messages, the Anthropic Messages API (messages_handler.cc).
  void HandleMessages(const httplib::Request& req, const std::string& body, httplib::Response& res);
  // POST /tokenize and /detokenize (tokenize_handler.cc).
  void HandleTokenize(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void HandleDetokenize(const httplib::Request& req, const std::string& body, httplib::Response& res);
  // A handler of a request body (read under the body size limit) as an httplib route.
  using BodyHandler = std::function<void(const httplib::Request&, const std::string&, httplib::Response&)>;
  using BodyRoute = std::function<httplib::Server::HandlerWithContentReader(BodyHandler)>;
  // POST/GET/PATCH/DELETE /v1/context_caches (context_cache_handler.cc).
  void SetupContextCacheRoutes(const BodyRoute& with_body);
  // A validated request's prompt: its token ids and, with context-cache parts, the link
  // spec of its cached chunks (their KV prefilled again first where it went missing) and
  // its implicitly cached texts (kept alive once the request is submitted).
  struct BuiltPrompt {
    std::vector<int32_t> ids;
    std::shared_ptr<const pic::LinkSpec> link;
    std::vector<std::pair<std::vector<int32_t>, int64_t>> implicit;  // tokens, TTL (ms)
    LinkPrep prep;
  };
  StatusOr<BuiltPrompt> BuildPrompt(const ApiRequest& r, const std::string& tenant,
                                    engine::SchedClock::time_point deadline);
  // Sampling parameters of a validated request.
  engine::SamplingParams Sampling(const ApiRequest& r);
  std::string NewId(const char* prefix);
};

}  // namespace attic::server
