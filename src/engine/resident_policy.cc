#include "attic/engine/resident_policy.h"

namespace attic::engine {

size_t LruResidentPolicy::PickVictim(const std::vector<ResidentCandidate>& candidates) const {
  size_t best = 0;
  for (size_t i = 1; i < candidates.size(); ++i)
    if (candidates[i].last_used < candidates[best].last_used) best = i;
  return best;
}

}  // namespace attic::engine
