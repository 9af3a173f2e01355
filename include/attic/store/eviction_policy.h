// Eviction policies (paper 001 section 3.3): which stored entry leaves a tier when room
// is needed -- from DRAM it is demoted to SSD, from SSD it leaves the store. Whole
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
#include <unordered_map>
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
};

// Upcoming accesses, from the scheduler's waiting queue: entry key -> position of the
// first queued job that will read it (0 = next to run). Only jobs inside the look-ahead
// eviction window are listed.
struct QueueHint {
  std::unordered_map<std::string, int> position;
  int window = 0;  // jobs in the window
};

enum class PolicyKind { kSchedulerAware, kLru, kFifo };
const char* PolicyName(PolicyKind kind);
StatusOr<PolicyKind> ParsePolicy(const std::string& name);  // "scheduler-aware", "lru", "fifo"

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual PolicyKind kind() const = 0;
  // Picks the entry to move out of tier `from` among `candidates` (all in that tier,
  // non-empty). Never returns null.
  virtual const EntryInfo* PickVictim(TierLevel from, const std::vector<const EntryInfo*>& candidates,
                                      const QueueHint& hint) const = 0;
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

// Scheduler-aware (paper 3.3): entries no queued job in the look-ahead window will read
// go first (least recently used among them); when every candidate is wanted, the one
// whose job is nearest the window's tail (the last to run) goes -- for DRAM->SSD it
// is the entry needed latest, for SSD->out the job last in the queue.
class SchedulerAwarePolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kSchedulerAware; }
  const EntryInfo* PickVictim(TierLevel from, const std::vector<const EntryInfo*>& c,
                              const QueueHint& hint) const override;
};

std::unique_ptr<EvictionPolicy> MakePolicy(PolicyKind kind);

}  // namespace attic::store
