// The longest-common-prefix decision: which of several token sequences a request
// reuses. One ranking for every place that chooses -- the scheduler among the resident
// sequences of its compute buffer (engine's ResidentSet::Plan), the store among its stored
// entries (KvStore's lookup) -- so that the two never disagree on what "the best match"
// means.
//
// Ranking: more common leading tokens first; on a tie, the request's own session; then
// the more recently used. A candidate sharing no token never matches.
//
// Thread-safety: pure functions and a value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace attic::store {

// The number of leading tokens `a` and `b` share, at most `limit`.
int CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                 size_t limit = std::numeric_limits<size_t>::max());

// One candidate as the ranking sees it.
struct PrefixCandidate {
  int common = 0;            // leading tokens it shares with the request
  bool own_session = false;  // it belongs to the request's session (a non-empty session id)
  uint64_t recency = 0;      // larger = used more recently
};

// Whether `a` ranks before `b`.
bool RanksBefore(const PrefixCandidate& a, const PrefixCandidate& b);

// The best of the candidates offered so far (the first offered wins an exact tie).
template <typename T>
class BestPrefixMatch {
 public:
  void Offer(T item, const PrefixCandidate& c) {
    if (c.common <= 0 || (found_ && !RanksBefore(c, best_))) return;
    item_ = item;
    best_ = c;
    found_ = true;
  }
  bool found() const { return found_; }
  // REQUIRES: found().
  const T& item() const { return item_; }
  int common() const { return found_ ? best_.common : 0; }

 private:
  T item_{};
  PrefixCandidate best_;
  bool found_ = false;
};

}  // namespace attic::store
