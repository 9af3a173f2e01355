#include "attic/store/prefix_match.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace attic::store {
namespace {

TEST(PrefixMatch, CommonPrefixCountsLeadingEqualTokensUpToTheLimit) {
  EXPECT_EQ(CommonPrefix({1, 2, 3, 4}, {1, 2, 9, 4}), 2);
  EXPECT_EQ(CommonPrefix({1, 2, 3}, {1, 2, 3, 4, 5}), 3);
  EXPECT_EQ(CommonPrefix({}, {1}), 0);
  EXPECT_EQ(CommonPrefix({5}, {6}), 0);
  EXPECT_EQ(CommonPrefix({1, 2, 3, 4}, {1, 2, 3, 4}, 3), 3);
  EXPECT_EQ(CommonPrefix({1, 2, 3, 4}, {1, 2, 3, 4}, 0), 0);
}

struct Named {
  std::string name;
  PrefixCandidate c;
};

std::string Best(const std::vector<Named>& offered) {
  BestPrefixMatch<std::string> best;
  for (const Named& n : offered) best.Offer(n.name, n.c);
  return best.found() ? best.item() + ":" + std::to_string(best.common()) : "none";
}

TEST(PrefixMatch, LongestWinsThenOwnSessionThenMostRecent) {
  // Longer beats own session and recency.
  EXPECT_EQ(Best({{"a", {5, true, 9}}, {"b", {6, false, 1}}}), "b:6");
  // Equal length: the request's own session, whatever the order offered or the recency.
  EXPECT_EQ(Best({{"mine", {5, true, 1}}, {"other", {5, false, 9}}}), "mine:5");
  EXPECT_EQ(Best({{"other", {5, false, 9}}, {"mine", {5, true, 1}}}), "mine:5");
  // Equal length and session-ness: the most recently used, in any order.
  EXPECT_EQ(Best({{"old", {5, false, 2}}, {"new", {5, false, 7}}}), "new:5");
  EXPECT_EQ(Best({{"new", {5, false, 7}}, {"old", {5, false, 2}}}), "new:5");
  // Sharing nothing never matches.
  EXPECT_EQ(Best({{"a", {0, true, 9}}}), "none");
  EXPECT_EQ(Best({}), "none");
}

TEST(PrefixMatch, RanksBeforeIsAStrictOrder) {
  const PrefixCandidate a{4, false, 3};
  EXPECT_FALSE(RanksBefore(a, a));
  EXPECT_TRUE(RanksBefore({4, true, 0}, a));
  EXPECT_FALSE(RanksBefore(a, {4, true, 0}));
  EXPECT_TRUE(RanksBefore({4, false, 4}, a));
  EXPECT_TRUE(RanksBefore({5, false, 0}, {4, true, 9}));
}

}  // namespace
}  // namespace attic::store
