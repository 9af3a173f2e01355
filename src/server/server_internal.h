// Internal: the Server's state, shared by server.cc (setup, route table, auth, step loop),
// completion_handler.cc (the two completion endpoints), messages_handler.cc (the
// Anthropic Messages API), tokenize_handler.cc and context_cache_handler.cc.
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
#include <variant>
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

  // Registers every route of the table (Routes()), then SetupHttpHooks().
  void SetupRoutes();
  void SetupHttpHooks();  // the error, exception and pre-routing handlers, the access logger
  void StepLoop();
  void SweepLoop();
  void WakeSweep();  // after `stopping` is set: SweepLoop returns
  // Tenant of the request, or a 401.
  std::optional<ApiError> Authenticate(const httplib::Request& req, std::string* tenant) const;
  // Tenant of the request; nullopt once a 401 is sent.
  std::optional<std::string> AuthenticatedTenant(const httplib::Request& req, httplib::Response& res) const;
  void SendError(httplib::Response& res, const ApiError& error) const;
  // SendError in the shape of the request's API (Anthropic's on /v1/messages).
  void SendErrorFor(const httplib::Request& req, httplib::Response& res, const ApiError& error) const;

  // The route table: one row per route, registered in its order (httplib takes the
  // first pattern of a method that matches). A row's handler is a member of Impl, with
  // the request body (read by WithBody) or without.
  enum class Method { kGet, kPost, kPatch, kDelete };
  using PlainHandler = void (Impl::*)(const httplib::Request&, httplib::Response&);
  using BodyHandler = void (Impl::*)(const httplib::Request&, const std::string&, httplib::Response&);
  struct Route {
    Method method;
    std::string path;  // an httplib pattern: a regex where it has a capture group
    std::variant<PlainHandler, BodyHandler> handler;
  };
  std::vector<Route> Routes();
  std::vector<Route> ContextCacheRoutes();  // context_cache_handler.cc
  void AddRoute(const Route& route);
  // A body handler as an httplib route: the body is read through a content reader under
  // the body size limit (413 past it), logged, then handed to the handler.
  httplib::Server::HandlerWithContentReader WithBody(BodyHandler handler);

  // POST /v1/chat/completions and /v1/completions (completion_handler.cc).
  void HandleCompletion(ApiKind kind, const httplib::Request& req, const std::string& body, httplib::Response& res);
  void HandleChatCompletions(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void HandleCompletions(const httplib::Request& req, const std::string& body, httplib::Response& res);
  // POST /v1/messages, the Anthropic Messages API (messages_handler.cc).
  void HandleMessages(const httplib::Request& req, const std::string& body, httplib::Response& res);
  // POST /tokenize and /detokenize (tokenize_handler.cc).
  void HandleTokenize(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void HandleDetokenize(const httplib::Request& req, const std::string& body, httplib::Response& res);
  // GET /v1/models, /v1/models/{id}, /health, /metrics.
  void HandleListModels(const httplib::Request& req, httplib::Response& res);
  void HandleGetModel(const httplib::Request& req, httplib::Response& res);
  void HandleHealth(const httplib::Request& req, httplib::Response& res);
  void HandleMetrics(const httplib::Request& req, httplib::Response& res);
  nlohmann::json ModelObject() const;
  // Stored conversations, tenant-scoped: GET /v1/sessions/{id}, GET /v1/sessions,
  // DELETE /v1/sessions/{id}.
  void HandleGetSession(const httplib::Request& req, httplib::Response& res);
  void HandleListSessions(const httplib::Request& req, httplib::Response& res);
  void HandleDeleteSession(const httplib::Request& req, httplib::Response& res);
  nlohmann::json SessionObject(const store::SessionInfo& info) const;
  // 404 for a session `id` the store does not hold (or with the store off); 500 for
  // another failure `st` of the store.
  void SendSessionError(httplib::Response& res, const std::string& id, const Status& st) const;
  // Tenant of a request for stored session `id`; nullopt once a 401 is sent, or the 404
  // for a session no store holds (the store off, or a context cache's chunk).
  std::optional<std::string> SessionTenant(const httplib::Request& req, httplib::Response& res,
                                           const std::string& id) const;
  // The context caches (context_cache_handler.cc): POST and GET /v1/context_caches,
  // GET, PATCH and DELETE /v1/context_caches/{id}.
  void HandleCreateContextCache(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void HandleListContextCaches(const httplib::Request& req, httplib::Response& res);
  void HandleGetContextCache(const httplib::Request& req, httplib::Response& res);
  void HandleUpdateContextCache(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void HandleDeleteContextCache(const httplib::Request& req, httplib::Response& res);
  // Tenant of a context-cache request; nullopt once a 401 is sent or, when `available`
  // is false (no KV store), the 404 context_caches_unavailable.
  std::optional<std::string> ContextCacheTenant(const httplib::Request& req, httplib::Response& res,
                                                bool available) const;
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
