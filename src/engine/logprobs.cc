#include <algorithm>
#include <cmath>

#include "attic/engine/logits_processor.h"

namespace attic::engine {

LogprobRow PrepareLogprob(const float* logits, int vocab, int top_n) {
  LogprobRow out;
  float mx = -INFINITY;
  for (int i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  out.log_sum_exp = mx + std::log(sum);
  top_n = std::clamp(top_n, 0, vocab);
  if (top_n > 0) {
    std::vector<int32_t> ids(vocab);
    for (int i = 0; i < vocab; ++i) ids[i] = i;
    auto better = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(ids.begin(), ids.begin() + top_n, ids.end(), better);
    out.top.reserve(top_n);
    for (int i = 0; i < top_n; ++i) out.top.emplace_back(ids[i], static_cast<double>(logits[ids[i]]) - out.log_sum_exp);
  }
  return out;
}

TokenLogprob FinishLogprob(const LogprobRow& row, int32_t token, float token_logit) {
  TokenLogprob out;
  out.token = token;
  out.logprob = static_cast<double>(token_logit) - row.log_sum_exp;
  out.top = row.top;
  return out;
}

TokenLogprob ComputeLogprob(const float* logits, int vocab, int32_t token, int top_n) {
  return FinishLogprob(PrepareLogprob(logits, vocab, top_n), token, logits[token]);
}

}  // namespace attic::engine
