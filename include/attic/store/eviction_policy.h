// Eviction policies (paper 001 section 3.3): which stored entry leaves a tier when room
// is needed -- it is demoted to the tier below (DRAM -> SSD -> ...), and from the last
// tier it leaves the store. Whole
// entries (one per session turn) are the unit, as in the paper.
//
// A policy only ranks; the KvStore keeps the metadata (EntryInfo) and the look-ahead
// hint from the scheduler's waiting queue, and performs the move.
//
// Thread-safety: policies are stateless and const; safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "attic/store/tier.h"

namespace attic::store {

// What the store knows about one entry (metadata, separate from the bytes).
struct EntryInfo {
  std::string key;
  std::string tenant;
  std::string session_id;
  std::vector<int32_t> tokens;
  uint64_t bytes = 0;
  TierLevel tier = TierLevel::kDram;
  int64_t expires_at_ms = 0;  // 0 = never
  uint64_t inserted_seq = 0;  // when first stored (FIFO order)
  uint64_t access_seq = 0;    // last save or load (LRU order)
  bool prefetched = false;    // promoted by Prefetch and not yet read from DRAM
  // A promoted entry keeps its bytes in the tier it came from (inclusive tiers): the
  // level of that copy, or -1. Demoting it again writes nothing; the copy is dropped
  // first whenever that tier needs room.
  int copy_level = -1;
  // Tier moves: `moving` while a promotion's I/O runs outside the store's lock, and
  // `version` is new at every indexing and every move begun, from one store-wide count
  // (a read that fails after it changed raced with a move or a new save of the key). It
  // never repeats: an entry saved again and moved back to where a read of the old one
  // began, after as many moves, is still told apart from it.
  bool moving = false;
  uint64_t version = 0;
  // Upcoming access, from the scheduler's waiting queue (KvStore::SetLookAhead): the
  // position of the first queued job that will read this entry (0 = next to run), or
  // -1 when no job the scheduler showed will.
  int queue_position = -1;
};

// The look-ahead eviction window: positions < window are inside it ((C_mem + C_disk) /
// S_kv jobs, paper 3.3.2); larger ones are queued behind it.
struct QueueHint {
  int window = 0;
};

enum class PolicyKind { kSchedulerAware, kLru, kFifo };
const char* PolicyName(PolicyKind kind);
StatusOr<PolicyKind> ParsePolicy(const std::string& name);  // "scheduler-aware", "lru", "fifo"

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual PolicyKind kind() const = 0;
  // Picks the entry to move out of tier `from` among `candidates` (non-empty). Never
  // returns null.
  virtual const EntryInfo* PickVictim(TierLevel from, const std::vector<const EntryInfo*>& candidates,
                                      const QueueHint& hint) const = 0;
  // Whether an entry entering a tier (a save, a demotion from DRAM, a promotion) is
  // ranked with the entries already there: when it would be the victim itself it goes
  // to the tier below, or leaves the store, instead of displacing an entry needed
  // sooner. false: the newcomer always enters (classic LRU/FIFO caches).
  virtual bool RanksNewcomer() const { return false; }
};

// Least recently saved/loaded first.
class LruPolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kLru; }
  const EntryInfo* PickVictim(TierLevel, const std::vector<const EntryInfo*>& c, const QueueHint&) const override;
};

// First stored first.
class FifoPolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kFifo; }
  const EntryInfo* PickVictim(TierLevel, const std::vector<const EntryInfo*>& c, const QueueHint&) const override;
};

// Scheduler-aware (paper 3.3.2): entries that no queued job will read go first (least
// recently used among them); then entries of jobs queued behind the eviction window,
// the last in the queue first; entries of jobs inside the window are exempt until every
// candidate is one, and then the one nearest the window's tail goes. For DRAM->SSD that
// is "the item at the tail of the window has a higher priority to be evicted", for
// SSD->out "the last arrived job in the queue" (Fig. 9) -- in both tiers the entry read
// last goes first, which under the FCFS queue is also the furthest next use. Newcomers
// (saves, demotions) are ranked with the residents.
class SchedulerAwarePolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kSchedulerAware; }
  const EntryInfo* PickVictim(TierLevel from, const std::vector<const EntryInfo*>& c,
                              const QueueHint& hint) const override;
  bool RanksNewcomer() const override { return true; }
};

std::unique_ptr<EvictionPolicy> MakePolicy(PolicyKind kind);

}  // namespace attic::store
