// Context caches on a serving engine (paper 002, Epic): the part between the HTTP API and
// the engine. KVGen -- each chunk prefilled on its own from position 0 (after BOS or
// not) through the scheduler as a prefill-only request and saved in the KV store as an
// ordinary entry of the session pic::ChunkStoreSession(tokens, bos) (tenant-scoped, in the
// store's tiers, under its eviction, surviving restarts with the SSD tier) -- the
// registry of caches and implicitly cached texts, and assembling a prompt of text and
// cached chunks into a linked request (pic/link.h).
//
// A chunk's KV may leave the store (evicted, expired, corrupt): linking checks that every
// chunk it needs is stored and prefills the missing ones again first, so a cache stays
// usable as long as its registry record lives. The registry owns the chunks' lifetime:
// their entries are saved without expiry and erased by Sweep() once no live record of
// the tenant references them.
//
// Thread-safety: every method may be called from any thread (HTTP handlers); KVGen
// requests go through the scheduler's queue like any other.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "attic/engine/engine.h"
#include "attic/engine/scheduler.h"
#include "attic/pic/link.h"
#include "attic/pic/registry.h"
#include "attic/store/kv_store.h"

namespace attic::server {

struct ContextCacheOptions {
  std::string model;                          // the served model's name (registry records)
  bool chunk_bos = true;                      // chunks prefilled after a BOS token (--link-chunk-bos)
  pic::LinkOptions link;                   // the default method (--link)
  int64_t default_ttl_ms = 3600 * 1000;       // a cache's TTL when the request gives none (1 h)
  int64_t max_ttl_ms = 30ll * 24 * 3600 * 1000;
};

// A piece of a prompt: text tokens, or a chunk whose KV is (or will be) cached.
struct PromptPiece {
  std::vector<int32_t> tokens;
  bool cached = false;  // a context cache's chunk, or an implicitly cached text
  bool bos = true;      // cached: its KV is prefilled after a BOS token (the cache's option)
};

// What linking a prompt took (usage, metrics).
struct LinkPrep {
  int chunks = 0;            // cached chunks in the prompt
  int regenerated = 0;       // ... whose KV was missing and prefilled again first
  int regenerated_tokens = 0;
  std::map<std::string, int> hits_by_tier;  // chunks found stored, by the tier holding them
};

class ContextCacheService {
 public:
  ContextCacheService(engine::Engine& engine, engine::Scheduler& scheduler, store::KvStore& store,
                      pic::ContextCacheRegistry& registry, ContextCacheOptions options);

  const ContextCacheOptions& options() const { return options_; }
  pic::ContextCacheRegistry& registry() { return registry_; }

  // The store key of a chunk's KV entry for `tenant`.
  std::string StoreKey(const std::string& tenant, const std::vector<int32_t>& tokens, bool bos) const;
  bool Stored(const std::string& tenant, const std::vector<int32_t>& tokens, bool bos) const;

  // KVGen: prefills and stores every chunk of `chunks` whose KV is not stored yet (once
  // each), all submitted at once, and waits until they are saved or `deadline`. Returns
  // the tokens computed. DeadlineExceeded, ResourceExhausted (the queue is full), or
  // what a prefill failed with.
  StatusOr<int> Generate(const std::string& tenant, const std::vector<std::vector<int32_t>>& chunks, bool bos,
                         engine::SchedClock::time_point deadline);

  // Creates a cache of `chunks` (token ids, no BOS): KVGen, then the registry record.
  // *computed = the chunks' tokens prefilled, without their BOS, each distinct chunk once
  // (chunks already stored cost nothing), so that n_tokens - *computed were cached.
  StatusOr<pic::ContextCache> Create(const std::string& tenant, const std::string& display_name,
                                std::vector<std::vector<int32_t>> chunks, int64_t expires_at_ms,
                                engine::SchedClock::time_point deadline, int* computed);

  // The prompt of `pieces` (in order) and, when any piece is cached, the link spec of
  // its chunks with `options`; a cached piece's KV is prefilled first when missing.
  // `implicit_ttl_ms` > 0: cached pieces are implicit caches (cache_control) kept alive
  // that long from now (a first sight stores them after this request: see
  // RememberImplicit).
  StatusOr<std::shared_ptr<const pic::LinkSpec>> Link(const std::string& tenant, const std::vector<PromptPiece>& pieces,
                                                         const pic::LinkOptions& options,
                                                         engine::SchedClock::time_point deadline,
                                                         std::vector<int32_t>* prompt, LinkPrep* prep);

  // Implicit caching: whether `tokens` of tenant are an implicit cache whose KV is stored
  // (then a request links them), and keeping one alive / storing it on first sight
  // (KVGen runs in the background through the scheduler; the next request links it).
  bool ImplicitReady(const std::string& tenant, const std::vector<int32_t>& tokens) const;
  Status RememberImplicit(const std::string& tenant, const std::vector<int32_t>& tokens, int64_t ttl_ms);

  // Drops expired caches and implicit records and erases the store entries of chunks no
  // live record references; returns how many entries were erased.
  int Sweep();

 private:
  // Whether the store holds the chunk's entry `key` (StoreKey): indexed here, or found in
  // a shared tier (another instance's KVGen, --kv-remote) and indexed now.
  bool Have(const std::string& tenant, const std::vector<int32_t>& tokens, bool bos, const std::string& key) const;

  engine::Engine& engine_;
  engine::Scheduler& scheduler_;
  store::KvStore& store_;
  pic::ContextCacheRegistry& registry_;
  ContextCacheOptions options_;
  int32_t bos_id_ = -1;
};

}  // namespace attic::server
