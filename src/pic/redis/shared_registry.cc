// The context-cache registry in the remote tier's Redis Cluster
// (include/attic/pic/shared_registry.h): each change is one Lua script on the tenant's slot.
#include "attic/pic/shared_registry.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "attic/core/hash.h"
#include "attic/core/log.h"
#include "pic/registry_format.h"
#include "store/redis/cluster_client.h"

namespace attic::pic {

namespace {

using store::redis::ClusterClient;
using store::redis::Command;
using store::redis::Reply;
using store::redis::ReplyStatus;
using store::redis::ReplyText;

constexpr size_t kSessionChars = 20;  // "ctx:" + 16 hex (ChunkStoreSession)
constexpr int kSweepBatch = 1000;     // expired ids one sweep script drops per tenant

// KEYS: rec ids exp chunks refs. ARGV: id record expires_at now max_live references.
// 0 when the tenant already has max_live live caches; else 1.
constexpr char kCreateScript[] = R"lua(
if redis.call('ZCOUNT', KEYS[3], '(' .. ARGV[4], '+inf') >= tonumber(ARGV[5]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PXAT', ARGV[3])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[6])
for ref in string.gmatch(ARGV[6], '[^\n]+') do redis.call('HINCRBY', KEYS[5], ref, 1) end
return 1
)lua";

// KEYS: rec exp. ARGV: id record expires_at now. 0 when the cache is not live; else 1.
constexpr char kExpiryScript[] = R"lua(
local cur = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not cur or tonumber(cur) <= tonumber(ARGV[4]) or redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PXAT', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
)lua";

// Releases the chunk references of `id` (KEYS[3] chunks, KEYS[4] refs); appends to `out`
// those no live cache names any more.
constexpr char kReleaseFunction[] = R"lua(
local function release(id, out)
  local refs = redis.call('HGET', KEYS[3], id)
  redis.call('HDEL', KEYS[3], id)
  if not refs then return end
  for ref in string.gmatch(refs, '[^\n]+') do
    if redis.call('HINCRBY', KEYS[4], ref, -1) <= 0 then
      redis.call('HDEL', KEYS[4], ref)
      table.insert(out, ref)
    end
  end
end
)lua";

// KEYS: ids exp chunks refs rec. ARGV: id now. {0} when the cache is not live; else {1,
// the references it released}.
constexpr char kDeleteBody[] = R"lua(
local cur = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not cur or tonumber(cur) <= tonumber(ARGV[2]) then return {0} end
redis.call('DEL', KEYS[5])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local out = {1}
release(ARGV[1], out)
return out
)lua";

// KEYS: ids exp chunks refs. ARGV: now batch. The references released by dropping the
// expired ids (their records are gone already: Redis expired them).
constexpr char kSweepBody[] = R"lua(
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  release(id, out)
end
return out
)lua";

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Hash of length-prefixed fields: no two field lists give the same bytes.
uint64_t FieldsHash(std::initializer_list<std::string_view> fields) {
  std::string bytes;
  for (std::string_view f : fields) {
    bytes += std::to_string(f.size());
    bytes += ':';
    bytes += f;
  }
  return Hash64(bytes);
}

std::string Reference(const std::string& store_session, const std::string& model) { return store_session + model; }

ChunkKey KeyOfReference(const std::string& tenant, const std::string& ref) {
  return ChunkKey{tenant, ref.substr(kSessionChars), ref.substr(0, kSessionChars)};
}

// A reply that must not be an error reply.
Status Check(const Reply& r) {
  if (r == nullptr) return InternalError("no reply");
  return ReplyStatus(*r);
}

}  // namespace

StatusOr<std::unique_ptr<SharedContextCacheRegistry>> SharedContextCacheRegistry::Open(SharedRegistryOptions options,
                                                                                     const store::Clock* clock) {
  if (options.scope.empty()) return InvalidArgumentError("the shared context-cache registry needs a scope");
  if (options.prefix.empty() || options.prefix.find_first_of("{}") != std::string::npos)
    return InvalidArgumentError("a key prefix must be non-empty and have no braces");
  ATTIC_ASSIGN_OR_RETURN(std::vector<std::string> seeds, store::redis::ParseRedisUrl(options.url));
  store::redis::ClusterOptions co;
  co.seeds = std::move(seeds);
  co.connect_timeout = options.connect_timeout;
  co.command_timeout = options.command_timeout;
  co.retry_budget = options.retry_budget;
  ATTIC_ASSIGN_OR_RETURN(std::unique_ptr<ClusterClient> client, ClusterClient::Create(std::move(co)));
  ATTIC_ASSIGN_OR_RETURN(std::unique_ptr<LocalContextCacheRegistry> implicit,
                         ContextCacheRegistry::Open("", clock, options.limits));
  return std::unique_ptr<SharedContextCacheRegistry>(
      new SharedContextCacheRegistry(std::move(options), clock, std::move(client), std::move(implicit)));
}

