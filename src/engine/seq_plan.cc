#include "engine/seq_plan.h"

#include <algorithm>

namespace attic::engine {

SeqPlan PlanStoredPrefix(std::shared_ptr<const store::KvSource> source, int n) {
  SeqPlan p;
  if (n <= 0) return p;
  const store::KvEntry& meta = source->meta();
  p.tokens.assign(meta.tokens.begin(), meta.tokens.begin() + n);
  p.positions.assign(meta.positions.begin(), meta.positions.begin() + n);
  p.segments.push_back({std::move(source), 0, n, 0});
  p.n_cached = n;
  return p;
}

SeqPlan PlanTruncated(const Truncation& t, std::shared_ptr<const store::KvSource> source, int common, int cap,
                      const std::vector<int32_t>& prompt) {
  SeqPlan p;
  // Entry rows in slot order: the kept head, then the tail after the dropped tokens.
  const int head = std::min({common, t.keep, cap});
  const int tail_from = t.keep + t.skip;
  const int tail = std::max(0, std::min(common - tail_from, cap - head));
  if (common < t.keep) {  // the entry ends inside the kept head: only that
    if (head > 0) p.segments.push_back({source, 0, head, 0});
  } else {
    if (head > 0) p.segments.push_back({source, 0, head, 0});
    if (tail > 0) p.segments.push_back({source, tail_from, tail, head});
  }
  p.n_cached = head + (common < t.keep ? 0 : tail);
  if (p.n_cached == 0) return SeqPlan{};
  p.tokens.assign(prompt.begin(), prompt.begin() + p.n_cached);
  p.positions.resize(p.n_cached);
  for (int i = 0; i < p.n_cached; ++i) p.positions[i] = i;
  return p;
}

}  // namespace attic::engine
