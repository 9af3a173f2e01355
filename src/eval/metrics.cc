#include "attic/eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attic/core/status.h"

namespace attic::eval {

std::vector<double> LogSoftmax(const float* logits, int n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double log_z = mx + std::log(sum);
  std::vector<double> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out[i] = static_cast<double>(logits[i]) - log_z;
  return out;
}

double NegLogLikelihood(const float* logits, int n, int32_t target) {
  ATTIC_CHECK(target >= 0 && target < n);
  return -LogSoftmax(logits, n)[static_cast<size_t>(target)];
}

double KlDivergence(const float* p_logits, const float* q_logits, int n) {
  const std::vector<double> lp = LogSoftmax(p_logits, n);
  const std::vector<double> lq = LogSoftmax(q_logits, n);
  double kl = 0;
  for (int i = 0; i < n; ++i) {
    const double p = std::exp(lp[i]);
    if (p > 0) kl += p * (lp[i] - lq[i]);
  }
  return std::max(0.0, kl);  // rounding can leave -1e-17 for identical distributions
}

void ScoreAccumulator::BeginWindow() {
  window_nll_.push_back(0);
  window_n_.push_back(0);
}

void ScoreAccumulator::Add(double nll, double kl, bool top1_agrees) {
  ATTIC_CHECK(!window_nll_.empty());
  ++n_tokens_;
  n_agree_ += top1_agrees ? 1 : 0;
  sum_nll_ += nll;
  sum_kl_ += kl;
  max_kl_ = std::max(max_kl_, kl);
  window_nll_.back() += nll;
  ++window_n_.back();
}

double ScoreAccumulator::mean_nll() const {
  return n_tokens_ > 0 ? sum_nll_ / static_cast<double>(n_tokens_) : std::numeric_limits<double>::quiet_NaN();
}

double ScoreAccumulator::perplexity() const { return std::exp(mean_nll()); }

double ScoreAccumulator::nll_standard_error() const {
  std::vector<double> means;
  for (size_t w = 0; w < window_nll_.size(); ++w)
    if (window_n_[w] > 0) means.push_back(window_nll_[w] / static_cast<double>(window_n_[w]));
  if (means.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  double mean = 0;
  for (double m : means) mean += m;
  mean /= static_cast<double>(means.size());
  double ss = 0;
  for (double m : means) ss += (m - mean) * (m - mean);
  const double k = static_cast<double>(means.size());
  return std::sqrt(ss / (k - 1)) / std::sqrt(k);
}

double ScoreAccumulator::mean_kl() const {
  return n_tokens_ > 0 ? sum_kl_ / static_cast<double>(n_tokens_) : std::numeric_limits<double>::quiet_NaN();
}

double ScoreAccumulator::top1_agreement() const {
  return n_tokens_ > 0 ? static_cast<double>(n_agree_) / static_cast<double>(n_tokens_)
                       : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace attic::eval
