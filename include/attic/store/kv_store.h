// KvStore: AttentionStore's placement layer (paper 001 sections 3.1-3.4). Holds every
// session's KV (pre-RoPE K, V, token ids, positions) in an ordered list of tiers --
// host DRAM, an optional SSD directory, later a shared remote tier (tier.h) -- finds it
// again by session id or by the longest stored token prefix of the same tenant
// (prefix_match.h), and keeps each tier inside its byte capacity by demoting whole
// entries one tier down (out of the store from the last tier) as chosen by an
// EvictionPolicy fed with look-ahead hints from the scheduler's waiting queue; a read
// entry moves back to the top tier. What to fetch ahead of the queue (promotion to the
// top tier, the read buffer) is a PrefetchPolicy's choice.
//
// Identity (DESIGN.md decision 4): a store serves one model. Its SSD tier keeps that
// model's entries in a subdirectory of its own (SsdTier): other models' entries there are
// never opened and never deleted, nor is any file Attic did not write. The model's own
// corrupt or truncated files and interrupted writes are misses, never served, and are
// deleted when found. Tenancy (decision 5): every lookup is scoped to one tenant.
//
// Reads that fail: an entry that moved between tiers while it was read is read again
// from where it went ("moved, retry"); a transient tier error (Unavailable, a timeout)
// is a miss that leaves the entry; an entry gone from its tier is dropped from the index
// (quietly when the tier is shared or evicts by itself); bad bytes (a checksum, another
// model's entry) are dropped and counted as corrupt.
//
// Lifetime: each entry has an expiry (default_ttl_ms, or per save); expired entries are
// never returned and are freed by ExpireNow() or when met. The enumerable tiers survive
// a restart: Open() rebuilds the index from them, verifying every entry's checksums.
//
// Thread-safety: all methods are safe from any thread. Locks (kv_store_place.cc): mu_
// guards the index and is held only for memory work; place_mu_ serializes every change
// of what the tiers hold (saves, demotions, promotions, removals) and is held across
// tier I/O, which happens with mu_ released for any tier that is not local memory, so
// lookups, hints and reads go on meanwhile. Lock order: place_mu_ before mu_; wmu_,
// rmu_ and pmu_ are never held while taking mu_ or place_mu_.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "attic/core/status.h"
#include "attic/store/clock.h"
#include "attic/store/entry.h"
#include "attic/store/kv_loader.h"
#include "attic/store/kv_source.h"
#include "attic/store/turn.h"
#include "attic/store/eviction_policy.h"
#include "attic/store/prefetch_policy.h"
#include "attic/store/tier.h"

