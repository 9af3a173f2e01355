// The statistics helpers against hand-computed values (nearest-rank percentiles as
// defined in Wikipedia's "Percentile" article, with its two worked examples).
#include "bench/common/stats.h"

#include <gtest/gtest.h>

namespace attic::bench {
namespace {

TEST(Percentile, NearestRankOfFiveSamples) {
  // 15 20 35 40 50: rank = ceil(p/100 * 5).
  const std::vector<double> v{50, 15, 40, 20, 35};  // unsorted on purpose
  EXPECT_EQ(Percentile(v, 5), 15);    // rank 1
  EXPECT_EQ(Percentile(v, 30), 20);   // rank ceil(1.5) = 2
  EXPECT_EQ(Percentile(v, 40), 20);   // rank 2 exactly
  EXPECT_EQ(Percentile(v, 50), 35);   // rank ceil(2.5) = 3
  EXPECT_EQ(Percentile(v, 100), 50);  // rank 5
}

TEST(Percentile, NearestRankOfTenSamples) {
  const std::vector<double> v{3, 6, 7, 8, 8, 10, 13, 15, 16, 20};
  EXPECT_EQ(Percentile(v, 25), 7);   // rank ceil(2.5) = 3
  EXPECT_EQ(Percentile(v, 50), 8);   // rank 5: the lower middle sample, not (8 + 10) / 2
  EXPECT_EQ(Percentile(v, 75), 15);  // rank ceil(7.5) = 8
  EXPECT_EQ(Percentile(v, 90), 16);  // rank 9
  EXPECT_EQ(Percentile(v, 99), 20);  // rank ceil(9.9) = 10
}

TEST(Percentile, EdgesAndEmpty) {
  EXPECT_EQ(Percentile({}, 50), 0);
  EXPECT_EQ(Percentile({4, 2, 9}, 0), 2);     // the minimum
  EXPECT_EQ(Percentile({4, 2, 9}, -5), 2);    // clamped
  EXPECT_EQ(Percentile({4, 2, 9}, 250), 9);   // clamped
  EXPECT_EQ(Percentile({7.5}, 50), 7.5);
}

TEST(Median, MiddleOrMeanOfTheTwoMiddles) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({7}), 7);
  EXPECT_EQ(Median({5, 1, 3}), 3);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({10, 0}), 5);
  EXPECT_EQ(Median({1, 100, 2, 3, 50, 4}), 3.5);  // sorted: 1 2 3 4 50 100
}

TEST(Mean, Arithmetic) {
  EXPECT_EQ(Mean({}), 0);
  EXPECT_EQ(Mean({1, 2, 3, 4}), 2.5);
  EXPECT_EQ(Mean({-2, 2}), 0);
}

TEST(UnionLength, OverlapsCountOnce) {
  EXPECT_EQ(UnionLength({}), 0);
  EXPECT_EQ(UnionLength({{0, 2}, {1, 3}, {5, 6}}), 4);  // [0, 3) and [5, 6)
  EXPECT_EQ(UnionLength({{5, 6}, {1, 3}, {0, 2}}), 4);  // order does not matter
  EXPECT_EQ(UnionLength({{0, 1}, {1, 2}}), 2);          // touching
  EXPECT_EQ(UnionLength({{0, 10}, {2, 3}, {4, 12}}), 12);  // nested, then extended
  EXPECT_EQ(UnionLength({{3, 3}, {4, 2}}), 0);          // empty and reversed intervals add nothing
  EXPECT_DOUBLE_EQ(UnionLength({{0.5, 0.75}, {0.25, 0.5}}), 0.5);
}

}  // namespace
}  // namespace attic::bench
