#include "attic/store/eviction_policy.h"

#include <chrono>

#include "attic/store/clock.h"

namespace attic::store {

int64_t SystemClock::NowMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

SystemClock* SystemClock::Default() {
  static SystemClock clock;
  return &clock;
}

const char* PolicyName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kSchedulerAware: return "scheduler-aware";
    case PolicyKind::kLru: return "lru";
    case PolicyKind::kFifo: return "fifo";
  }
  return "unknown";
}

StatusOr<PolicyKind> ParsePolicy(const std::string& name) {
  if (name == "scheduler-aware" || name == "ca") return PolicyKind::kSchedulerAware;
  if (name == "lru") return PolicyKind::kLru;
  if (name == "fifo") return PolicyKind::kFifo;
  return InvalidArgumentError("unknown KV policy '" + name + "' (expected scheduler-aware, lru or fifo)");
}

const EntryInfo* LruPolicy::PickVictim(TierLevel, const std::vector<const EntryInfo*>& c, const QueueHint&) const {
  const EntryInfo* best = nullptr;
  for (const EntryInfo* e : c)
    if (best == nullptr || e->access_seq < best->access_seq) best = e;
  return best;
}

const EntryInfo* FifoPolicy::PickVictim(TierLevel, const std::vector<const EntryInfo*>& c, const QueueHint&) const {
  const EntryInfo* best = nullptr;
  for (const EntryInfo* e : c)
    if (best == nullptr || e->inserted_seq < best->inserted_seq) best = e;
  return best;
}

const EntryInfo* SchedulerAwarePolicy::PickVictim(TierLevel, const std::vector<const EntryInfo*>& c,
                                                  const QueueHint&) const {
  // Entries inside and behind the window are ordered alike (the last queued job's
  // entry first), so the window only bounds how far the scheduler must show the queue.
  const EntryInfo* unwanted = nullptr;  // LRU among entries no queued job will read
  const EntryInfo* tail = nullptr;      // wanted entry of the latest queued job
  for (const EntryInfo* e : c) {
    if (e->queue_position < 0) {
      if (unwanted == nullptr || e->access_seq < unwanted->access_seq) unwanted = e;
    } else if (tail == nullptr || e->queue_position > tail->queue_position) {
      tail = e;
    }
  }
  return unwanted != nullptr ? unwanted : tail;
}

std::unique_ptr<EvictionPolicy> MakePolicy(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kLru: return std::make_unique<LruPolicy>();
    case PolicyKind::kFifo: return std::make_unique<FifoPolicy>();
    case PolicyKind::kSchedulerAware: break;
  }
  return std::make_unique<SchedulerAwarePolicy>();
}

}  // namespace attic::store
