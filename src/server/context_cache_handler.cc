// Context caches over HTTP (paper 002, Epic; shaped like Gemini's cachedContents and
// Moonshot's context caching; docs/serving.md "Context caches"):
//
//   POST   /v1/context_caches        {model, documents | chunks, split, ttl | expire_at, display_name}
//   GET    /v1/context_caches        the tenant's caches, oldest first (?limit=&after=)
//   GET    /v1/context_caches/{id}
//   PATCH  /v1/context_caches/{id}   {ttl | expire_at}
//   DELETE /v1/context_caches/{id}
//
// A cache's chunks are prefilled on their own (KVGen) before POST returns; chat and
// completion requests then reference the cache, or one chunk, by id as a content part
// (completion_handler.cc). Every cache belongs to the tenant that created it: any other
// tenant's id is a 404, the same as an unknown one.
#include <nlohmann/json.hpp>

#include <chrono>

#include "attic/pic/split.h"
#include "server/server_internal.h"

namespace attic::server {

namespace {

using json = nlohmann::json;

constexpr int kDefaultListLimit = 20;
constexpr int kMaxListLimit = 100;
constexpr size_t kMaxDisplayName = 256;
constexpr size_t kMaxDocuments = 4096;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ApiError Bad(const std::string& param, const std::string& message, const std::string& code = "invalid_value") {
  return InvalidParam(param, message, code);
}

ApiError NotFound(const std::string& id) {
  ApiError e;
  e.http_status = 404;
  e.message = "No context cache '" + id + "' (unknown, expired or deleted)";
  e.code = "context_cache_not_found";
  return e;
}

// A registry's failure `st` for cache `id`: 404 when it holds no such cache, else what a
// registry that did not answer (the shared one, with --kv-remote) failed with (503).
ApiError RegistryError(const Status& st, const std::string& id) {
  return st.code() == StatusCode::kNotFound ? NotFound(id) : ErrorFromStatus(st);
}

// The error for a cache lookup that found no cache of the served model (RegistryError's,
// or 404 for another model's cache).
std::optional<ApiError> Missing(const StatusOr<pic::ContextCache>& c, const std::string& id,
                                const std::string& model_name) {
  if (c.ok()) return c->model == model_name ? std::nullopt : std::optional<ApiError>(NotFound(id));
  return RegistryError(c.status(), id);
}

json CacheObject(const pic::ContextCache& c) {
  json chunks = json::array();
  for (const pic::CachedChunk& ch : c.chunks) chunks.push_back({{"id", ch.id}, {"n_tokens", ch.tokens.size()}});
  return json{{"id", c.id},
              {"object", "context_cache"},
              {"model", c.model},
              {"display_name", c.display_name},
              {"created_at", c.created_at_ms / 1000},
              {"expires_at", c.expires_at_ms / 1000},
              {"n_tokens", c.n_tokens()},
              {"bos", c.bos},
              {"chunks", chunks}};
}

// The expiry of a create or update body: "ttl" (seconds, or Gemini's "300s") or
// "expire_at" (unix seconds; Moonshot's "expired_at" too), at most one of them.
std::optional<ApiError> ReadExpiry(const json& body, int64_t max_ttl_ms, int64_t* expires_at_ms, bool* given) {
  const json* ttl = body.contains("ttl") && !body["ttl"].is_null() ? &body["ttl"] : nullptr;
  const char* at_name = body.contains("expire_at") ? "expire_at" : "expired_at";
  const json* at = body.contains(at_name) && !body[at_name].is_null() ? &body[at_name] : nullptr;
  *given = ttl != nullptr || at != nullptr;
  if (ttl != nullptr && at != nullptr) return Bad("ttl", "give 'ttl' or 'expire_at', not both");
  const int64_t now = NowMs();
  if (ttl != nullptr) {
    double seconds = -1;
    if (ttl->is_number()) {
      seconds = ttl->get<double>();
    } else if (ttl->is_string()) {
      const std::string& s = ttl->get_ref<const std::string&>();
      char* end = nullptr;
      if (!s.empty() && s.back() == 's') seconds = std::strtod(s.c_str(), &end);
      if (end != s.c_str() + s.size() - 1) seconds = -1;
    }
    if (!(seconds >= 1) || seconds * 1000 > static_cast<double>(max_ttl_ms))
      return Bad("ttl", "'ttl' must be a number of seconds (or a string like \"300s\") between 1 and " +
                            std::to_string(max_ttl_ms / 1000));
    *expires_at_ms = now + static_cast<int64_t>(seconds * 1000);
  } else if (at != nullptr) {
    if (!at->is_number()) return Bad(at_name, std::string("'") + at_name + "' must be a unix time in seconds");
    const double t = at->get<double>() * 1000;
    if (!(t > static_cast<double>(now)) || t - static_cast<double>(now) > static_cast<double>(max_ttl_ms))
      return Bad(at_name, std::string("'") + at_name + "' must be in the future, at most " +
                              std::to_string(max_ttl_ms / 1000) + " seconds from now");
    *expires_at_ms = static_cast<int64_t>(t);
  }
  return std::nullopt;
}

// The 404 of every context-cache route on a server without the KV store.
ApiError Unavailable() {
  ApiError e;
  e.http_status = 404;
  e.message = "context caches need the KV store, which is not enabled on this server (--kv-dram, --kv-ssd-dir)";
  e.code = "context_caches_unavailable";
  return e;
}

}  // namespace

std::vector<Server::Impl::Route> Server::Impl::ContextCacheRoutes() {
  return {
      {Method::kPost, "/v1/context_caches", &Impl::HandleCreateContextCache},
      {Method::kGet, "/v1/context_caches", &Impl::HandleListContextCaches},
      {Method::kGet, R"(/v1/context_caches/([^/]+))", &Impl::HandleGetContextCache},
      {Method::kPatch, R"(/v1/context_caches/([^/]+))", &Impl::HandleUpdateContextCache},
      {Method::kDelete, R"(/v1/context_caches/([^/]+))", &Impl::HandleDeleteContextCache},
  };
}

std::optional<std::string> Server::Impl::ContextCacheTenant(const httplib::Request& req, httplib::Response& res,
                                                            bool available) const {
  auto tenant = AuthenticatedTenant(req, res);
  if (tenant && !available) {
    SendError(res, Unavailable());
    return std::nullopt;
  }
  return tenant;
}

void Server::Impl::HandleCreateContextCache(const httplib::Request& req, const std::string& body,
                                            httplib::Response& res) {
  const auto arrival = engine::SchedClock::now();
  auto tenant = ContextCacheTenant(req, res, caches != nullptr);
  if (!tenant) return;
  json b;
  if (auto e = ParseJsonObject(body, &b)) return SendError(res, *e);
  if (!b.contains("model") || !b["model"].is_string())
    return SendError(res, Bad("model", "'model' is required", "missing_required_parameter"));
  if (b["model"] != model_name) return SendError(res, ModelNotFound(b["model"].get<std::string>()));
  const bool has_docs = b.contains("documents") && !b["documents"].is_null();
  const bool has_chunks = b.contains("chunks") && !b["chunks"].is_null();
  if (has_docs == has_chunks)
    return SendError(res, Bad(has_docs ? "chunks" : "documents", "give one of 'documents' or 'chunks'",
                              has_docs ? "invalid_value" : "missing_required_parameter"));
  const char* field = has_docs ? "documents" : "chunks";
  const json& items = b[field];
  if (!items.is_array() || items.empty() || items.size() > kMaxDocuments)
    return SendError(res, Bad(field, std::string("'") + field + "' must be a non-empty array of at most " +
                                         std::to_string(kMaxDocuments) + " texts"));
  std::string display_name;
  if (b.contains("display_name") && !b["display_name"].is_null()) {
    if (!b["display_name"].is_string() || b["display_name"].get_ref<const std::string&>().size() > kMaxDisplayName)
      return SendError(res, Bad("display_name", "'display_name' must be a string of at most 256 bytes"));
    display_name = b["display_name"].get<std::string>();
  }
  pic::SplitOptions split;
  if (b.contains("split") && !b["split"].is_null()) {
    const json& s = b["split"];
    if (!has_docs) return SendError(res, Bad("split", "'split' applies to 'documents' only"));
    if (!s.is_object()) return SendError(res, Bad("split", "'split' must be an object {method, max_tokens}"));
    if (s.contains("method")) {
      auto m = s["method"].is_string() ? pic::ParseSplitMethod(s["method"].get<std::string>())
                                       : StatusOr<pic::SplitMethod>(InvalidArgumentError("'split.method' must be a string"));
      if (!m.ok()) return SendError(res, Bad("split.method", m.status().message()));
      split.method = *m;
    }
    if (s.contains("max_tokens")) {
      if (!s["max_tokens"].is_number_integer() || s["max_tokens"].get<int64_t>() < 1 ||
          s["max_tokens"].get<int64_t>() > engine.context_length())
        return SendError(res, Bad("split.max_tokens", "'split.max_tokens' must be an integer between 1 and " +
                                                          std::to_string(engine.context_length())));
      split.max_tokens = static_cast<int>(s["max_tokens"].get<int64_t>());
    }
  }
  int64_t expires_at = NowMs() + caches->options().default_ttl_ms;
  bool given = false;
  if (auto e = ReadExpiry(b, caches->options().max_ttl_ms, &expires_at, &given)) return SendError(res, *e);
  // The chunks' token ids: pre-split chunks as they are, documents split (KVSplit).
  std::vector<std::vector<int32_t>> chunks;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string p = std::string(field) + "[" + std::to_string(i) + "]";
    const json& it = items[i];
    const json* text = it.is_string() ? &it : (it.is_object() && it.contains("text") ? &it["text"] : nullptr);
    if (text == nullptr || !text->is_string() || text->get_ref<const std::string&>().empty())
      return SendError(res, Bad(p, "'" + p + "' must be a non-empty string (or {\"text\": ...})"));
    if (has_chunks) {
      auto ids = engine.Tokenize(text->get<std::string>(), false);
      if (!ids.ok()) return SendError(res, Bad(p, ids.status().message()));
      chunks.push_back(std::move(*ids));
      continue;
    }
    auto parts = pic::SplitDocument(engine.tokenizer(), text->get_ref<const std::string&>(), split);
    if (!parts.ok()) return SendError(res, Bad(p, parts.status().message()));
    for (pic::TextChunk& c : *parts) chunks.push_back(std::move(c.tokens));
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (static_cast<int>(chunks[i].size()) + 1 > engine.context_length())
      return SendError(res, Bad(field, "chunk " + std::to_string(i) + " has " + std::to_string(chunks[i].size()) +
                                           " tokens; a chunk must fit the context window of " +
                                           std::to_string(engine.context_length()) +
                                           " tokens (split the document with a smaller split.max_tokens)"));
  }
  const auto deadline = arrival + std::chrono::duration_cast<engine::SchedClock::duration>(
                                      std::chrono::duration<double>(options.request_timeout_s));
  int computed = 0;
  auto cache = caches->Create(*tenant, display_name, std::move(chunks), expires_at, deadline, &computed);
  if (!cache.ok()) {
    ApiError e = ErrorFromStatus(cache.status());
    // The tenant's limit of caches, not a full queue (the other ResourceExhausted here).
    if (cache.status().message().rfind("too many context caches", 0) == 0) e.code = "context_cache_limit_reached";
    return SendError(res, e);
  }
  json j = CacheObject(*cache);
  j["usage"] = {{"prompt_tokens", cache->n_tokens()},
                {"cached_tokens", std::max(0, cache->n_tokens() - computed)}};
  res.set_content(j.dump(), "application/json");
}

