// The per-position measures and their accumulation, against hand computations.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attic/eval/metrics.h"

namespace attic::eval {
namespace {

// softmax([0, ln 3]) = (1/4, 3/4); softmax([5, 5]) = (1/2, 1/2).
const std::vector<float> kP = {0.0f, static_cast<float>(std::log(3.0))};
const std::vector<float> kQ = {5.0f, 5.0f};

TEST(Metrics, LogSoftmaxOfHandPickedLogits) {
  const auto lp = LogSoftmax(kP.data(), 2);
  EXPECT_NEAR(lp[0], std::log(0.25), 1e-7);
  EXPECT_NEAR(lp[1], std::log(0.75), 1e-7);
  // Large logits do not overflow: a shift leaves the distribution alone.
  const std::vector<float> big = {1000.0f, 1000.0f + static_cast<float>(std::log(3.0))};
  const auto lb = LogSoftmax(big.data(), 2);
  EXPECT_NEAR(lb[0], std::log(0.25), 1e-4);  // f32 rounding of 1000 + ln 3
}

TEST(Metrics, NegLogLikelihoodIsMinusLogProbabilityOfTheTarget) {
  EXPECT_NEAR(NegLogLikelihood(kP.data(), 2, 1), -std::log(0.75), 1e-7);
  EXPECT_NEAR(NegLogLikelihood(kP.data(), 2, 0), std::log(4.0), 1e-7);
  EXPECT_NEAR(NegLogLikelihood(kQ.data(), 2, 0), std::log(2.0), 1e-12);
}

TEST(Metrics, KlDivergenceByHand) {
  // KL(P || Q) = 1/4 ln(1/4 / 1/2) + 3/4 ln(3/4 / 1/2) = 0.25 ln 0.5 + 0.75 ln 1.5.
  EXPECT_NEAR(KlDivergence(kP.data(), kQ.data(), 2), 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
  // KL(Q || P) = 1/2 ln(1/2 / 1/4) + 1/2 ln(1/2 / 3/4): not symmetric.
  EXPECT_NEAR(KlDivergence(kQ.data(), kP.data(), 2), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
  // A distribution against itself, and against a shifted copy of its logits: 0.
  EXPECT_EQ(KlDivergence(kP.data(), kP.data(), 2), 0.0);
  const std::vector<float> shifted = {7.0f, 7.0f + static_cast<float>(std::log(3.0))};
  EXPECT_NEAR(KlDivergence(kP.data(), shifted.data(), 2), 0.0, 1e-6);
}

TEST(Metrics, AccumulatorMeansPerplexityAndStandardError) {
  ScoreAccumulator a;
  EXPECT_TRUE(std::isnan(a.mean_nll()));
  a.BeginWindow();
  a.Add(1.0, 0.5, true);
  a.Add(3.0, 0.1, false);  // window mean 2
  a.BeginWindow();
  a.Add(4.0, 0.0, true);
  a.Add(4.0, 0.2, true);  // window mean 4
  EXPECT_EQ(a.n_tokens(), 4);
  EXPECT_EQ(a.n_windows(), 2);
  EXPECT_DOUBLE_EQ(a.mean_nll(), 3.0);
  EXPECT_DOUBLE_EQ(a.perplexity(), std::exp(3.0));
  // Window means 2 and 4: sample sd sqrt(2), standard error sqrt(2) / sqrt(2) = 1.
  EXPECT_NEAR(a.nll_standard_error(), 1.0, 1e-12);
  EXPECT_NEAR(a.mean_kl(), 0.2, 1e-12);
  EXPECT_DOUBLE_EQ(a.max_kl(), 0.5);
  EXPECT_DOUBLE_EQ(a.top1_agreement(), 0.75);
}

TEST(Metrics, StandardErrorNeedsTwoWindows) {
  ScoreAccumulator a;
  a.BeginWindow();
  a.Add(1.0, 0, true);
  a.Add(2.0, 0, true);
  EXPECT_TRUE(std::isnan(a.nll_standard_error()));
  EXPECT_DOUBLE_EQ(a.perplexity(), std::exp(1.5));
}

}  // namespace
}  // namespace attic::eval
