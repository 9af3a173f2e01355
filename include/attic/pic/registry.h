// The context-cache registry (paper 002, Epic; an API shaped like Gemini's
// `cachedContents` and Moonshot's context caching): which context caches exist, per
// tenant, with their chunks' token ids, expiry and display names, and which implicitly
// cached chunks (Anthropic-style `cache_control`) are kept alive until when. It is the
// metadata side only: each chunk's KV is an ordinary entry of the KV store
// (include/attic/store/kv_store.h), of the session ChunkStoreSession(tokens, bos), which
// the caller prefills and saves; the registry tells the caller which of those entries no
// record references any more (ExpireNow) so that it can erase them. It knows nothing of
// HTTP, the engine or the store's tiers.
//
// Persistence (dir given to Open): one JSON file per record, written atomically (temp
// file, fsync, rename, fsync of the directory):
//
//   DIR/ctx-<24 hex>.json        a context cache (its id)
//   DIR/implicit-<32 hex>.json   an implicit chunk record (a hash of tenant, model, session)
//   DIR/<either>.tmp             a write in progress (removed by Open: a crash left it)
//
// Only names of exactly these patterns are ever read, written or removed; any other file
// or directory (and links) is left untouched (counted in RegistryOpenReport::foreign).
//
// With --kv-remote the records of context caches live in the Redis Cluster instead, shared
// by every instance (SharedContextCacheRegistry, attic/pic/shared_registry.h); both are a
// ContextCacheRegistry.
//
// Thread-safety: see each class.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "attic/core/status.h"
#include "attic/store/clock.h"

namespace attic::pic {

struct CachedChunk {
  std::string id;               // "<cache id>-c<index>" (index from 0): addressable on its own
  std::vector<int32_t> tokens;  // the chunk's tokens (no BOS)
  std::string store_session;    // session id of its KV entry in the store: ChunkStoreSession(tokens, bos)
};

struct ContextCache {
  // "ctx-" + 24 lowercase hex: 12 of a creation stamp (unix ms, strictly increasing within a
  // registry) then 12 random (std::random_device-seeded). Ids therefore sort in creation
  // order, which makes List's `after` a position rather than a reference.
  std::string id;
  std::string tenant;
  std::string model;         // as the caller names it; chunk entries are per (tenant, model)
  std::string display_name;  // free text, not interpreted
  bool bos = true;           // chunks prefilled after a BOS token (an option of their KV)
  int64_t created_at_ms = 0;  // unix ms, stamped by Create
  int64_t expires_at_ms = 0;  // unix ms; > created_at_ms. Expired when now >= expires_at_ms
  std::vector<CachedChunk> chunks;

  int n_tokens() const;
};

// Content address of a chunk's KV entry within a tenant and model: the same tokens with the
// same options are stored once. "ctx:" + 16 lowercase hex of a 64-bit xxh3 of (bos, tokens as
// little-endian int32). A 64-bit hash may collide: a caller linking an entry compares the
// entry's token ids (the store keeps them) with the chunk's.
std::string ChunkStoreSession(const std::vector<int32_t>& tokens, bool bos);
// The prefix of every ChunkStoreSession ("ctx:").
inline constexpr char kChunkStoreSessionPrefix[] = "ctx:";
// Whether `session_id` is of that form's namespace (starts with "ctx:"). A server must refuse
// such session ids from users, so that no conversation can overwrite a chunk's entry.
bool IsChunkStoreSession(std::string_view session_id);

// A chunk's KV entry as the store knows it: (tenant, store session), and the model whose
// store holds it (a server erases only its own model's entries).
struct ChunkKey {
  std::string tenant;
  std::string model;
  std::string store_session;
  auto operator<=>(const ChunkKey&) const = default;
};

// A referenced chunk with what is needed to (re)build its entry.
struct LiveChunk {
  ChunkKey key;
  std::vector<int32_t> tokens;
  bool bos = true;
};

struct CachePage {
  std::vector<ContextCache> data;
  bool has_more = false;
};

struct RegistryOptions {
  // Live caches a tenant may hold; Create beyond it is ResourceExhausted.
  int max_caches_per_tenant = 1000;
  // Live implicit chunk records a tenant may hold; a new one beyond it is ResourceExhausted
  // (extending an existing one always works).
  int max_implicit_per_tenant = 10000;
};

// What Open found in the directory.
struct RegistryOpenReport {
  int caches = 0;     // live caches loaded
  int implicit = 0;   // live implicit records loaded
  int expired = 0;    // records expired while the registry was closed: removed
  int corrupt = 0;    // records of our name pattern that could not be read or parsed: logged, removed
  int stale_tmp = 0;  // temporary files of interrupted writes: removed
  int newer = 0;      // records of a newer format version: logged, left untouched, not loaded
  int foreign = 0;    // anything else in the directory: left untouched
};

class LocalContextCacheRegistry;

// The registry's interface: the local registry (LocalContextCacheRegistry, below: one
// instance's records, in memory or in files) and the shared one
// (attic/pic/shared_registry.h: records in a Redis Cluster that several instances share,
// with --kv-remote) behave alike; the server and ContextCacheService use only this.
// A backend whose storage can fail (the shared one) returns Unavailable /
// DeadlineExceeded for a call the storage did not answer; NotFound means not found.
class ContextCacheRegistry {
 public:
  // The local registry. dir "" = in memory only; else records persist in `dir` (created
  // if missing) and are loaded here (see the file comment; the chunks of records found
  // expired are reported by the first ExpireNow). clock null = the system clock (tests
  // pass a store::VirtualClock, which must outlive the registry). Unavailable when `dir`
  // cannot be created or listed.
  static StatusOr<std::unique_ptr<LocalContextCacheRegistry>> Open(const std::string& dir,
                                                                   const store::Clock* clock = nullptr,
                                                                   RegistryOptions options = {});
  virtual ~ContextCacheRegistry() = default;

