// Server setup: options, routes, authentication, the step loop, start and stop.
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <thread>
#include <csignal>
#include <functional>
#include <stdexcept>
#include <type_traits>
#include <variant>

#include "attic/attention/kv_q4.h"
#include "attic/attention/kv_q8.h"
#include "attic/core/file.h"
#include "attic/core/hash.h"
#include "attic/core/log.h"
#include "attic/pic/shared_registry.h"
#include "attic/server/anthropic_api.h"
#include "attic/store/tier.h"
#include "attic/core/thread_name.h"
#include "server/access_log.h"
#include "server/server_internal.h"

namespace attic::server {

namespace {

using json = nlohmann::json;

// GET /v1/sessions page size: OpenAI's list endpoints' default and maximum.
constexpr int kDefaultSessionListLimit = 20;
constexpr int kMaxSessionListLimit = 100;

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  size_t slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  return name.empty() ? "attic" : name;
}

// Compares a presented key with a configured one in time that depends only on the
// configured key's length.
bool ConstantTimeEquals(const std::string& presented, const std::string& key) {
  if (key.empty()) return false;
  unsigned diff = presented.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < key.size(); ++i) {
    unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= p ^ static_cast<unsigned char>(key[i]);
  }
  return diff == 0;
}

// Metric label for a path: known routes only, so label values stay bounded.
std::string EndpointLabel(const std::string& path) {
  for (const char* known : {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/models", "/v1/sessions",
                            "/v1/context_caches", "/health", "/metrics", "/tokenize", "/detokenize", "/v1/tokenize",
                            "/v1/detokenize"}) {
    if (path == known) return known;
  }
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (path.rfind("/v1/sessions/", 0) == 0) return "/v1/sessions/{id}";
  if (path.rfind("/v1/context_caches/", 0) == 0) return "/v1/context_caches/{id}";
  return "other";
}

}  // namespace