namespace attic::store {

// How StoreOptions::reserve_dram provides the DRAM tier's pages.
enum class DramReserve { kNone, kOnDemand, kAtOpen };

struct StoreOptions {
  std::string fingerprint;                  // the served model's fingerprint (required)
  // Element type of the entries the store writes (turns) and finds. Entries of the
  // other dtype are kept and evicted like any but never found by a lookup (the key names
  // the dtype). f32 (the default) is exact whatever the compute buffer's dtype; f16
  // halves the bytes, and with an f16 compute buffer re-enters V bit for bit but K not
  // (the forward rounds K to f16 after RoPE, an entry before it: many elements differ by
  // one f16 unit of their head's largest; docs/store.md "Entry format").
  KvDtype kv_dtype = KvDtype::kF32;
  uint64_t dram_bytes = 1ull << 30;         // host-DRAM tier capacity (--kv-dram-bytes)
  std::string ssd_dir;                      // SSD tier directory; "" = no SSD tier (--kv-ssd-dir)
  uint64_t ssd_bytes = 16ull << 30;         // SSD tier capacity (--kv-ssd-bytes)
  FileEnv* ssd_env = FileEnv::Default();    // the SSD tier's file layer (tests inject faults); not owned
  PolicyKind policy = PolicyKind::kSchedulerAware;  // --kv-policy
  int64_t default_ttl_ms = 24ll * 3600 * 1000;      // session TTL; 0 = never expire (--session-ttl)
  int prefix_block = 16;                    // granularity of the prefix index (tokens)
  // Write buffer of SaveAsync (paper 3.2): KV bytes of saves queued for the writer
  // thread; a save that does not fit waits for room. 0 = SaveAsync saves synchronously.
  uint64_t write_buffer_bytes = 256ull << 20;
  // Nice value of the writer thread (Linux, per thread): on a CPU server the asynchronous
  // save is CPU work, and at the default 10 it takes the cores only when the forward pass
  // leaves them idle or the write buffer is full (paper 3.2: saving off the critical
  // path). 0 = the priority of the thread that opened the store. While a caller waits for
  // a queued save (KvStore::SavePending, a lookup of that session), the writer runs at
  // nice 0 where the system allows raising it back.
  int writer_nice = 10;
  // Pages for the DRAM tier and the write buffer (docs/store.md, "The DRAM tier by
  // default"). kAtOpen: faulted in when the store opens (Bytes::Reserve; a progress bar on
  // a terminal), so that saves reuse them instead of faulting fresh pages on the serving
  // path (`attic serve --kv-dram SIZE`). kOnDemand: the same recycling of freed pages up to
  // that size, but each page faulted in when first used (Bytes::ReserveOnDemand), so
  // memory follows use (`attic serve` without --kv-dram, the automatic tier). kNone: the
  // process-wide pool only, for stores whose capacity is nominal (benchmarks of the
  // policies, tests).
  DramReserve reserve_dram = DramReserve::kNone;
  // Rows turns hold of their own (pre-RoPE K and V of computed slots, kept to save the
  // turn without recomputation), in bytes; 0 = no limit. A turn that would exceed it
  // stops recording and is not saved.
  uint64_t turn_bytes = 0;
  // Write-through to a shared tier (--kv-remote-write through): a save placed in a tier
  // above the first shared tier (a Redis Cluster tier) is also written there at once, as
  // the entry's copy (EntryInfo::copy_level), so other instances find it by session
  // right away. Off (write-back): an entry reaches the shared tier only when it is
  // demoted there. A failed write-through leaves the entry where it was placed.
  bool write_through = false;
  // Saves of sessions whose id starts with this prefix are written through to a shared
  // tier whatever write_through says ("" = none). The server gives the context-cache
  // chunks' prefix ("ctx:", pic::ChunkStoreSession): a cache created on one instance is
  // linked on any other from the shared tier.
  std::string write_through_session_prefix;
  // Streamed loads from tiers that stream layers (TierTraits::streams_layers: the remote
  // tier): a turn's entry is read layer by layer while its first layers already enter
  // and compute (OpenForTurn). Off: read whole and verified before the turn starts.
  bool stream_layers = true;
  // Tests: runs on the writer thread before each queued save (e.g. to hold saves back).
  std::function<void()> before_async_save;
};

// What the store holds for a turn's tokens (FindForTurn): a stored entry, or the
// session's save still queued in the write buffer (read through, not waited for).
struct StoreHit {
  std::string key;                        // the stored entry ("" for a queued save)
  std::shared_ptr<const KvEntry> queued;  // the queued save, or null
  int n_tokens = 0;                       // leading query tokens whose KV it holds
  int entry_tokens = 0;                   // tokens in it
};

struct StoreMatch {
  std::string key;
  int n_tokens = 0;      // leading prompt tokens whose KV the entry holds
  int entry_tokens = 0;  // tokens in the entry
  TierLevel tier = TierLevel::kDram;
};

struct SessionInfo {
  std::string key;
  std::string tenant;
  std::string session_id;
  int n_tokens = 0;
  uint64_t bytes = 0;
  TierLevel tier = TierLevel::kDram;
  int64_t expires_at_ms = 0;
};

// Token ids shared read-only: the scheduler hands the store a view of a waiting job's
// prompt, not a copy per step. Reads as a const std::vector<int32_t>&.
class SharedTokens {
 public:
  SharedTokens() : p_(std::make_shared<const std::vector<int32_t>>()) {}
  SharedTokens(std::vector<int32_t> v) : p_(std::make_shared<const std::vector<int32_t>>(std::move(v))) {}
  SharedTokens(std::shared_ptr<const std::vector<int32_t>> p) : p_(std::move(p)) {}
  operator const std::vector<int32_t>&() const { return *p_; }
  const std::vector<int32_t>& operator*() const { return *p_; }
  const std::vector<int32_t>* operator->() const { return p_.get(); }