SharedContextCacheRegistry::SharedContextCacheRegistry(SharedRegistryOptions options, const store::Clock* clock,
                                                       std::unique_ptr<ClusterClient> client,
                                                       std::unique_ptr<LocalContextCacheRegistry> implicit)
    : options_(std::move(options)),
      clock_(clock != nullptr ? clock : store::SystemClock::Default()),
      client_(std::move(client)),
      implicit_(std::move(implicit)),
      tenants_key_(options_.prefix + ":cc:{" + Hex16(FieldsHash({options_.scope})) + "}:tenants"),
      rng_(std::random_device{}()) {}

SharedContextCacheRegistry::~SharedContextCacheRegistry() = default;

SharedContextCacheRegistry::TenantKeys SharedContextCacheRegistry::KeysOf(const std::string& tenant) const {
  const std::string base = options_.prefix + ":cc:{" + Hex16(FieldsHash({options_.scope, tenant})) + "}:";
  return TenantKeys{base + "rec:", base + "ids", base + "exp", base + "chunks", base + "refs"};
}

std::string SharedContextCacheRegistry::RecordKey(const std::string& tenant, const std::string& id) const {
  return KeysOf(tenant).rec_prefix + id;
}

Status SharedContextCacheRegistry::NoteTenant(const std::string& tenant) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (noted_tenants_.count(tenant) != 0) return OkStatus();
  }
  ATTIC_ASSIGN_OR_RETURN(Reply r, client_->Run(tenants_key_, {"SADD", tenants_key_, tenant}));
  ATTIC_RETURN_IF_ERROR(Check(r));
  std::lock_guard<std::mutex> lock(mu_);
  noted_tenants_.insert(tenant);
  return OkStatus();
}

StatusOr<ContextCache> SharedContextCacheRegistry::Create(ContextCache cache) {
  const int64_t now = clock_->NowMs();
  if (cache.chunks.empty()) return InvalidArgumentError("a context cache needs at least one chunk");
  for (size_t i = 0; i < cache.chunks.size(); ++i)
    if (cache.chunks[i].tokens.empty()) return InvalidArgumentError("chunk " + std::to_string(i) + " has no tokens");
  if (cache.expires_at_ms <= now) return InvalidArgumentError("the expiry time is not in the future");
  if (cache.model.find('\n') != std::string::npos) return InvalidArgumentError("the model name has a line break");
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_stamp_ms_ = std::max(now, last_stamp_ms_ + 1);
    cache.id = internal::MakeCacheId(last_stamp_ms_, rng_());
  }
  cache.created_at_ms = now;
  internal::AssignChunkIds(&cache);
  ATTIC_ASSIGN_OR_RETURN(std::string text, internal::CacheRecordText(cache));
  std::string refs;
  for (const CachedChunk& ch : cache.chunks) refs += Reference(ch.store_session, cache.model) + "\n";
  ATTIC_RETURN_IF_ERROR(NoteTenant(cache.tenant));
  const TenantKeys k = KeysOf(cache.tenant);
  const std::string rec = k.rec_prefix + cache.id, expires = std::to_string(cache.expires_at_ms),
                    now_s = std::to_string(now), max_live = std::to_string(options_.limits.max_caches_per_tenant);
  ATTIC_ASSIGN_OR_RETURN(Reply r, client_->Run(rec, {"EVAL", kCreateScript, "5", rec, k.ids, k.exp, k.chunks, k.refs,
                                                     cache.id, text, expires, now_s, max_live, refs}));
  ATTIC_RETURN_IF_ERROR(Check(r));
  if (r->type != REDIS_REPLY_INTEGER) return InternalError("context caches: unexpected reply to a create");
  if (r->integer == 0)
    return ResourceExhaustedError("too many context caches (at most " +
                                  std::to_string(options_.limits.max_caches_per_tenant) +
                                  "): delete some or wait for them to expire");
  return cache;
}

StatusOr<ContextCache> SharedContextCacheRegistry::Get(const std::string& tenant, const std::string& id) const {
  if (!internal::IsCacheIdText(id)) return internal::CacheNotFound(id);
  const std::string rec = RecordKey(tenant, id);
  ATTIC_ASSIGN_OR_RETURN(Reply r, client_->Run(rec, {"GET", rec}));
  ATTIC_RETURN_IF_ERROR(Check(r));
  if (r->type != REDIS_REPLY_STRING) return internal::CacheNotFound(id);
  StatusOr<ContextCache> c = internal::ParseCacheRecord(std::string(ReplyText(*r)), id);
  if (!c.ok()) {
    Log(LogLevel::kWarn, "context caches: ignoring the unreadable record %s: %s", rec.c_str(),
        c.status().ToString().c_str());
    return internal::CacheNotFound(id);
  }
  // Redis expires the record itself; the clocks of instances and nodes may differ a little.
  if (c->tenant != tenant || clock_->NowMs() >= c->expires_at_ms) return internal::CacheNotFound(id);
  return c;
}