StatusOr<std::unique_ptr<Server>> Server::Create(engine::Engine& engine, const ServerOptions& options) {
  if (options.port < 0 || options.port > 65535) return InvalidArgumentError("port must be in [0, 65535]");
  if (!(options.request_timeout_s > 0)) return InvalidArgumentError("request timeout must be positive");
  if (options.max_body_bytes < 1024) return InvalidArgumentError("max body size must be at least 1024 bytes");
  if (options.scheduler.max_running < 1) return InvalidArgumentError("max running sequences must be >= 1");
  if (options.scheduler.max_waiting < 0) return InvalidArgumentError("max waiting requests must be >= 0");
  for (const auto& k : options.api_keys) {
    if (k.empty()) return InvalidArgumentError("API keys must not be empty");
  }
  std::unique_ptr<Server> s(new Server());
  s->impl_ = std::make_unique<Impl>(engine, options);
  Impl& im = *s->impl_;
  im.model_name = options.model_name.empty() ? BaseName(engine.model().path()) : options.model_name;
  s->model_name_ = im.model_name;
  im.system_fingerprint = "fp_attic_" + engine.model().fingerprint().substr(0, 12);
  im.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (options.kv.sparse != nullptr)
    ATTIC_RETURN_IF_ERROR(options.kv.sparse->Validate(engine.model().config().head_dim).WithContext("--sparse"));
  engine::SchedulerOptions so = options.scheduler;
  so.kv_connector = engine::KvFeatures(options.kv);
  im.scheduler = std::make_unique<engine::Scheduler>(engine, so);
  im.scheduler->set_observer([&im](const engine::RequestRecord& r) { im.metrics.Observe(r); });
  if (options.kv_store) {
    store::StoreOptions so = options.store;
    so.fingerprint = engine.model().fingerprint();
    // Context caches are created on one instance and linked on any: their chunks' KV
    // goes to the shared tier at once, whatever the write policy.
    if (!options.remote.url.empty()) so.write_through_session_prefix = pic::kChunkStoreSessionPrefix;
    const int head_dim = engine.model().config().head_dim;
    const bool q4 = store::KvTensorDtype(so.kv_dtype, true) == store::KvDtype::kQ4_0;
    if (store::KvDtypeQuantized(so.kv_dtype) && !q4 && !attention::KvQ8Supports(head_dim))
      return InvalidArgumentError("--kv-store-dtype q8_0 needs head_dim below 32 or a multiple of 32; this model's is " +
                                  std::to_string(head_dim));
    if (q4 && !attention::KvQ4Supports(head_dim))
      return InvalidArgumentError(std::string("--kv-store-dtype ") + store::KvDtypeName(so.kv_dtype) +
                                  " needs an even head_dim below 32 or a multiple of 32; this model's is " +
                                  std::to_string(head_dim));
    auto tiers = store::KvStore::LocalTiers(so);
    if (!tiers.ok()) return tiers.status().WithContext("KV store");
    if (!options.remote.url.empty()) {  // the shared remote tier, below DRAM and SSD
      auto remote = store::RedisTier::Open(options.remote);
      if (!remote.ok()) return remote.status().WithContext("--kv-remote");
      tiers->push_back(std::move(*remote));
    }
    auto st = store::KvStore::Open(so, std::move(*tiers), nullptr);
    if (!st.ok()) return st.status().WithContext("KV store");
    im.store = std::move(*st);
    im.scheduler->set_store(im.store.get());
    if (!options.remote.url.empty()) {
      // Context caches shared by every instance on the cluster (docs/serving.md).
      pic::SharedRegistryOptions ro;
      ro.url = options.remote.url;
      ro.prefix = options.remote.prefix;
      ro.scope = so.fingerprint;
      ro.connect_timeout = options.remote.connect_timeout;
      ro.command_timeout = options.remote.command_timeout;
      ro.retry_budget = options.remote.retry_budget;
      auto reg = pic::SharedContextCacheRegistry::Open(ro);
      if (!reg.ok()) return reg.status().WithContext("--kv-remote: context-cache registry");
      im.registry = std::move(*reg);
    } else {
      // Context caches: the registry persists beside the SSD tier (restart), else in memory.
      const std::string dir = so.ssd_dir.empty() ? "" : JoinPath(so.ssd_dir, store::SsdTier::kContextCacheDirName);
      auto reg = pic::ContextCacheRegistry::Open(dir);
      if (!reg.ok()) return reg.status().WithContext("context-cache registry");
      im.registry = std::move(*reg);
    }
    ContextCacheOptions co;
    co.model = im.model_name;
    co.chunk_bos = options.link_chunk_bos;
    co.link = options.link;
    ATTIC_RETURN_IF_ERROR(co.link.Validate(engine.model().config().n_layers).WithContext("--link"));
    im.caches = std::make_unique<ContextCacheService>(engine, *im.scheduler, *im.store, *im.registry, co);
  }
  const auto& tok = engine.tokenizer();
  for (int id = 0; id < tok.vocab_size(); ++id) im.max_token_bytes = std::max(im.max_token_bytes, tok.TokenText(id).size());
  for (const auto& k : options.api_keys) {
    Hasher h;
    h.Update(k);
    im.tenants.emplace_back(k, "key-" + h.Hex().substr(0, 16));
  }
  im.SetupRoutes();
  return s;
}

Server::~Server() { Stop(); }

engine::Scheduler& Server::scheduler() { return *impl_->scheduler; }
store::KvStore* Server::kv_store() { return impl_->store.get(); }

