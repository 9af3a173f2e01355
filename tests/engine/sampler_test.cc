#include "attic/engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <random>

namespace attic::engine {
namespace {

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  SamplingParams p;
  Sampler s(p);
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.Sample(l.data(), 4), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::vector<int32_t> a, b;
  Sampler s1(p), s2(p);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l = {0.0f, 0.5f, 1.0f, 0.2f, -0.3f};
    std::vector<float> l2 = l;
    a.push_back(s1.Sample(l.data(), 5));
    b.push_back(s2.Sample(l2.data(), 5));
  }
  EXPECT_EQ(a, b);
  p.seed = 43;
  Sampler s3(p);
  std::vector<int32_t> c;
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l = {0.0f, 0.5f, 1.0f, 0.2f, -0.3f};
    c.push_back(s3.Sample(l.data(), 5));
  }
  EXPECT_NE(a, c);
}

TEST(Sampler, FrequenciesFollowSoftmaxWithTemperature) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 7;
  Sampler s(p);
  const std::vector<float> base = {1.0f, 0.0f, 2.0f, -1.0f};
  // Expected probabilities computed independently here.
  double z = 0;
  std::vector<double> want(4);
  for (int i = 0; i < 4; ++i) z += (want[i] = std::exp(base[i] / 0.7));
  std::vector<int> count(4);
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    auto l = base;
    ++count[s.Sample(l.data(), 4)];
  }
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(count[i] / double(n), want[i] / z, 0.01) << i;
}

TEST(Sampler, TopKTopPMinPRestrictTheCandidates) {
  const std::vector<float> base = {3.0f, 2.9f, 0.0f, -5.0f, 2.8f};
  auto seen = [&](SamplingParams p) {
    Sampler s(p);
    std::map<int, int> m;
    for (int i = 0; i < 3000; ++i) {
      auto l = base;
      ++m[s.Sample(l.data(), 5)];
    }
    return m;
  };
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  auto m = seen(p);
  EXPECT_EQ(m.size(), 2u);
  EXPECT_TRUE(m.count(0) && m.count(1));
  p.top_k = 0;
  p.top_p = 0.5f;  // p(0) ~ 0.36, p(1) ~ 0.33: the first two reach 0.5
  m = seen(p);
  EXPECT_EQ(m.size(), 2u);
  p.top_p = 1.0f;
  p.min_p = 0.5f;  // keeps tokens with p >= 0.5 * p_max: 0, 1, 4
  m = seen(p);
  EXPECT_EQ(m.size(), 3u);
  EXPECT_TRUE(m.count(4));
}

// Against a deliberately naive reference: sort the whole vocabulary, normalize, cut at
// top-k / min-p / top-p, renormalize. Every sampled token must be in that set and the
// frequencies must follow its probabilities.
TEST(Sampler, MatchesNaiveNucleusOnALargerVocabulary) {
  const int V = 300;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<float> base(V);
  for (auto& x : base) x = nd(rng);
  struct Case {
    int top_k;
    float top_p, min_p, temperature;
  };
  for (const Case& c : {Case{0, 0.6f, 0.0f, 1.0f}, Case{0, 1.0f, 0.05f, 0.8f}, Case{40, 0.9f, 0.0f, 1.3f},
                        Case{0, 0.95f, 0.02f, 1.0f}}) {
    SCOPED_TRACE(testing::Message() << "top_k " << c.top_k << " top_p " << c.top_p << " min_p " << c.min_p);
    std::vector<int> order(V);
    for (int i = 0; i < V; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return base[a] > base[b] || (base[a] == base[b] && a < b); });
    size_t keep = c.top_k > 0 ? c.top_k : V;
    std::vector<double> p(keep);
    double z = 0;
    for (size_t i = 0; i < keep; ++i) z += (p[i] = std::exp((base[order[i]] - base[order[0]]) / c.temperature));
    for (auto& x : p) x /= z;
    size_t n = keep;
    if (c.min_p > 0) {
      n = 0;
      while (n < keep && p[n] >= c.min_p * p[0]) ++n;
    }
    if (c.top_p < 1) {
      double cum = 0;
      size_t m = 0;
      while (m < n && cum < c.top_p) cum += p[m++];
      n = m;
    }
    double kept = 0;
    for (size_t i = 0; i < n; ++i) kept += p[i];
    std::map<int, double> want;
    for (size_t i = 0; i < n; ++i) want[order[i]] = p[i] / kept;

    SamplingParams sp;
    sp.temperature = c.temperature;
    sp.top_k = c.top_k;
    sp.top_p = c.top_p;
    sp.min_p = c.min_p;
    sp.seed = 11;
    Sampler s(sp);
    const int draws = 60000;
    std::map<int, int> got;
    for (int i = 0; i < draws; ++i) {
      auto l = base;
      ++got[s.Sample(l.data(), V)];
    }
    for (const auto& [id, k] : got) EXPECT_TRUE(want.count(id)) << "token " << id << " is outside the nucleus";
    for (const auto& [id, q] : want) EXPECT_NEAR(got[id] / double(draws), q, 0.01) << "token " << id;
  }
}

TEST(Sampler, ValidateRejectsBadValues) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_FALSE(p.Validate().ok());
  p = {};
  p.top_p = 0;
  EXPECT_FALSE(p.Validate().ok());
  p = {};
  p.stop_strings = {""};
  EXPECT_FALSE(p.Validate().ok());
}

TEST(StopStrings, FindAndHoldback) {
  std::vector<std::string> stops = {"END", "\n\n"};
  EXPECT_EQ(FindStopString("abc END x", stops), 4u);
  EXPECT_EQ(FindStopString("abc", stops), std::string::npos);
  EXPECT_EQ(FindStopString("abcEN", stops, 3), std::string::npos);
  EXPECT_EQ(FindStopString("abcEND", stops, 5), 3u);  // straddles the new text
  EXPECT_EQ(StopPrefixHoldback("abcEN", stops), 2u);
  EXPECT_EQ(StopPrefixHoldback("abc\n", stops), 1u);
  EXPECT_EQ(StopPrefixHoldback("abc", stops), 0u);
}

}  // namespace
}  // namespace attic::engine