StatusOr<CachePage> SharedContextCacheRegistry::List(const std::string& tenant, const std::string& after_id,
                                                     int limit) const {
  limit = std::max(limit, 1);
  const int64_t now = clock_->NowMs();
  const TenantKeys k = KeysOf(tenant);
  const std::string batch = std::to_string(limit + 1);
  CachePage page;
  std::string from = after_id.empty() ? "-" : "(" + after_id;
  // Ids in order, a batch at a time; those whose records are gone (expired, deleted since)
  // are skipped, so a page holds `limit` live caches when the tenant has them.
  while (static_cast<int>(page.data.size()) <= limit) {
    ATTIC_ASSIGN_OR_RETURN(Reply ids, client_->Run(k.ids, {"ZRANGEBYLEX", k.ids, from, "+", "LIMIT", "0", batch}));
    ATTIC_RETURN_IF_ERROR(Check(ids));
    if (ids->type != REDIS_REPLY_ARRAY) return InternalError("context caches: unexpected reply to a listing");
    if (ids->elements == 0) break;
    std::vector<std::string> names;
    Command mget{"MGET"};
    for (size_t i = 0; i < ids->elements; ++i) names.push_back(std::string(ReplyText(*ids->element[i])));
    std::vector<std::string> recs;
    for (const std::string& id : names) recs.push_back(k.rec_prefix + id);
    for (const std::string& rec : recs) mget.push_back(rec);
    ATTIC_ASSIGN_OR_RETURN(Reply values, client_->Run(k.ids, mget));
    ATTIC_RETURN_IF_ERROR(Check(values));
    if (values->type != REDIS_REPLY_ARRAY || values->elements != names.size())
      return InternalError("context caches: unexpected reply to a listing");
    for (size_t i = 0; i < names.size() && static_cast<int>(page.data.size()) <= limit; ++i) {
      if (values->element[i]->type != REDIS_REPLY_STRING) continue;
      StatusOr<ContextCache> c = internal::ParseCacheRecord(std::string(ReplyText(*values->element[i])), names[i]);
      if (!c.ok() || c->tenant != tenant || now >= c->expires_at_ms) continue;
      page.data.push_back(std::move(c).value());
    }
    if (static_cast<int>(names.size()) < limit + 1) break;
    from = "(" + names.back();
  }
  if (static_cast<int>(page.data.size()) > limit) {
    page.data.resize(static_cast<size_t>(limit));
    page.has_more = true;
  }
  return page;
}

StatusOr<ContextCache> SharedContextCacheRegistry::SetExpiry(const std::string& tenant, const std::string& id,
                                                             int64_t expires_at_ms) {
  ATTIC_ASSIGN_OR_RETURN(ContextCache c, Get(tenant, id));
  const int64_t now = clock_->NowMs();
  if (expires_at_ms <= now) return InvalidArgumentError("the expiry time is not in the future");
  c.expires_at_ms = expires_at_ms;
  ATTIC_ASSIGN_OR_RETURN(std::string text, internal::CacheRecordText(c));
  const TenantKeys k = KeysOf(tenant);
  const std::string rec = k.rec_prefix + id, expires = std::to_string(expires_at_ms), now_s = std::to_string(now);
  ATTIC_ASSIGN_OR_RETURN(Reply r,
                         client_->Run(rec, {"EVAL", kExpiryScript, "2", rec, k.exp, id, text, expires, now_s}));
  ATTIC_RETURN_IF_ERROR(Check(r));
  if (r->type != REDIS_REPLY_INTEGER) return InternalError("context caches: unexpected reply to a patch");
  if (r->integer == 0) return internal::CacheNotFound(id);  // deleted or expired meanwhile
  return c;
}

Status SharedContextCacheRegistry::Delete(const std::string& tenant, const std::string& id) {
  if (!internal::IsCacheIdText(id)) return internal::CacheNotFound(id);
  const TenantKeys k = KeysOf(tenant);
  const std::string rec = k.rec_prefix + id, now_s = std::to_string(clock_->NowMs());
  const std::string script = std::string(kReleaseFunction) + kDeleteBody;
  ATTIC_ASSIGN_OR_RETURN(Reply r,
                         client_->Run(rec, {"EVAL", script, "5", k.ids, k.exp, k.chunks, k.refs, rec, id, now_s}));
  ATTIC_RETURN_IF_ERROR(Check(r));
  if (r->type != REDIS_REPLY_ARRAY || r->elements == 0 || r->element[0]->type != REDIS_REPLY_INTEGER)
    return InternalError("context caches: unexpected reply to a delete");
  if (r->element[0]->integer == 0) return internal::CacheNotFound(id);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 1; i < r->elements; ++i) released_.emplace(tenant, std::string(ReplyText(*r->element[i])));
  return OkStatus();
}