Status Server::Start() {
  Impl& im = *impl_;
  {
    std::lock_guard<std::mutex> lock(im.state_mu);
    if (im.started) return FailedPreconditionError("server already started");
  }
  const auto& o = im.options;
  int threads = o.http_threads > 0 ? o.http_threads : o.scheduler.max_running + o.scheduler.max_waiting + 16;
  im.http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  im.http.set_payload_max_length(o.max_body_bytes);
  im.http.set_keep_alive_max_count(1000);
  im.http.set_keep_alive_timeout(o.keep_alive_timeout_s);
  im.http.set_read_timeout(5, 0);
  im.http.set_write_timeout(10, 0);
  im.http.set_tcp_nodelay(true);
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half the connections (and their sessions): bind exclusively, with
  // SO_REUSEADDR only so a restart can reuse a port left in TIME_WAIT.
  im.http.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  int port = o.port;
  if (port == 0) {
    port = im.http.bind_to_any_port(o.host);
    if (port <= 0) return UnavailableError("cannot listen on " + o.host + " (any port)");
  } else if (!im.http.bind_to_port(o.host, port)) {
    return UnavailableError("cannot listen on " + o.host + ":" + std::to_string(port) +
                            " (address in use or not available)");
  }
  port_ = port;
  im.http.SetListenBacklog(1024);
  {
    std::lock_guard<std::mutex> lock(im.state_mu);
    im.started = true;
  }
  im.step_thread = StartNamedThread("attic-step", [&im] { im.StepLoop(); });
  if (im.caches != nullptr) im.sweep_thread = StartNamedThread("attic-sweep", [&im] { im.SweepLoop(); });
  // The HTTP request workers, started by this thread, inherit its name.
  im.http_thread = StartNamedThread("attic-http", [&im] { im.http.listen_after_bind(); });
  // Listening for real before this returns: httplib's stop() does nothing until its
  // accept loop runs, so a Stop() right after Start() (a signal as the server comes up)
  // would otherwise leave the loop running and Stop() joining it forever.
  for (int waited_ms = 0; !im.http.is_running(); ++waited_ms) {
    if (waited_ms == 10000) return InternalError("the HTTP listener did not start");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return OkStatus();
}

void Server::Wait() {
  Impl& im = *impl_;
  std::unique_lock<std::mutex> lock(im.state_mu);
  im.state_cv.wait(lock, [&im] { return im.stopped; });
}

void Server::Stop() {
  if (!impl_) return;
  Impl& im = *impl_;
  {
    std::lock_guard<std::mutex> lock(im.state_mu);
    if (im.stopped) return;
    if (!im.started) {
      im.stopped = true;
      im.state_cv.notify_all();
      return;
    }
  }
  // The step loop fails every queued and running request (their handlers then return),
  // then the HTTP side stops accepting and joins its threads.
  im.stopping.store(true);
  if (im.step_thread.joinable()) im.step_thread.join();
  im.WakeSweep();
  if (im.sweep_thread.joinable()) im.sweep_thread.join();
  im.http.stop();
  if (im.http_thread.joinable()) im.http_thread.join();
  // What DRAM holds goes down to the SSD tier, so that the next start finds it (with
  // no SSD tier nothing happens: DRAM goes with the process). docs/store.md, "Restart".
  if (im.store != nullptr) {
    const auto started = std::chrono::steady_clock::now();
    const store::KvStore::PersistReport r = im.store->PersistDram();
    if (r.entries + r.dropped > 0)
      Log(LogLevel::kInfo, "KV store: moved %llu %s from DRAM to SSD for the next start (%.1f MiB written, %.1f s)%s",
          static_cast<unsigned long long>(r.entries), r.entries == 1 ? "entry" : "entries",
          static_cast<double>(r.bytes_written) / (1 << 20),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
          r.dropped > 0 ? ("; " + std::to_string(r.dropped) + " did not fit the SSD tier").c_str() : "");
  }
  std::lock_guard<std::mutex> lock(im.state_mu);
  im.stopped = true;
  im.state_cv.notify_all();
}

void Server::Impl::StepLoop() {
  auto next_expiry = std::chrono::steady_clock::now();
  while (!stopping.load()) {
    if (store != nullptr && std::chrono::steady_clock::now() >= next_expiry) {
      store->ExpireNow();
      next_expiry = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.store_expire_interval_ms);
    }
    if (!scheduler->WaitForWork(std::chrono::milliseconds(50))) continue;
    scheduler->Step();
  }
  scheduler->Shutdown();
}