  // Assigns the id and chunk ids, computes the chunks' store sessions, stamps created_at
  // (`cache`'s own values of those are ignored) and stores it; returns the stored cache.
  // InvalidArgument: no chunks, an empty chunk, expires_at_ms <= now, a string that is not
  // UTF-8. ResourceExhausted: the tenant's limit. A failed write (Unavailable, ...) stores nothing.
  virtual StatusOr<ContextCache> Create(ContextCache cache) = 0;
  // NotFound ("context cache '<id>' not found") for an unknown id, an expired cache or
  // another tenant's: the same status, so that no tenant learns another's ids.
  virtual StatusOr<ContextCache> Get(const std::string& tenant, const std::string& id) const = 0;
  // A chunk by its chunk id (one chunk), or a cache by its id (its chunks in order).
  // NotFound as Get (also for a chunk index the cache does not have).
  StatusOr<std::vector<CachedChunk>> Resolve(const std::string& tenant, const std::string& id) const;
  // The tenant's live caches in creation order, oldest first, starting after `after_id`
  // ("" = from the first): a position in that order, not a reference, so an expired or
  // deleted cursor still works. At most `limit` (values < 1 count as 1).
  virtual StatusOr<CachePage> List(const std::string& tenant, const std::string& after_id, int limit) const = 0;
  // Sets a live cache's expiry (longer or shorter); returns it. InvalidArgument when
  // expires_at_ms <= now; NotFound as Get. Once it expires, the ExpireNow after that reports
  // its chunks (like any cache's).
  virtual StatusOr<ContextCache> SetExpiry(const std::string& tenant, const std::string& id,
                                           int64_t expires_at_ms) = 0;
  // Removes a live cache. NotFound as Get. Its chunks that nothing else references are
  // returned by the next ExpireNow.
  virtual Status Delete(const std::string& tenant, const std::string& id) = 0;

  // Implicit caching (Anthropic-style cache_control on a text part): keeps the chunk
  // (tenant, model, ChunkStoreSession(tokens, bos)) alive until expires_at_ms; extends, never
  // shortens, a previous record of the same chunk. Only a change is written (one small file
  // and an fsync: a caller refreshing a 5-minute TTL on every request may round expiries up,
  // e.g. to the minute, to write less). InvalidArgument: empty tokens, expires_at_ms <= now,
  // a string that is not UTF-8. ResourceExhausted: the tenant's limit.
  virtual Status TouchImplicit(const std::string& tenant, const std::string& model, const std::vector<int32_t>& tokens,
                               bool bos, int64_t expires_at_ms) = 0;
  // Whether a live implicit record of that chunk exists (a caller deciding to link it).
  virtual bool HasImplicit(const std::string& tenant, const std::string& model,
                           const std::string& store_session) const = 0;

