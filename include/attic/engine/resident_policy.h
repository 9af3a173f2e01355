// ResidentPolicy: which resident sequence leaves the compute buffer when its blocks are
// needed. A finished request's KV stays resident (Scheduler, SchedulerOptions::
// max_resident) so that the conversation's next turn, or another request sharing its
// prefix, reuses it without a load; admission evicts residents when the pool runs short.
// The policy only ranks; the scheduler keeps the residents and frees the victim's blocks.
//
// Thread-safety: policies are stateless and const; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace attic::engine {

// One evictable resident sequence as a policy sees it.
struct ResidentCandidate {
  uint64_t last_used = 0;  // larger = used more recently (retired, or its prefix reused)
  int n_blocks = 0;        // compute-buffer blocks its eviction frees
};

class ResidentPolicy {
 public:
  virtual ~ResidentPolicy() = default;
  // The index in `candidates` (non-empty: the residents that may go) of the one to evict.
  virtual size_t PickVictim(const std::vector<ResidentCandidate>& candidates) const = 0;
};

// Least recently used first (the first of equals).
class LruResidentPolicy final : public ResidentPolicy {
 public:
  size_t PickVictim(const std::vector<ResidentCandidate>& candidates) const override;
};

}  // namespace attic::engine