void Server::Impl::SweepLoop() {
  std::unique_lock<std::mutex> lock(sweep_mu);
  while (!stopping.load()) {
    lock.unlock();
    caches->Sweep();
    lock.lock();
    sweep_cv.wait_for(lock, std::chrono::milliseconds(options.store_expire_interval_ms),
                      [this] { return stopping.load(); });
  }
}

void Server::Impl::WakeSweep() {
  std::lock_guard<std::mutex> lock(sweep_mu);
  sweep_cv.notify_all();
}

std::optional<ApiError> Server::Impl::Authenticate(const httplib::Request& req, std::string* tenant) const {
  if (tenants.empty()) {
    *tenant = "default";
    return std::nullopt;
  }
  ApiError e;
  e.http_status = 401;
  std::string auth = req.get_header_value("Authorization");
  std::string key;
  if (auth.empty() && req.has_header("X-Api-Key")) {
    key = req.get_header_value("X-Api-Key");  // Anthropic's clients send the key so
  } else if (auth.size() < 7 || (auth.compare(0, 7, "Bearer ") != 0 && auth.compare(0, 7, "bearer ") != 0)) {
    e.message = "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY' (or 'X-Api-Key: YOUR_KEY').";
    e.code = "invalid_api_key";
    return e;
  } else {
    key = auth.substr(7);
  }
  while (!key.empty() && key.front() == ' ') key.erase(0, 1);
  while (!key.empty() && key.back() == ' ') key.pop_back();
  const std::string* found = nullptr;
  for (const auto& [k, t] : tenants) {
    if (ConstantTimeEquals(key, k)) found = &t;
  }
  if (found == nullptr) {
    e.message = "Incorrect API key provided.";
    e.code = "invalid_api_key";
    return e;
  }
  *tenant = *found;
  return std::nullopt;
}

void Server::Impl::SendError(httplib::Response& res, const ApiError& error) const {
  res.status = error.http_status;
  if (error.http_status == 429 || error.http_status == 503) res.set_header("Retry-After", "1");
  res.set_content(ErrorJson(error), "application/json");
}

void Server::Impl::SendErrorFor(const httplib::Request& req, httplib::Response& res, const ApiError& error) const {
  if (req.path != "/v1/messages") return SendError(res, error);
  SendError(res, error);  // status and headers
  res.set_content(AnthropicErrorJson(error), "application/json");
}

std::string Server::Impl::NewId(const char* prefix) {
  uint64_t a, b;
  {
    std::lock_guard<std::mutex> lock(rng_mu);
    a = rng();
    b = rng();
  }
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx%08llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b & 0xffffffffull));
  return std::string(prefix) + buf;
}

std::vector<Server::Impl::Route> Server::Impl::Routes() {
  std::vector<Route> routes = ContextCacheRoutes();
  routes.insert(routes.end(), {
      {Method::kPost, "/v1/chat/completions", &Impl::HandleChatCompletions},
      {Method::kPost, "/v1/completions", &Impl::HandleCompletions},
      {Method::kPost, "/v1/messages", &Impl::HandleMessages},
  });
  // vLLM serves these at the root; the /v1 copies let clients whose base URL ends in /v1
  // (the openai client's) reach them too.
  for (const char* prefix : {"", "/v1"}) {
    routes.push_back({Method::kPost, std::string(prefix) + "/tokenize", &Impl::HandleTokenize});
    routes.push_back({Method::kPost, std::string(prefix) + "/detokenize", &Impl::HandleDetokenize});
  }
  routes.insert(routes.end(), {
      {Method::kGet, "/v1/models", &Impl::HandleListModels},
      {Method::kGet, R"(/v1/models/(.+))", &Impl::HandleGetModel},
      {Method::kGet, "/health", &Impl::HandleHealth},
      {Method::kGet, "/metrics", &Impl::HandleMetrics},
      {Method::kGet, R"(/v1/sessions/(.+))", &Impl::HandleGetSession},
      {Method::kGet, "/v1/sessions", &Impl::HandleListSessions},
      {Method::kDelete, R"(/v1/sessions/(.+))", &Impl::HandleDeleteSession},
  });
  return routes;
}

