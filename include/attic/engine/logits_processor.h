// The per-request seam in sampling: what a request may sample (a LogitsProcessor, e.g. a
// grammar's token mask) and the log-probabilities it reports (TokenLogprob).
//
// At each step that samples for a request, the scheduler (1) captures the logprobs of
// the model's logits as they are (log-softmax at temperature 1: before the processor,
// temperature, top-k, top-p and min-p), (2) lets the processor mask the row, (3) samples,
// and (4) tells the processor the token. The scheduler names no feature behind it.
//
// Thread-safety: a processor belongs to one request; Apply and Accept are called on the
// step loop (Apply possibly on a pool thread, never concurrently with Accept).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace attic::engine {

class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  // Sets the logits of tokens that may not come next to -infinity. At least one token
  // must stay allowed.
  virtual void Apply(float* logits, int vocab) = 0;
  // The token sampled after Apply.
  virtual void Accept(int32_t token) = 0;
  // Nothing may follow what was accepted: the generation ends here ("stop").
  virtual bool Complete() const = 0;
};

// One token's log-probability and (when asked) the most likely tokens at its position.
struct TokenLogprob {
  int32_t token = -1;
  double logprob = 0;  // NaN: none (a prompt's first token)
  std::vector<std::pair<int32_t, double>> top;  // most likely first; ties by lower id
};

// Log-softmax of logits[0..vocab) in double: the logprob of `token` and the `top_n` most
// likely tokens (top_n <= vocab). Cost O(vocab).
TokenLogprob ComputeLogprob(const float* logits, int vocab, int32_t token, int top_n);

// The two halves of ComputeLogprob, for a row that is masked between them: Prepare reads
// the unmasked row (log-sum-exp and the top_n), Finish adds the chosen token's logprob
// from its unmasked logit.
struct LogprobRow {
  double log_sum_exp = 0;
  std::vector<std::pair<int32_t, double>> top;
};
LogprobRow PrepareLogprob(const float* logits, int vocab, int top_n);
TokenLogprob FinishLogprob(const LogprobRow& row, int32_t token, float token_logit);

}  // namespace attic::engine