// ?limit=&after=: the tenant's caches of the served model, oldest first.
void Server::Impl::HandleListContextCaches(const httplib::Request& req, httplib::Response& res) {
  auto tenant = ContextCacheTenant(req, res, registry != nullptr);
  if (!tenant) return;
  int limit = kDefaultListLimit;
  if (req.has_param("limit")) {
    const std::string v = req.get_param_value("limit");
    const bool digits = !v.empty() && v.size() <= 3 && v.find_first_not_of("0123456789") == std::string::npos;
    limit = digits ? std::stoi(v) : 0;
    if (limit < 1 || limit > kMaxListLimit)
      return SendError(res, Bad("limit", "'limit' must be an integer between 1 and " + std::to_string(kMaxListLimit)));
  }
  const std::string after = req.get_param_value("after");
  if (after.size() > 256) return SendError(res, Bad("after", "'after' is longer than 256 bytes"));
  StatusOr<pic::CachePage> page = registry->List(*tenant, after, limit);
  if (!page.ok()) return SendError(res, ErrorFromStatus(page.status()));  // the shared registry did not answer
  json data = json::array();
  for (const auto& c : page->data)
    if (c.model == model_name) data.push_back(CacheObject(c));
  json j{{"object", "list"},
         {"data", data},
         {"first_id", data.empty() ? json(nullptr) : data.front()["id"]},
         {"last_id", data.empty() ? json(nullptr) : data.back()["id"]},
         {"has_more", page->has_more}};
  res.set_content(j.dump(), "application/json");
}

