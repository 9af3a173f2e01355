// Per-position measures of next-token distributions given as logits, and their
// accumulation over many scored positions (docs/eval.md defines each one):
//   NLL   -log softmax(q)[target]                       (natural log, nats)
//   KL    KL(P || Q) = sum_v P(v) (log P(v) - log Q(v)) with P the reference's ("full")
//         distribution and Q the method's (nats)
//   top-1 argmax P == argmax Q (first index on ties, as engine::Argmax)
// All in double precision; logits are f32 rows of vocab_size.
//
// Thread-safety: plain functions and value types.
#pragma once

#include <cstdint>
#include <vector>

namespace attic::eval {

// log softmax(logits) in double: [n].
std::vector<double> LogSoftmax(const float* logits, int n);

// -log softmax(logits)[target].
double NegLogLikelihood(const float* logits, int n, int32_t target);

// KL(P || Q) of the distributions softmax(p_logits) and softmax(q_logits).
double KlDivergence(const float* p_logits, const float* q_logits, int n);

// Sums over scored positions, grouped in windows (the unit of the standard error).
class ScoreAccumulator {
 public:
  // Starts a new window; positions added afterwards belong to it.
  void BeginWindow();
  // One scored position: the method's NLL of the true token, and its KL from / top-1
  // agreement with the reference at that position.
  void Add(double nll, double kl, bool top1_agrees);

  int64_t n_tokens() const { return n_tokens_; }
  int n_windows() const { return static_cast<int>(window_nll_.size()); }
  double mean_nll() const;      // over every scored token
  double perplexity() const;    // exp(mean_nll())
  // Standard error of mean_nll() from the spread of the windows' mean NLLs (tokens of a
  // window are not independent; windows are): sd(window means) / sqrt(n_windows), the
  // sample standard deviation (n_windows - 1). Windows are meant to score equal numbers
  // of tokens (then mean_nll() is also the mean of the window means). NaN with fewer
  // than two windows.
  double nll_standard_error() const;
  double mean_kl() const;
  double max_kl() const { return max_kl_; }
  double top1_agreement() const;  // fraction of scored positions

 private:
  int64_t n_tokens_ = 0;
  int64_t n_agree_ = 0;
  double sum_nll_ = 0, sum_kl_ = 0, max_kl_ = 0;
  std::vector<double> window_nll_;   // sum of NLL per window
  std::vector<int64_t> window_n_;    // scored tokens per window
};

}  // namespace attic::eval
