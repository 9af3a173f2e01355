// PrefetchPolicy: what the KV store fetches ahead of the scheduler's waiting queue
// (paper 001 sections 3.2, 3.3). Two decisions, both from the look-ahead hint:
//   - promotion (prefetch): which lower-tier entry of a job in the prefetch window to
//     move to the top tier (DRAM) before the job runs, evicting only entries that no job
//     before it reads;
//   - the read buffer: which stored entries of the next waiting jobs to read and verify
//     into memory before their admission, within a byte budget or the paper's per-job
//     S_buf = B * (T_load * L_hist - T_pref * L_new).
// A policy only decides, through a read-only PrefetchView of the store; the store does
// the I/O (KvStore::Prefetch, KvStore::StageReads).
//
// Thread-safety: policies are stateless and const; a view is used by one thread (the
// store's, under its lock).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attic/store/eviction_policy.h"
#include "attic/store/tier.h"

namespace attic::store {

// The stored entry a waiting job would read, as the store resolves it.
struct AheadEntry {
  std::string key;  // "" = none
  TierLevel tier = TierLevel::kDram;
  uint64_t bytes = 0;
  int n_tokens = 0;       // leading tokens of the job's lookup tokens the entry holds (L_hist)
  int prompt_tokens = 0;  // the job's prompt length (L_hist + L_new)
};

// What a prefetch policy sees of the store.
class PrefetchView {
 public:
  virtual ~PrefetchView() = default;
  // Jobs shown by the last look-ahead hint, next to run first.
  virtual int queued() const = 0;
  // The entry job `position` (< queued()) would read.
  virtual AheadEntry Resolve(int position) const = 0;
  virtual uint64_t capacity(TierLevel level) const = 0;
  virtual uint64_t bytes(TierLevel level) const = 0;
  // Mean size of the stored entries (S_kv); 0 when the store is empty.
  virtual uint64_t mean_entry_bytes() const = 0;
  // Bytes of `level`'s entries that no shown job before `position` reads: what making
  // room there for job `position`'s entry may evict.
  virtual uint64_t EvictableFor(TierLevel level, int position) const = 0;
};

// The read buffer's settings and the measured rates its automatic size comes from.
struct ReadBufferState {
  int64_t budget = 0;  // bytes of fetched-ahead entries; -1 = per job S_buf; 0 = off
  int min_tokens = 8;  // entries sharing fewer tokens with their job are not fetched
  double t_load_per_token = 0;     // seconds to enter one token's KV (0 = not measured yet)
  double t_prefill_per_token = 0;  // seconds to prefill one token (0 = not measured yet)
};

// What the read buffer does for the next jobs.
struct StagePlan {
  std::vector<std::string> keep;  // fetches that stay (their entry is still wanted); the rest go
  std::vector<AheadEntry> start;  // fetches to start, in queue order
};

class PrefetchPolicy {
 public:
  virtual ~PrefetchPolicy() = default;
  // Whether NextPromotion ever promotes (the store runs a prefetch thread only then).
  virtual bool promotes() const = 0;
  // The entry to promote to the top tier next, or nullopt.
  virtual std::optional<AheadEntry> NextPromotion(const PrefetchView& view) const = 0;
  // How many of the next waiting jobs the read buffer looks at.
  virtual int stage_ahead() const = 0;
  // `next`: the entries of the next stage_ahead() jobs, in queue order (key "" = none);
  // `staged(key)`: the bytes of the buffer's fetch of `key`, or -1 when it has none.
  virtual StagePlan PlanStaging(const std::vector<AheadEntry>& next, const ReadBufferState& rb,
                                const std::function<int64_t(const std::string&)>& staged) const = 0;
};

// The paper's (3.2, 3.3): promotes the first lower-tier entry of the prefetch window
// (C_mem / S_kv jobs) that fits the top tier by evicting only entries no job before it
// reads, and stops at the first that does not; the read buffer fills the next jobs'
// entries in queue order within the budget (fixed), or each whose S_buf > 0 (auto).
// Without `promote` (the LRU and FIFO baselines) it only stages.
class LookAheadPrefetch final : public PrefetchPolicy {
 public:
  explicit LookAheadPrefetch(bool promote, int stage_ahead = 2) : promote_(promote), stage_ahead_(stage_ahead) {}
  bool promotes() const override { return promote_; }
  std::optional<AheadEntry> NextPromotion(const PrefetchView& view) const override;
  int stage_ahead() const override { return stage_ahead_; }
  StagePlan PlanStaging(const std::vector<AheadEntry>& next, const ReadBufferState& rb,
                        const std::function<int64_t(const std::string&)>& staged) const override;

 private:
  const bool promote_;
  const int stage_ahead_;
};

// The paper's S_buf for one job: B * (T_load * L_hist - T_pref * L_new), B = the bytes
// entered per second; the whole entry while the rates are not measured; 0 when the
// job's own prefill hides its load.
int64_t ReadBufferBytes(const ReadBufferState& rb, int l_hist, int l_new, uint64_t entry_bytes);

// Promotes under the scheduler-aware policy; LRU and FIFO only stage.
std::unique_ptr<PrefetchPolicy> MakePrefetchPolicy(PolicyKind kind);

}  // namespace attic::store