void Server::Impl::SetupRoutes() {
  for (const Route& route : Routes()) AddRoute(route);
  SetupHttpHooks();
}

void Server::Impl::AddRoute(const Route& route) {
  // Registers `handler` (an httplib handler, with a content reader or without). httplib
  // reads no body of a GET request: a body route for GET is a mistake in the table.
  auto add = [this, &route](auto handler) {
    using H = decltype(handler);
    switch (route.method) {
      case Method::kGet:
        if constexpr (std::is_same_v<H, httplib::Server::Handler>) {
          http.Get(route.path, std::move(handler));
          return;
        }
        throw std::logic_error("GET " + route.path + ": httplib reads no body of a GET request");
      case Method::kPost:
        http.Post(route.path, std::move(handler));
        return;
      case Method::kPatch:
        http.Patch(route.path, std::move(handler));
        return;
      case Method::kDelete:
        http.Delete(route.path, std::move(handler));
        return;
    }
  };
  if (const BodyHandler* body_handler = std::get_if<BodyHandler>(&route.handler)) return add(WithBody(*body_handler));
  add(httplib::Server::Handler([this, member = std::get<PlainHandler>(route.handler)](const httplib::Request& req,
                                                                                     httplib::Response& res) {
    (this->*member)(req, res);
  }));
}