  // Drops expired caches and implicit records (and their files) and returns, sorted, the
  // chunks that no live cache or implicit record of the same tenant and model references
  // any more: those of the records dropped now, and of Delete / SetExpiry / records found
  // expired by Open since the last call. The caller erases their store entries. A chunk
  // referenced again before this call (a new cache with the same tokens) is not returned;
  // one referenced again after it returns may lose its entry to that erasure, so a caller
  // linking a chunk treats a missing entry (also evicted, or expired by the store's own TTL)
  // as a miss: it prefills and saves the chunk again. Call it periodically: what Delete and
  // expiry leave for it accumulates until then.
  virtual std::vector<ChunkKey> ExpireNow() = 0;
};

// The local registry: one instance's records, in memory or in one directory (the file
// comment). Thread-safety: every method may be called from any thread. Reads (Get,
// Resolve, List, HasImplicit, LiveChunks) take one mutex for memory work only; changes
// (Create, SetExpiry, Delete, TouchImplicit, ExpireNow) are serialized among themselves and
// do their file I/O without holding the readers' mutex.
class LocalContextCacheRegistry final : public ContextCacheRegistry {
 public:
  ~LocalContextCacheRegistry() override;
  LocalContextCacheRegistry(const LocalContextCacheRegistry&) = delete;
  LocalContextCacheRegistry& operator=(const LocalContextCacheRegistry&) = delete;

  StatusOr<ContextCache> Create(ContextCache cache) override;
  StatusOr<ContextCache> Get(const std::string& tenant, const std::string& id) const override;
  StatusOr<CachePage> List(const std::string& tenant, const std::string& after_id, int limit) const override;
  StatusOr<ContextCache> SetExpiry(const std::string& tenant, const std::string& id, int64_t expires_at_ms) override;
  Status Delete(const std::string& tenant, const std::string& id) override;
  Status TouchImplicit(const std::string& tenant, const std::string& model, const std::vector<int32_t>& tokens,
                       bool bos, int64_t expires_at_ms) override;
  bool HasImplicit(const std::string& tenant, const std::string& model,
                   const std::string& store_session) const override;
  std::vector<ChunkKey> ExpireNow() override;
  // Every chunk a live cache or implicit record references, once each, sorted by key (a
  // caller checks that the store still holds them).
  std::vector<LiveChunk> LiveChunks() const;
  // Whether a live implicit record references the chunk (the shared registry keeps its
  // implicit records in a local one and asks before erasing a chunk of a shared cache).
  bool ReferencesImplicit(const ChunkKey& key) const;

  const RegistryOpenReport& open_report() const { return open_report_; }

 private:
  friend class ContextCacheRegistry;
  struct Implicit {  // an implicit chunk record
    std::vector<int32_t> tokens;
    bool bos = true;
    int64_t expires_at_ms = 0;
  };
  LocalContextCacheRegistry(std::string dir, const store::Clock* clock, RegistryOptions options);
  Status Load();
  Status WriteRecord(const std::string& name, const std::string& text);
  Status RemoveRecord(const std::string& name);
  std::string NewId(int64_t now_ms);
  const ContextCache* FindLiveLocked(const std::string& tenant, const std::string& id, int64_t now_ms) const;
  int LiveCachesLocked(const std::string& tenant, int64_t now_ms) const;
  int LiveImplicitLocked(const std::string& tenant, int64_t now_ms) const;
  void InsertCacheLocked(ContextCache cache);
  void EraseCacheLocked(const std::string& id);
  void RefLocked(const ChunkKey& key);
  void UnrefLocked(const ChunkKey& key);

  const std::string dir_;  // "" = in memory
  const store::Clock* clock_;
  const RegistryOptions options_;
  RegistryOpenReport open_report_;

  // Serializes changes and is held across their file I/O; taken before mu_, never while
  // holding it, so that readers never wait for a disk.
  std::mutex write_mu_;
  std::mt19937_64 rng_;        // guarded by write_mu_
  int64_t last_stamp_ms_ = 0;  // guarded by write_mu_: the newest id's creation stamp

  mutable std::mutex mu_;  // guards what follows (memory only)
  std::unordered_map<std::string, ContextCache> caches_;                  // by id; expired ones until ExpireNow
  std::unordered_map<std::string, std::set<std::string>> tenant_caches_;  // tenant -> its cache ids (creation order)
  std::map<ChunkKey, Implicit> implicit_;                                 // expired ones until ExpireNow
  std::unordered_map<std::string, int> implicit_per_tenant_;              // records in implicit_ per tenant
  std::map<ChunkKey, int> refs_;    // references by the records held (> 0; a chunk of a cache counted per chunk)
  std::set<ChunkKey> unreferenced_;  // references dropped to 0 since the last ExpireNow
};

}  // namespace attic::pic
