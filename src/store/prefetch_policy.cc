#include "attic/store/prefetch_policy.h"

#include <algorithm>

namespace attic::store {

std::optional<AheadEntry> LookAheadPrefetch::NextPromotion(const PrefetchView& view) const {
  if (!promote_) return std::nullopt;
  const uint64_t mean = view.mean_entry_bytes();
  if (mean == 0) return std::nullopt;
  const uint64_t cap = view.capacity(TierLevel::kDram);
  // The prefetch window: C_mem / S_kv jobs (paper 3.3.1).
  const int window = static_cast<int>(std::min<uint64_t>(view.queued(), cap / mean));
  for (int i = 0; i < window; ++i) {
    AheadEntry e = view.Resolve(i);
    if (e.key.empty() || e.tier == TierLevel::kDram || e.bytes > cap) continue;
    // Room it may take: what is free, plus entries no job before this one reads.
    const uint64_t free = cap - std::min(cap, view.bytes(TierLevel::kDram)) + view.EvictableFor(TierLevel::kDram, i);
    if (free < e.bytes) return std::nullopt;  // later jobs' entries would displace sooner ones
    return e;
  }
  return std::nullopt;
}

int64_t ReadBufferBytes(const ReadBufferState& rb, int l_hist, int l_new, uint64_t entry_bytes) {
  if (rb.t_load_per_token <= 0 || rb.t_prefill_per_token <= 0 || l_hist <= 0)
    return static_cast<int64_t>(entry_bytes);  // not measured yet
  const double gap = rb.t_load_per_token * l_hist - rb.t_prefill_per_token * l_new;
  if (gap <= 0) return 0;
  const double bandwidth = static_cast<double>(entry_bytes) / (rb.t_load_per_token * l_hist);
  return static_cast<int64_t>(bandwidth * gap);
}

StagePlan LookAheadPrefetch::PlanStaging(const std::vector<AheadEntry>& next, const ReadBufferState& rb,
                                         const std::function<int64_t(const std::string&)>& staged) const {
  StagePlan plan;
  if (rb.budget == 0) return plan;
  // The wanted entries, in queue order (an entry sharing too little with its job is not).
  std::vector<const AheadEntry*> wants;
  for (size_t i = 0; i < next.size() && static_cast<int>(i) < stage_ahead_; ++i) {
    const AheadEntry& e = next[i];
    if (e.key.empty() || e.n_tokens < rb.min_tokens) continue;
    wants.push_back(&e);
    plan.keep.push_back(e.key);
  }
  int64_t used = 0;
  for (const AheadEntry* e : wants) {
    const int64_t have = staged(e->key);
    if (have >= 0) {
      used += have;
      continue;
    }
    if (rb.budget > 0) {
      if (used + static_cast<int64_t>(e->bytes) > rb.budget) break;  // the buffer is full
    } else if (ReadBufferBytes(rb, e->n_tokens, e->prompt_tokens - e->n_tokens, e->bytes) <= 0) {
      continue;  // S_buf = 0: the job's own prefill hides its load
    }
    plan.start.push_back(*e);
    used += static_cast<int64_t>(e->bytes);
  }
  return plan;
}

std::unique_ptr<PrefetchPolicy> MakePrefetchPolicy(PolicyKind kind) {
  return std::make_unique<LookAheadPrefetch>(kind == PolicyKind::kSchedulerAware);
}

}  // namespace attic::store