 private:
  std::shared_ptr<const std::vector<int32_t>> p_;
};

// A waiting job, as the scheduler sees it (DESIGN.md decision 6).
struct QueuedJob {
  std::string tenant;
  std::string session_id;
  SharedTokens tokens;    // what to look its entry up with (a truncated prompt: as the entry saw it)
  int prompt_tokens = 0;  // the prompt's length (the read buffer's L_new); 0 = tokens' size
  // A stored entry the job reads by key, whatever `tokens` say (a context-cache chunk it
  // links): resolved to that entry, so that eviction keeps it, Prefetch promotes it and
  // the read buffer fetches it ahead like a session's history.
  std::string key{};
};

struct StoreStats {
  uint64_t lookups = 0;
  uint64_t hits_dram = 0;           // tier 0 (every tier's: `tiers` below)
  uint64_t hits_ssd = 0;            // tier 1
  uint64_t misses = 0;
  uint64_t reused_tokens = 0;       // counted by the caller via RecordReuse
  uint64_t saves = 0;
  uint64_t bytes_saved = 0;         // compute -> DRAM/SSD
  uint64_t bytes_loaded = 0;        // DRAM/SSD -> compute
  uint64_t bytes_dram_to_ssd = 0;   // demotions (bytes written one tier down)
  uint64_t bytes_ssd_to_dram = 0;   // promotions and prefetches (bytes moved up to DRAM)
  uint64_t evictions_dram = 0;      // entries moved out of DRAM (tier 0)
  uint64_t evictions_ssd = 0;       // entries moved out of SSD (tier 1; out of the store when it is the last)
  uint64_t prefetches = 0;          // entries promoted to DRAM by Prefetch
  uint64_t prefetches_useful = 0;   // ... then found in DRAM by a request's Lookup before leaving DRAM
  uint64_t saves_not_kept = 0;      // saves the scheduler-aware policy kept in no tier (all wanted sooner)
  uint64_t expired = 0;
  uint64_t corrupt = 0;             // entries found bad and deleted
  // Lookups that missed although an entry of another store type (StoreOptions::kv_dtype)
  // matched their prefix: such an entry is never served (docs/store.md "Which type is
  // stored"), so the request recomputes.
  uint64_t other_type_misses = 0;
  // Reads (of bytes that crossed a persistence boundary: not DRAM's) that found an
  // attachment (entry.h) bad: the attachment is dropped for that read, the KV served.
  uint64_t corrupt_attachments = 0;
  uint64_t async_saves = 0;         // saves done by the writer thread
  uint64_t save_waits = 0;          // SaveAsync calls that waited for write-buffer room
  double save_wait_ms = 0;          // ... total time they waited
  uint64_t write_buffer_hits = 0;   // lookups served from a queued save (ReadQueuedSave)
  uint64_t lookup_waits = 0;        // Lookup/GetSession/SessionTokens/EraseSession calls that
                                    // waited for the tenant's queued saves
  double lookup_wait_ms = 0;        // ... total time they waited
  uint64_t pending_saves = 0;       // queued in the write buffer now
  // Turns (the engine <-> store seam).
  uint64_t turn_bytes = 0;          // rows turns hold of their own now (StoreOptions::turn_bytes)
  uint64_t turns_over_budget = 0;   // turns that stopped recording at the budget (not saved)
  uint64_t staged = 0;              // read-buffer fetches issued
  uint64_t staged_used = 0;         // read-buffer fetches a turn then used
  double fetch_seconds = 0;         // fetch + verify of a turn's source at its admission (not staged)
  double t_load_per_token = 0;      // measured entering time (EMA), seconds per token
  double t_prefill_per_token = 0;   // the engine's prefill rate as reported (EMA), seconds per token
  uint64_t entries = 0;
  uint64_t dram_bytes = 0, dram_capacity = 0;  // tier 0
  uint64_t ssd_bytes = 0, ssd_capacity = 0;    // tier 1
  uint64_t read_errors = 0;         // transient tier read failures: misses, the entries kept
  // Tier writes that failed (a full or failing disk, a remote tier that does not answer):
  // the entry stays where it was or, when it had no other place, is not kept; the store
  // keeps serving from the tiers that work. A warning is logged when a tier starts
  // failing and when it works again.
  uint64_t write_errors = 0;
  uint64_t vanished = 0;            // entries found gone from a shared or self-evicting tier
  uint64_t shared_found = 0;        // entries another instance saved, found by session in a shared tier
  uint64_t shared_superseded = 0;   // of those, later turns of a session indexed here (its older turn dropped)
  uint64_t write_throughs = 0;      // saves also written to a shared tier (StoreOptions::write_through)
  uint64_t write_through_errors = 0;  // ... that failed (the entry stayed local)
  uint64_t streamed_loads = 0;      // turns' entries read layer by layer from a streaming tier
  uint64_t stream_failures = 0;     // ... whose read failed after the turn started (recomputed)
  // Per tier, in the store's order (hits_dram, evictions_dram, ... are tiers 0 and 1's).
  struct Tier {
    std::string name;
    uint64_t entries = 0, bytes = 0, capacity = 0;
    uint64_t hits = 0;       // lookups that found their entry there
    uint64_t evictions = 0;  // entries moved out of it (down a tier, or out of the store)
  };
  std::vector<Tier> tiers;
};

// What KvStore::Open found: `attic serve` prints it at start-up (FormatOpenReport).
struct StoreOpenReport {
  std::string ssd_root;                  // the SSD store directory; "" = no SSD tier (or a caller-made one)
  std::string ssd_dir;                   // this model's subdirectory of it
  bool ssd_created = false;              // a new store: the directory was new or empty
  uint64_t dram_entries = 0, dram_bytes = 0;  // restored per tier (DRAM: only a caller-made tier has any)
  uint64_t ssd_entries = 0, ssd_bytes = 0;
  uint64_t removed_temp_files = 0;       // this model's interrupted writes
  uint64_t removed_corrupt = 0;          // this model's corrupt, truncated or misnamed entries (logged)
  uint64_t removed_expired = 0;
  uint64_t evicted = 0;                  // over a capacity smaller than what was stored
  uint64_t other_model_entries = 0, other_model_bytes = 0;  // kept, not opened, not counted
  uint64_t other_models = 0;
  uint64_t foreign = 0;                  // files and directories not Attic's: never touched
  std::string foreign_example;
};

// One line without the "attic: " prefix, e.g. "KV store: restored 12 entries (1.2 GiB) from
// SSD /data/kv/<model>; removed 1 stale temporary file; kept 3 entries of 1 other model
// (167.0 MiB, not counted against --kv-ssd-bytes); ignored 4 files not Attic's (e.g.
// 'notes.txt'), left untouched".
std::string FormatOpenReport(const StoreOpenReport& report);

class KvStore {
 public:
  // Opens the store: makes the tiers from `options` (DRAM, and SSD when ssd_dir is
  // given), rebuilds the index from the enumerable ones. `clock` (null = SystemClock)
  // must outlive the store.
  static StatusOr<std::unique_ptr<KvStore>> Open(const StoreOptions& options, const Clock* clock = nullptr);
  // The tiers Open(options) makes, fastest first: DRAM, and SSD when ssd_dir is given.
  // A caller with a remote tier appends it and opens the store with the list.
  static StatusOr<std::vector<std::unique_ptr<Tier>>> LocalTiers(const StoreOptions& options);
  // Same with caller-made tiers, fastest first (tests, remote tiers): tiers[0] takes
  // saves, the last one's victims leave the store. At least one tier, none null.
  static StatusOr<std::unique_ptr<KvStore>> Open(const StoreOptions& options, std::vector<std::unique_ptr<Tier>> tiers,
                                                 const Clock* clock);
  // The usual two: `ssd` may be null.
  static StatusOr<std::unique_ptr<KvStore>> Open(const StoreOptions& options, std::unique_ptr<Tier> dram,
                                                 std::unique_ptr<Tier> ssd, const Clock* clock);
  // Finishes queued saves.
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Longest stored KV for `tokens` of `tenant`: the entry of `session_id` (when given
  // and stored), else the entry with the longest common token prefix. nullopt = miss.
  // Counts a lookup and a hit/miss.
  std::optional<StoreMatch> Lookup(const std::string& tenant, const std::string& session_id,
                                   const std::vector<int32_t>& tokens);
  // Reads and verifies an entry. An entry of a lower tier is promoted to DRAM when it
  // fits (under the scheduler-aware policy: unless it would be DRAM's first victim
  // itself). Failures as Fetch's.
  StatusOr<KvEntry> Load(const std::string& key);
  // Stores `entry` (fingerprint must be empty or the store's). Replaces the previous
  // entry of the same (tenant, session_id), and `replaces` when non-empty. ttl_ms < 0 =
  // default. ResourceExhausted when it fits no tier.
  Status Save(KvEntry entry, const std::string& replaces = "", int64_t ttl_ms = -1);
  // Queues the save for the writer thread and returns (the caller's turn does not wait
  // for the write). Lookups, GetSession and EraseSession of the same session (of the
  // same tenant, for a lookup without a session id) wait for its queued saves first, so
  // a queued save of that session is never missed. Errors are logged. Returns the
  // entry as queued (stamped, immutable): a caller that keeps using its rows (a
  // sequence that stays resident) shares them instead of keeping a copy.
  std::shared_ptr<const KvEntry> SaveAsync(KvEntry entry, const std::string& replaces = "", int64_t ttl_ms = -1);
  // Whether a Lookup of (tenant, session_id, tokens) would wait for a queued save now (a
  // caller that must not block, like the scheduler's step loop, tries again later). With
  // a session id that is a queued save of the session; without, a queued save of the
  // tenant sharing a longer prefix with `tokens` than any stored entry does. Either way a
  // wait makes the writer urgent: it runs at normal priority (not writer_nice) until the
  // write buffer is empty.
  bool SavePending(const std::string& tenant, const std::string& session_id, const std::vector<int32_t>& tokens);
  // Read-through of the write buffer (paper 3.2: the next job never waits for a save):
  // the newest queued or in-flight save of the session (session ids only) sharing a
  // prefix with `tokens`, held shared while the writer stores it; *n_common = the
  // shared prefix. nullptr when there is none. The caller that reuses it reports the
  // hit with RecordWriteBufferHit.
  std::shared_ptr<const KvEntry> ReadQueuedSave(const std::string& tenant, const std::string& session_id,
                                                const std::vector<int32_t>& tokens, int* n_common) const;
  // A lookup served by ReadQueuedSave: a DRAM hit (the write buffer is host memory),
  // also counted in write_buffer_hits.
  void RecordWriteBufferHit();
  // Waits until every queued save is done.
  void Flush();
  // For a server about to stop, so that a restart finds what DRAM held: after Flush(),
  // moves every DRAM-tier entry one tier down when that tier survives a restart on this
  // machine (local, neither memory nor shared: the SSD tier), least recently used first,
  // making room there as eviction does (an entry that fits nowhere leaves the store, as
  // it would leave the process). Entries with an SSD copy move without a write. Nothing
  // happens without such a tier. Safe while other calls run, but meant for a store no
  // request uses any more (what they save meanwhile stays in DRAM).
  struct PersistReport {
    uint64_t entries = 0;        // DRAM entries now in the tier below
    uint64_t bytes_written = 0;  // bytes written for them (entries with a copy there: none)
    uint64_t dropped = 0;        // entries that did not stay there (no room: further down or out)
  };
  PersistReport PersistDram();
  // Tokens a request reused from the store (StoreStats::reused_tokens), recorded once
  // its load entered them all.
  void RecordReuse(int n_tokens);

  // --- Streaming load (layer-wise pre-loading, paper 3.2; kv_store_read.cc) ---
  // An entry's serialized bytes, shared rather than copied out of the DRAM tier, with
  // its parsed header; layer l's K/V are EntryLayerK/V(*bytes, header, l).
  struct Fetched {
    SharedBytes bytes;
    EntryHeader header;
  };
  // Reads `key`'s entry without deserializing it: tier I/O happens outside the store's
  // lock; every layer's checksum is verified (the header only for a local-memory
  // tier's bytes); an entry of a lower tier is promoted to DRAM when it fits (as Load).
  // An entry that moves meanwhile is read again where it went. A transient tier error
  // is Unavailable (a miss; the entry stays); a bad or vanished entry is dropped and
  // reported as NotFound.
  StatusOr<Fetched> Fetch(const std::string& key);
  // The entry's bytes if it sits in the DRAM tier now (header checked, nothing read
  // from a lower tier, nothing waited for, no statistics or recency touched); NotFound
  // otherwise.
  // For a caller that holds the same rows elsewhere and would rather share the tier's.
  StatusOr<Fetched> FetchFromDram(const std::string& key);
  // Lookup without counting it (read-buffer planning); *bytes = the entry's size.
  std::optional<StoreMatch> Peek(const std::string& tenant, const std::string& session_id,
                                 const std::vector<int32_t>& tokens, uint64_t* bytes);
  // --- end streaming load ---

  StatusOr<SessionInfo> GetSession(const std::string& tenant, const std::string& session_id);
  // Token ids of the session's stored entry (NotFound when none or expired).
  StatusOr<std::vector<int32_t>> SessionTokens(const std::string& tenant, const std::string& session_id);
  Status EraseSession(const std::string& tenant, const std::string& session_id);
  // The tenant's stored sessions (expired ones left out), ordered by session id (bytewise
  // ascending). Waits for the tenant's queued saves first, like GetSession.
  std::vector<SessionInfo> ListSessions(const std::string& tenant);
  bool Contains(const std::string& key) const;
  std::optional<TierLevel> TierOf(const std::string& key) const;
  // Asks the shared tiers for the session's newest entry (another instance saved it),
  // checks its header and indexes it where it is (a no-op without a shared tier). When
  // the session is indexed here already, only with the request's `tokens` given, and
  // only if that entry shares more of them than the indexed one (a later turn saved by
  // another instance: the turn it continues is then dropped, as a save of it here
  // would). Tier I/O with no lock held; takes place_mu_ and mu_ to index.
  // REQUIRES: neither held.
  void DiscoverSession(const std::string& tenant, const std::string& session_id,
                       const std::vector<int32_t>* tokens = nullptr);
  int n_tiers() const { return static_cast<int>(tiers_.size()); }
  // The name tier `level` gives itself ("dram", "ssd", ...).
  std::string tier_name(TierLevel level) const { return tiers_.at(TierIndex(level))->name(); }

  // Look-ahead hint: the waiting queue, next job first. Every job shown is resolved to
  // the entry it would read; the eviction window is (C_mem + C_disk) / S_kv of them.
  void SetLookAhead(std::vector<QueuedJob> jobs);
  // Prefetch (paper 3.3, part of the scheduler-aware policy; a no-op under LRU/FIFO):
  // promotes the lower-tier entries the PrefetchPolicy picks from the look-ahead queue
  // (jobs in the prefetch window: DRAM capacity / mean entry size) to DRAM, evicting
  // only entries not wanted sooner. Reads happen outside the store's lock. Returns the
  // number promoted.
  int Prefetch();
  // Runs Prefetch on the store's prefetch thread (started when there is a tier below
  // DRAM and the policy promotes); returns at once.
  void RequestPrefetch();
  // Frees expired entries; returns how many.
  int ExpireNow();

  // --- Turns: the engine <-> store seam (turn.h; kv_store_turn.cc) ---
  // The compute buffer stored KV enters: the engine's KV pool and RoPE table (both must
  // outlive the store), and the loader thread that enters KV into it. Call once, before
  // the first turn.
  void AttachComputeBuffer(kv::BlockPool* pool, const attention::RopeTable* rope);
  bool has_compute_buffer() const { return pool_ != nullptr; }
  const kv::KvShape& compute_shape() const { return pool_->shape(); }
  // The dtype of the entries the store writes and finds (StoreOptions::kv_dtype).
  KvDtype kv_dtype() const { return options_.kv_dtype; }
  KvLoader& loader() { return *loader_; }
  // A turn of (tenant, session) with no slot yet. REQUIRES: AttachComputeBuffer.
  std::unique_ptr<Turn> NewTurn(const std::string& tenant, const std::string& session_id, int64_t ttl_ms = -1);
  // What the store holds for `tokens` of (tenant, session): with read_queued, the
  // session's newest save still in the write buffer (sharing a prefix with tokens), read
  // through instead of waited for; else as Lookup (waits for a queued save the lookup
  // depends on; counts a lookup and a hit or miss). nullopt = miss.
  std::optional<StoreHit> FindForTurn(const std::string& tenant, const std::string& session_id,
                                      const std::vector<int32_t>& tokens, bool read_queued);
  // Whether finding KV for `tokens` now would wait for a queued save of the session (or,
  // without a session id, of the tenant) that cannot be read through: a caller that must
  // not block (the step loop) tries again later. Makes the writer urgent (SavePending).
  bool MustWaitForSave(const std::string& tenant, const std::string& session_id, const std::vector<int32_t>& tokens,
                       bool read_queued);
  // The hit's KV, ready to enter: a queued save as it is (counted as a write-buffer
  // hit), a stored entry fetched and verified (from the read buffer when it was fetched
  // ahead), or -- an entry of a tier that streams layers, with StoreOptions::
  // stream_layers -- its header read and checked, its layers still arriving (a streamed
  // KvSource: the caller waits per layer, and a read that fails later fails the source,
  // never delivers wrong rows). NotFound when it is gone or bad (a miss; a bad entry is
  // dropped).
  StatusOr<std::shared_ptr<const KvSource>> OpenForTurn(const StoreHit& hit);
  // Read buffer (paper 3.2): bytes of stored entries of the next waiting jobs
  // (SetLookAhead) that the loader fetches and verifies ahead of their admission; -1 =
  // sized per job by the paper's S_buf = B * (T_load * L_hist - T_pref * L_new) from the
  // measured load and prefill rates; 0 = none (the default). Entries sharing fewer than
  // `min_tokens` tokens with a job are not fetched. Needs AttachComputeBuffer.
  void SetReadBuffer(int64_t bytes, int min_tokens);
  // The engine's measured prefill rate (seconds per token), for the read buffer's S_buf.
  void ReportPrefillRate(double seconds_per_token);
  // The read buffer's and the rates' part of Stats(), without the store's main lock
  // (the step loop publishes it every step).
  struct ReadBufferStats {
    uint64_t staged = 0, staged_used = 0;
    double fetch_seconds = 0, t_load_per_token = 0, t_prefill_per_token = 0;
  };
  ReadBufferStats ReadBuffer() const;

  StoreStats Stats() const;
  const StoreOptions& options() const { return options_; }
  // What Open found (fixed once Open has returned).
  const StoreOpenReport& open_report() const { return open_report_; }

 private:
  friend class Turn;
  // Turn-bytes accounting (StoreOptions::turn_bytes).
  void AddTurnBytes(int64_t delta) { turn_bytes_.fetch_add(static_cast<uint64_t>(delta)); }
  bool TryAddTurnBytes(uint64_t add);
  // A finished load, for the measured entering rate (S_buf's T_load).
  void ReportLoad(double enter_seconds, int rows);
  // Read buffer: starts fetching the stored entries of the next waiting jobs that the
  // PrefetchPolicy picks (called by SetLookAhead; takes mu_ briefly, then rmu_).
  void StageReads(const std::vector<QueuedJob>& jobs);
  KvStore(const StoreOptions& options, std::vector<std::unique_ptr<Tier>> tiers, const Clock* clock);
  Status Rebuild();

  // --- Shared tiers (kv_store_shared.cc) ---
  // DiscoverSession for the first few queued jobs (SetLookAhead) with a session id, each
  // session at most once a second: on the prefetch thread, so that their admission finds
  // them (or their later turn another instance saved) indexed, and the prefetch policy
  // can promote them, instead of asking the shared tier on the step loop. REQUIRES: neither place_mu_ nor mu_ held.
  void DiscoverQueued();
  // Write-through of a placed entry (`info` at its tier, not yet indexed): writes
  // `bytes` to the first shared tier below it and sets info->copy_level on success.
  // REQUIRES: place_mu_ held and `lock` holding mu_ (released around the write).
  void WriteThrough(std::unique_lock<std::mutex>& lock, EntryInfo* info, const SharedBytes& bytes);

  // --- Reads (kv_store_read.cc) ---
  // Where a read of `key` starts: its tier and version then, or its bytes when it is
  // being promoted (in_transit). Waits for a prefetch reading it; counts the access.
  // NotFound when it is not indexed or expired (an expired entry is removed).
  struct ReadStart {
    int level = 0;
    uint64_t version = 0;
    std::optional<Fetched> in_transit;
  };
  StatusOr<ReadStart> BeginRead(const std::string& key);
  // One attempt of Fetch; *moved = the entry moved between tiers while it was read.
  StatusOr<Fetched> FetchOnce(const std::string& key, bool* moved);
  // After a read of `key` from `level` (the entry's `version` then) failed with `why`: *moved
  // when the entry moved meanwhile (read it again), else ReadFailed's answer.
  Status ReadFailedOrMoved(const std::string& key, int level, uint64_t version, const Status& why, bool* moved);
  // A verified read of `key` from a lower tier: promoted to the top tier when it fits and
  // is still where it was read. Takes place_mu_ and mu_: REQUIRES neither held.
  void PromoteRead(const std::string& key, int level, uint64_t version, const Fetched& read);

  // --- Streamed reads (kv_store_stream.cc) ---
  // OpenForTurn of an entry on a tier that streams layers: reads and checks its header,
  // queues the read of its layers on the streamer thread and returns the streamed
  // source at once. nullopt when the entry is not on such a tier (read it with Fetch).
  std::optional<StatusOr<std::shared_ptr<const KvSource>>> OpenStreamed(const std::string& key);
  // One streamed read (on the streamer thread): the attachments, then layer after
  // layer, each verified and published; then promoted to DRAM like a Fetch.
  struct StreamRead;
  void RunStreamRead(StreamRead& s);
  void StreamerLoop();
  // Reads `key` from `tier` and checks header, size, fingerprint and name (and the layer
  // checksums unless !check_layers). Takes no lock.
  StatusOr<Fetched> ReadChecked(Tier& tier, const std::string& key, bool check_layers) const;
  // Verifies each attachment of a read entry (`bytes`, header `h`): a bad one is counted
  // and logged, and its reader goes without it (the KV is served).
  void CheckAttachments(const std::string& key, std::string_view bytes, const EntryHeader& h) const;
  // Whether a read of `level` verifies every layer (bytes that crossed a boundary).
  bool ChecksLayers(int level) const { return !traits_[level].local_memory; }
  // A failed read of `key` from `level` (the entry's `version` then): a miss that leaves
  // the entry (transient), or the entry dropped (vanished: quietly from a shared or
  // self-evicting tier; corrupt: logged and counted). Returns NotFound or Unavailable for
  // the caller. Takes place_mu_ and mu_: REQUIRES neither held.
  Status ReadFailed(const std::string& key, int level, uint64_t version, const Status& why);

  // --- Index (kv_store_index.cc). REQUIRES: mu_ held. ---
  std::vector<uint64_t> PrefixHashes(const std::string& tenant, const std::vector<int32_t>& tokens) const;
  void IndexLocked(EntryInfo info);
  bool Expired(const EntryInfo& e) const;
  std::optional<StoreMatch> FindLocked(const std::string& tenant, const std::string& session_id,
                                       const std::vector<int32_t>& tokens, bool* other_type = nullptr);
  // The entry FindLocked would pick; *n_tokens = its common prefix with `tokens`.
  // *other_type (when given): whether an entry of another store type matched (skipped).
  EntryInfo* FindEntryLocked(const std::string& tenant, const std::string& session_id,
                             const std::vector<int32_t>& tokens, int* n_tokens, bool* other_type = nullptr);
  // The entry `job` would read, as a PrefetchPolicy sees it (key "" = none).
  AheadEntry ResolveLocked(const QueuedJob& job);
  // The index as the PrefetchPolicy sees it (kv_store_prefetch.cc). REQUIRES: mu_ held
  // while it is used.
  class IndexView;

  // --- Placement (kv_store_place.cc). REQUIRES: place_mu_ held and `lock` holding mu_;
  // mu_ is released around the I/O of tiers that are not local memory. ---
  // Runs `io` (a call on tier `level`) with mu_ released unless the tier is local memory.
  Status TierIo(std::unique_lock<std::mutex>& lock, int level, const std::function<Status()>& io);
  // TierIo of a PutShared of `key` into tier `level`, counting a failure (write_errors)
  // and logging when the tier starts or stops failing. REQUIRES: lock held.
  Status TierPut(std::unique_lock<std::mutex>& lock, int level, const std::string& key, const SharedBytes& bytes);
  // Removes `key` from the index: its copies in local-memory tiers are erased now, the
  // others queued for EraseDoomed.
  void Unindex(const std::string& key);
  // Erases the queued copies the index no longer names (tier I/O with mu_ released).
  void EraseDoomed(std::unique_lock<std::mutex>& lock);
  // Frees `need` bytes in `level` (excluding `pinned`): a victim goes one tier down
  // (Demote), from the last tier out of the store. ResourceExhausted when impossible.
  // With `newcomer` (the entry that needs the room) and a policy that RanksNewcomer():
  // when the newcomer itself is the victim, stops and sets *newcomer_lost (room is then
  // not made). A tier that evicts by itself makes its own room: nothing is done.
  Status MakeRoom(std::unique_lock<std::mutex>& lock, int level, uint64_t need, const std::string& pinned,
                  const EntryInfo* newcomer = nullptr, bool* newcomer_lost = nullptr);
  // Moves the victim `v` out of `level`: to the tier of its copy (nothing written), else
  // written to the tier below (whose room is made first), else out of the store.
  void Demote(std::unique_lock<std::mutex>& lock, EntryInfo& v, int level, const std::string& pinned);
  // Moves `key`, an entry of a lower tier whose bytes were just read (and verified), to
  // the top tier; its lower copy stays as a droppable one (copy_level), dropped first
  // whenever that tier needs room, so that entries demoted to make room can take its
  // place. While it moves, a Fetch of it is served the read bytes. Returns whether it is
  // in the top tier now; otherwise it stays where it was, or is dropped when not even
  // that fits any more.
  bool Promote(std::unique_lock<std::mutex>& lock, const std::string& key, const Fetched& read);
  // Removes `key` (takes place_mu_ and mu_; REQUIRES neither held) when `still` holds
  // for its entry then. Returns whether it did.
  bool RemoveIf(const std::string& key, const std::function<bool(const EntryInfo&)>& still);
  uint64_t MeanEntryBytesLocked() const;
  void WriterLoop();
  // Save of an entry whose fingerprint and expiry are filled in (SaveAsync fills them
  // when it queues it).
  Status Place(const KvEntry& entry, const std::string& replaces);
  // Fills in the default fingerprint and the expiry from the TTL.
  void Stamp(KvEntry* entry, int64_t ttl_ms) const;
  void PrefetchLoop();
  // The longest common prefix of `tokens` with a stored entry of `tenant` (takes mu_).
  int StoredPrefix(const std::string& tenant, const std::vector<int32_t>& tokens);
  // Whether a lookup must wait for the queued saves it could read (see SavePending;
  // `tokens` null: every queued save of the session, or of the tenant without a session
  // id); then the writer is made urgent, and with `wait` the call waits for them. The
  // prefix search runs only when something is queued.
  bool AwaitQueuedSaves(const std::string& tenant, const std::string& session_id, const std::vector<int32_t>* tokens,
                        bool wait);
  // REQUIRES: wmu_ held.
  bool AwaitedLocked(const std::string& tenant, const std::string& session_id, const std::vector<int32_t>* tokens,
                     int stored) const;

  const StoreOptions options_;
  const Clock* clock_;
  std::unique_ptr<Bytes::Reservation> reserved_;  // options_.reserve_dram: the tier's (and write buffer's) pages
  const std::vector<std::unique_ptr<Tier>> tiers_;  // fastest first; tiers_[i] is TierAt(i)
  std::vector<bool> tier_failing_;                  // [level]: its last write failed (TierPut; mu_)
  const std::vector<TierTraits> traits_;            // tiers_[i]->traits()
  const bool any_shared_;                           // some tier is shared (the Discover* calls ask it)
  std::unique_ptr<EvictionPolicy> policy_;
  std::unique_ptr<PrefetchPolicy> prefetch_;

  std::mutex place_mu_;  // serializes changes of the tiers' contents (see the header comment)
  mutable std::mutex mu_;
  // Entries are inserted and erased only with place_mu_ held too.
  std::unordered_map<std::string, EntryInfo> entries_;
  std::vector<std::pair<int, std::string>> doomed_;  // (level, key): copies to erase (EraseDoomed)
  // Sessions DiscoverQueued asked the shared tiers for (tenant '\0' session id -> when,
  // clock ms): not asked again within a second. Bounded (cleared past 4096).
  std::unordered_map<std::string, int64_t> discover_tried_;
  // Entries being promoted, by key: their read bytes, served to a Fetch meanwhile.
  std::unordered_map<std::string, Fetched> in_transit_;
  std::unordered_map<std::string, std::string> sessions_;  // tenant '\0' session_id -> key
  std::unordered_map<uint64_t, std::unordered_set<std::string>> prefixes_;  // block-prefix hash -> keys
  std::vector<QueuedJob> queue_;
  QueueHint hint_;
  uint64_t seq_ = 0;
  uint64_t version_seq_ = 0;  // the last EntryInfo::version given (indexing, moves)
  StoreStats stats_;
  StoreOpenReport open_report_;  // written by Rebuild only

  // Write buffer (SaveAsync). Lock order: never hold mu_ while taking wmu_.
  struct PendingSave {
    std::shared_ptr<const KvEntry> entry;  // stamped (SaveAsync); shared with ReadQueuedSave's readers
    std::string replaces;
    uint64_t bytes = 0;
  };
  mutable std::mutex wmu_;
  std::condition_variable wcv_;
  std::deque<PendingSave> pending_;
  uint64_t pending_bytes_ = 0;
  std::shared_ptr<const KvEntry> writing_;  // the save the writer has popped and not yet placed
  std::unordered_map<std::string, int> pending_tenants_;  // queued + in flight
  uint64_t async_saves_ = 0, save_waits_ = 0, lookup_waits_ = 0;
  double save_wait_ms_ = 0, lookup_wait_ms_ = 0;
  bool stop_writer_ = false;
  int writer_tid_ = 0;         // the writer's thread id (for its priority)
  bool writer_urgent_ = false;  // running at normal priority: a caller waits on a save
  void SetWriterUrgentLocked(bool urgent);
  std::thread writer_;

  // The entry the prefetcher is reading from a lower tier now (guarded by mu_); a Fetch
  // of it waits (prefetch_done_) instead of reading it a second time.
  std::string prefetching_;
  std::condition_variable prefetch_done_;

  // Prefetch thread (RequestPrefetch).
  std::mutex pmu_;
  std::condition_variable pcv_;
  bool prefetch_requested_ = false;
  bool stop_prefetcher_ = false;
  std::thread prefetcher_;

  // Streamer thread (OpenStreamed), started by the first streamed read.
  std::mutex smu_;
  std::condition_variable scv_;
  std::deque<std::shared_ptr<StreamRead>> stream_reads_;
  std::atomic<bool> stop_streamer_{false};
  std::thread streamer_;

  // Turns (kv_store_turn.cc).
  kv::BlockPool* pool_ = nullptr;
  const attention::RopeTable* rope_ = nullptr;
  std::unique_ptr<KvLoader> loader_;
  std::atomic<uint64_t> turn_bytes_{0};
  mutable std::atomic<uint64_t> corrupt_attachments_{0};  // StoreStats::corrupt_attachments
  std::atomic<uint64_t> turns_over_budget_{0};
  mutable std::mutex rmu_;  // the read buffer and the rates; never held while taking mu_ or place_mu_
  std::unordered_map<std::string, std::shared_ptr<StagedFetch>> staged_;  // entry key -> fetch
  int64_t read_buffer_bytes_ = 0;
  int read_buffer_min_tokens_ = 8;
  uint64_t staged_count_ = 0, staged_used_ = 0;
  double fetch_seconds_ = 0, t_load_ = 0, t_prefill_ = 0;
};

}  // namespace attic::store