// Bodies are read through a content reader so that the size limit also holds for
// chunked uploads (httplib 0.11 enforces it only for Content-Length bodies).
httplib::Server::HandlerWithContentReader Server::Impl::WithBody(BodyHandler handler) {
  return [this, handler](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    std::string body;
    bool too_big = false;
    bool ok = reader([&](const char* data, size_t n) {
      if (body.size() + n > options.max_body_bytes) {
        too_big = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    if (too_big || res.status == 413) {
      ApiError e;
      e.http_status = 413;
      e.message = "The request body is larger than " + std::to_string(options.max_body_bytes) + " bytes";
      e.code = "request_too_large";
      res.set_header("Connection", "close");
      HttpTransport::CloseAfterResponse();
      return SendErrorFor(req, res, e);
    }
    if (!ok) {
      ApiError e;
      e.message = "could not read the request body";
      res.set_header("Connection", "close");
      HttpTransport::CloseAfterResponse();
      return SendErrorFor(req, res, e);
    }
    LogRequestBody(req, body);
    (this->*handler)(req, body, res);
  };
}

std::optional<std::string> Server::Impl::AuthenticatedTenant(const httplib::Request& req,
                                                             httplib::Response& res) const {
  std::string tenant;
  if (auto e = Authenticate(req, &tenant)) {
    SendError(res, *e);
    return std::nullopt;
  }
  return tenant;
}

void Server::Impl::HandleChatCompletions(const httplib::Request& req, const std::string& body,
                                         httplib::Response& res) {
  HandleCompletion(ApiKind::kChat, req, body, res);
}

void Server::Impl::HandleCompletions(const httplib::Request& req, const std::string& body, httplib::Response& res) {
  HandleCompletion(ApiKind::kCompletion, req, body, res);
}

json Server::Impl::ModelObject() const {
  return json{{"id", model_name},
              {"object", "model"},
              {"created", created},
              {"owned_by", "attic"},
              {"context_length", engine.context_length()}};
}

void Server::Impl::HandleListModels(const httplib::Request& req, httplib::Response& res) {
  if (!AuthenticatedTenant(req, res)) return;
  json j{{"object", "list"}, {"data", json::array({ModelObject()})}};
  res.set_content(j.dump(), "application/json");
}

void Server::Impl::HandleGetModel(const httplib::Request& req, httplib::Response& res) {
  if (!AuthenticatedTenant(req, res)) return;
  if (req.matches[1] != model_name) {
    ApiError e;
    e.http_status = 404;
    e.message = "The model '" + std::string(req.matches[1]) + "' does not exist";
    e.param = "model";
    e.code = "model_not_found";
    return SendError(res, e);
  }
  res.set_content(ModelObject().dump(), "application/json");
}

void Server::Impl::HandleHealth(const httplib::Request&, httplib::Response& res) {
  res.set_content(R"({"status":"ok"})", "application/json");
}

void Server::Impl::HandleMetrics(const httplib::Request&, httplib::Response& res) {
  std::string text = metrics.Render(scheduler->Stats());
  if (store != nullptr) text += RenderStoreMetrics(store->Stats());
  if (!options.memory_budget.empty()) {
    uint64_t sum = 0;
    std::string parts;
    for (const auto& [name, bytes] : options.memory_budget) {
      sum += bytes;
      parts += "attic_memory_budget_part_bytes{part=\"" + name + "\"} " + std::to_string(bytes) + "\n";
    }
    text += "# HELP attic_memory_budget_bytes What the configuration lets the server hold: weights, KV pool, "
            "store DRAM tier and write buffer, sparse-offload tier, fixed overhead.\n"
            "# TYPE attic_memory_budget_bytes gauge\nattic_memory_budget_bytes " +
            std::to_string(sum) +
            "\n# HELP attic_memory_budget_part_bytes Each part of attic_memory_budget_bytes.\n"
            "# TYPE attic_memory_budget_part_bytes gauge\n" + parts;
  }
  res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
}

void Server::Impl::SendSessionError(httplib::Response& res, const std::string& id, const Status& st) const {
  ApiError e;
  e.http_status = 404;
  e.message = store == nullptr ? "the KV store is not enabled on this server" : "No stored session '" + id + "'";
  e.code = "session_not_found";
  if (store != nullptr && st.code() != StatusCode::kNotFound) {
    e.http_status = 500;
    e.type = "server_error";
    e.message = st.message();
  }
  SendError(res, e);
}

json Server::Impl::SessionObject(const store::SessionInfo& info) const {
  return json{{"id", info.session_id},
              {"object", "session"},
              {"tokens", info.n_tokens},
              {"bytes", info.bytes},
              {"tier", store != nullptr ? store->tier_name(info.tier) : store::TierName(info.tier)},
              {"expires_at", info.expires_at_ms == 0 ? json(nullptr) : json(info.expires_at_ms / 1000)}};
}

std::optional<std::string> Server::Impl::SessionTenant(const httplib::Request& req, httplib::Response& res,
                                                       const std::string& id) const {
  auto tenant = AuthenticatedTenant(req, res);
  if (!tenant) return std::nullopt;
  // With the store off, or a context cache's chunk: no session of the tenant's.
  if (store == nullptr || pic::IsChunkStoreSession(id)) {
    SendSessionError(res, id, NotFoundError(""));
    return std::nullopt;
  }
  return tenant;
}

void Server::Impl::HandleGetSession(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  auto tenant = SessionTenant(req, res, id);
  if (!tenant) return;
  auto info = store->GetSession(*tenant, id);
  if (!info.ok()) return SendSessionError(res, id, info.status());
  res.set_content(SessionObject(*info).dump(), "application/json");
}

// GET /v1/sessions?limit=N&after=ID: OpenAI's cursor-paginated list object, ordered by
// session id. `after` is a position in that order, not a reference: it need not name a
// stored session, so a session that expires or is deleted between pages does not break
// the iteration. With the store off the list is empty.
void Server::Impl::HandleListSessions(const httplib::Request& req, httplib::Response& res) {
  auto tenant = AuthenticatedTenant(req, res);
  if (!tenant) return;
  ApiError invalid;
  invalid.code = "invalid_value";
  int limit = kDefaultSessionListLimit;
  if (req.has_param("limit")) {
    const std::string v = req.get_param_value("limit");
    const bool digits = !v.empty() && v.size() <= 3 && v.find_first_not_of("0123456789") == std::string::npos;
    limit = digits ? std::stoi(v) : 0;
    if (limit < 1 || limit > kMaxSessionListLimit) {
      invalid.param = "limit";
      invalid.message = "'limit' must be an integer between 1 and " + std::to_string(kMaxSessionListLimit);
      return SendError(res, invalid);
    }
  }
  const std::string after = req.get_param_value("after");
  if (after.size() > kMaxSessionIdBytes) {
    invalid.param = "after";
    invalid.message = "'after' is longer than " + std::to_string(kMaxSessionIdBytes) + " bytes";
    return SendError(res, invalid);
  }
  std::vector<store::SessionInfo> sessions;
  if (store != nullptr) sessions = store->ListSessions(*tenant);
  std::erase_if(sessions, [](const store::SessionInfo& s) { return pic::IsChunkStoreSession(s.session_id); });
  auto first = after.empty() ? sessions.begin()
                             : std::upper_bound(sessions.begin(), sessions.end(), after,
                                                [](const std::string& a, const store::SessionInfo& s) {
                                                  return a < s.session_id;
                                                });
  const auto left = static_cast<size_t>(sessions.end() - first);
  const auto n = std::min(left, static_cast<size_t>(limit));
  json data = json::array();
  for (auto it = first; it != first + static_cast<std::ptrdiff_t>(n); ++it) data.push_back(SessionObject(*it));
  json j{{"object", "list"},
         {"data", data},
         {"first_id", n == 0 ? json(nullptr) : json(first->session_id)},
         {"last_id", n == 0 ? json(nullptr) : json((first + static_cast<std::ptrdiff_t>(n) - 1)->session_id)},
         {"has_more", left > n}};
  res.set_content(j.dump(), "application/json");
}

void Server::Impl::HandleDeleteSession(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  auto tenant = SessionTenant(req, res, id);
  if (!tenant) return;
  Status st = store->EraseSession(*tenant, id);
  if (!st.ok()) return SendSessionError(res, id, st);
  res.set_content(json{{"id", id}, {"object", "session.deleted"}, {"deleted", true}}.dump(), "application/json");
}

void Server::Impl::SetupHttpHooks() {
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                      httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Handled;
    // An error httplib produced itself. Anything but an unknown route means the request
    // could not be parsed: close the connection rather than parse what follows.
    if (res.status != 404) HttpTransport::CloseAfterResponse();
    ApiError e;
    e.http_status = res.status;
    switch (res.status) {
      case 404:
        e.message = "Invalid URL (" + req.method + " " + req.path + ")";
        e.code = "unknown_url";
        break;
      case 405:
        e.message = "Method not allowed (" + req.method + " " + req.path + ")";
        break;
      case 413:
        e.message = "The request body is larger than " + std::to_string(options.max_body_bytes) + " bytes";
        e.code = "request_too_large";
        break;
      case 414:
        e.message = "The request URI is too long";
        break;
      case 400:
        e.message = "Malformed HTTP request";
        break;
      default:
        e.message = "HTTP error " + std::to_string(res.status);
        if (res.status >= 500) e.type = "server_error";
    }
    res.set_content(req.path == "/v1/messages" ? AnthropicErrorJson(e) : ErrorJson(e), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    ApiError e;
    e.http_status = 500;
    e.type = "server_error";
    e.message = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      e.message = std::string("internal error: ") + ex.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(ErrorJson(e), "application/json");
  });
  http.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    CurrentAccessNote() = AccessNote{};  // nothing left over from an earlier request of this thread
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics.CountHttp(EndpointLabel(req.path), res.status);
    LogAccess(req, res);
  });
}

}  // namespace attic::server
