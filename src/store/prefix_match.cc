#include "attic/store/prefix_match.h"

#include <algorithm>

namespace attic::store {

int CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b, size_t limit) {
  const size_t n = std::min({a.size(), b.size(), limit});
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int>(i);
}

bool RanksBefore(const PrefixCandidate& a, const PrefixCandidate& b) {
  if (a.common != b.common) return a.common > b.common;
  if (a.own_session != b.own_session) return a.own_session;
  return a.recency > b.recency;
}

}  // namespace attic::store
