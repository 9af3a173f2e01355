// SharedContextCacheRegistry: the context-cache registry (attic/pic/registry.h) kept in the
// Redis Cluster of the shared remote KV tier (--kv-remote; docs/store.md "Remote tier",
// docs/serving.md "Context caches"), so that a cache created on one Attic instance is
// listed, read, patched, deleted and linked on any instance of the cluster.
//
// Layout in Redis (every name under options.prefix, default "attic"; T = 16 hex of a hash
// of (scope, tenant), S = 16 hex of a hash of scope, the scope being the model's
// fingerprint: token ids mean something only to the model they were made for):
//
//   <prefix>:cc:{T}:rec:<id>   string: the cache's JSON record (the local registry's file
//                              format), PEXPIREAT its expiry: gone on every instance then
//   <prefix>:cc:{T}:ids        sorted set, all scores 0: the tenant's cache ids, listed
//                              by ZRANGEBYLEX (ids sort in creation order)
//   <prefix>:cc:{T}:exp        sorted set: id -> expires_at (unix ms); what a sweep drops
//   <prefix>:cc:{T}:chunks     hash: id -> the cache's chunk references, one a line
//   <prefix>:cc:{T}:refs       hash: chunk reference -> how many chunks of live caches
//                              name it (a reference: the chunk's store session, then the model)
//   <prefix>:cc:{S}:tenants    set: the tenants that ever created a cache (the sweep's list)
//
// One hash tag per tenant: a tenant's keys share one slot, so each change is one Lua
// script, atomic on one node (create, patch, delete, sweep), and listing one tenant is a
// range of one sorted set. Tenancy is the key itself: another tenant's id is looked up
// under that tenant's tag, where it does not exist (and a record's own tenant field is
// checked too).
//
// Implicit records (cache_control text parts) stay in a local, in-memory registry: they
// are per instance (each instance remembers the texts it saw; their KV is shared through
// the store's remote tier like any chunk's).
//
// Expiry: a record vanishes from Redis at its expiry (so no instance can serve it after);
// ExpireNow, on any instance, drops expired ids from a tenant's sets and releases their
// chunk references; the chunks no live cache references any more are returned, once, to
// the instance whose sweep released them, which erases their KV (from every tier it has,
// the shared one included). Other instances' local copies of such a chunk are left to
// their tiers' eviction.
//
// Errors: a cluster that does not answer within the budget is Unavailable or
// DeadlineExceeded (never NotFound: a client must not conclude that a cache is gone); a
// record that cannot be parsed is logged and treated as absent.
//
// Thread-safety: every method may be called from any thread (the ClusterClient pools
// connections; the little local state has its own mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "attic/pic/registry.h"
#include "attic/store/clock.h"

namespace attic::store::redis {
class ClusterClient;
}

namespace attic::pic {

struct SharedRegistryOptions {
  // "redis://host:port[,host:port...]": the cluster's seed nodes (--kv-remote).
  std::string url;
  // Namespace of every key (the remote tier's, so one deployment's keys share a prefix).
  std::string prefix = "attic";
  // Records are per scope: the served model's fingerprint. Must not be empty.
  std::string scope;
  std::chrono::milliseconds connect_timeout{300};
  std::chrono::milliseconds command_timeout{1000};
  // Everything one call may take (retries, redirects, reconnects).
  std::chrono::milliseconds retry_budget{1500};
  RegistryOptions limits;
};

class SharedContextCacheRegistry final : public ContextCacheRegistry {
 public:
  // Prepares the client; connects lazily (a cluster that is down makes calls fail, not
  // the start). InvalidArgument for a bad URL, an empty scope or a prefix with braces.
  // clock null = the system clock (expiry is also Redis's: tests use real time).
  static StatusOr<std::unique_ptr<SharedContextCacheRegistry>> Open(SharedRegistryOptions options,
                                                                    const store::Clock* clock = nullptr);
  ~SharedContextCacheRegistry() override;

  // Also InvalidArgument for a model name with a line break (references are lines).
  StatusOr<ContextCache> Create(ContextCache cache) override;
  StatusOr<ContextCache> Get(const std::string& tenant, const std::string& id) const override;
  StatusOr<CachePage> List(const std::string& tenant, const std::string& after_id, int limit) const override;
  StatusOr<ContextCache> SetExpiry(const std::string& tenant, const std::string& id, int64_t expires_at_ms) override;
  Status Delete(const std::string& tenant, const std::string& id) override;
  Status TouchImplicit(const std::string& tenant, const std::string& model, const std::vector<int32_t>& tokens,
                       bool bos, int64_t expires_at_ms) override;
  bool HasImplicit(const std::string& tenant, const std::string& model,
                   const std::string& store_session) const override;
  // Chunks are returned only when the cluster answered; a sweep it did not answer is
  // retried by the next call (what it would have released stays referenced till then).
  std::vector<ChunkKey> ExpireNow() override;

  // The Redis key of a cache's record (tests, operators).
  std::string RecordKey(const std::string& tenant, const std::string& id) const;

 private:
  struct TenantKeys {
    std::string rec_prefix;  // + id
    std::string ids, exp, chunks, refs;
  };
  SharedContextCacheRegistry(SharedRegistryOptions options, const store::Clock* clock,
                             std::unique_ptr<store::redis::ClusterClient> client,
                             std::unique_ptr<LocalContextCacheRegistry> implicit);
  TenantKeys KeysOf(const std::string& tenant) const;
  // SADD of the tenant to the sweep's list (once per tenant and process).
  Status NoteTenant(const std::string& tenant);
  // The chunk references among `refs` that no live cache of `tenant` names (HMGET refs);
  // an error when the cluster did not answer.
  StatusOr<std::vector<std::string>> Unreferenced(const std::string& tenant,
                                                  const std::vector<std::string>& refs) const;

  const SharedRegistryOptions options_;
  const store::Clock* clock_;
  std::unique_ptr<store::redis::ClusterClient> client_;
  std::unique_ptr<LocalContextCacheRegistry> implicit_;  // this instance's implicit records
  const std::string tenants_key_;

  std::mutex mu_;  // guards what follows
  std::mt19937_64 rng_;
  int64_t last_stamp_ms_ = 0;
  std::set<std::string> noted_tenants_;
  // Chunk references Delete found released, per tenant: ExpireNow returns those that are
  // still unreferenced then.
  std::set<std::pair<std::string, std::string>> released_;
};

}  // namespace attic::pic