void Server::Impl::HandleGetContextCache(const httplib::Request& req, httplib::Response& res) {
  auto tenant = ContextCacheTenant(req, res, registry != nullptr);
  if (!tenant) return;
  const std::string id = req.matches[1];
  auto c = registry->Get(*tenant, id);
  if (auto e = Missing(c, id, model_name)) return SendError(res, *e);
  res.set_content(CacheObject(*c).dump(), "application/json");
}

// {ttl | expire_at}: a new expiry, the only change a cache takes.
void Server::Impl::HandleUpdateContextCache(const httplib::Request& req, const std::string& body,
                                            httplib::Response& res) {
  auto tenant = ContextCacheTenant(req, res, caches != nullptr);
  if (!tenant) return;
  const std::string id = req.matches[1];
  json b;
  if (auto e = ParseJsonObject(body, &b)) return SendError(res, *e);
  for (const auto& [k, v] : b.items()) {
    if (k != "ttl" && k != "expire_at" && k != "expired_at" && k != "model")
      return SendError(res, Bad(k, "only 'ttl' or 'expire_at' can be changed ('" + k + "' cannot)"));
  }
  int64_t expires_at = 0;
  bool given = false;
  if (auto e = ReadExpiry(b, caches->options().max_ttl_ms, &expires_at, &given)) return SendError(res, *e);
  if (!given) return SendError(res, Bad("ttl", "give 'ttl' or 'expire_at'", "missing_required_parameter"));
  auto old = registry->Get(*tenant, id);
  if (auto e = Missing(old, id, model_name)) return SendError(res, *e);
  auto c = registry->SetExpiry(*tenant, id, expires_at);
  if (!c.ok()) return SendError(res, RegistryError(c.status(), id));
  res.set_content(CacheObject(*c).dump(), "application/json");
}

void Server::Impl::HandleDeleteContextCache(const httplib::Request& req, httplib::Response& res) {
  auto tenant = ContextCacheTenant(req, res, caches != nullptr);
  if (!tenant) return;
  const std::string id = req.matches[1];
  auto old = registry->Get(*tenant, id);
  if (auto e = Missing(old, id, model_name)) return SendError(res, *e);
  Status st = registry->Delete(*tenant, id);
  if (!st.ok()) return SendError(res, RegistryError(st, id));
  caches->Sweep();  // its chunks' KV, unless another cache of the tenant uses them
  res.set_content(json{{"id", id}, {"object", "context_cache.deleted"}, {"deleted", true}}.dump(),
                  "application/json");
}

}  // namespace attic::server