Status SharedContextCacheRegistry::TouchImplicit(const std::string& tenant, const std::string& model,
                                                 const std::vector<int32_t>& tokens, bool bos,
                                                 int64_t expires_at_ms) {
  return implicit_->TouchImplicit(tenant, model, tokens, bos, expires_at_ms);
}

bool SharedContextCacheRegistry::HasImplicit(const std::string& tenant, const std::string& model,
                                             const std::string& store_session) const {
  return implicit_->HasImplicit(tenant, model, store_session);
}

StatusOr<std::vector<std::string>> SharedContextCacheRegistry::Unreferenced(const std::string& tenant,
                                                                           const std::vector<std::string>& refs) const {
  std::vector<std::string> out;
  if (refs.empty()) return out;
  const TenantKeys k = KeysOf(tenant);
  Command hmget{"HMGET", k.refs};
  for (const std::string& ref : refs) hmget.push_back(ref);
  ATTIC_ASSIGN_OR_RETURN(Reply r, client_->Run(k.refs, hmget));
  ATTIC_RETURN_IF_ERROR(Check(r));
  if (r->type != REDIS_REPLY_ARRAY || r->elements != refs.size())
    return InternalError("context caches: unexpected reply to a reference check");
  for (size_t i = 0; i < refs.size(); ++i)
    if (r->element[i]->type == REDIS_REPLY_NIL) out.push_back(refs[i]);
  return out;
}

std::vector<ChunkKey> SharedContextCacheRegistry::ExpireNow() {
  std::set<ChunkKey> out;
  auto warn = [](const Status& st) {
    Log(LogLevel::kWarn, "context caches: the shared registry's sweep failed (retried later): %s",
        st.ToString().c_str());
  };
  // Implicit records' chunks: unless a shared cache of the tenant names them.
  for (const ChunkKey& key : implicit_->ExpireNow()) {
    StatusOr<std::vector<std::string>> free = Unreferenced(key.tenant, {Reference(key.store_session, key.model)});
    if (!free.ok()) {
      warn(free.status());
      continue;  // not erased: the store's own eviction bounds it
    }
    if (!free->empty()) out.insert(key);
  }
  // What Delete released, if nothing named it again since.
  std::map<std::string, std::vector<std::string>> released;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [tenant, ref] : released_) released[tenant].push_back(ref);
    released_.clear();
  }
  for (const auto& [tenant, refs] : released) {
    StatusOr<std::vector<std::string>> free = Unreferenced(tenant, refs);
    if (!free.ok()) {
      warn(free.status());
      continue;
    }
    for (const std::string& ref : *free) out.insert(KeyOfReference(tenant, ref));
  }
  // Expired caches of every tenant.
  StatusOr<Reply> tenants = client_->Run(tenants_key_, {"SMEMBERS", tenants_key_});
  Status st = tenants.ok() ? Check(*tenants) : tenants.status();
  if (st.ok() && (*tenants)->type != REDIS_REPLY_ARRAY) st = InternalError("unexpected reply to SMEMBERS");
  if (!st.ok()) {
    warn(st);
  } else {
    const std::string script = std::string(kReleaseFunction) + kSweepBody;
    const std::string now_s = std::to_string(clock_->NowMs()), batch = std::to_string(kSweepBatch);
    for (size_t i = 0; i < (*tenants)->elements; ++i) {
      const std::string tenant(ReplyText(*(*tenants)->element[i]));
      const TenantKeys k = KeysOf(tenant);
      StatusOr<Reply> r = client_->Run(k.ids, {"EVAL", script, "4", k.ids, k.exp, k.chunks, k.refs, now_s, batch});
      Status rs = r.ok() ? Check(*r) : r.status();
      if (rs.ok() && (*r)->type != REDIS_REPLY_ARRAY) rs = InternalError("unexpected reply to a sweep");
      if (!rs.ok()) {
        warn(rs);
        continue;
      }
      for (size_t j = 0; j < (*r)->elements; ++j)
        out.insert(KeyOfReference(tenant, std::string(ReplyText(*(*r)->element[j]))));
    }
  }
  std::vector<ChunkKey> result;
  for (const ChunkKey& key : out)
    if (!implicit_->ReferencesImplicit(key)) result.push_back(key);
  return result;
}

}  // namespace attic::pic
