// Link options and each method's recompute set (paper 002, Epic; pic/link.h): parsing
// and printing --link's names, and the slots LinkComputeSlots names per method.
#include "attic/pic/link.h"

#include <gtest/gtest.h>

#include <vector>

namespace attic::pic {
namespace {

TEST(LinkOptions, ParseAndPrint) {
  auto a = ParseLinkOptions("attnlink-16");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->method, LinkMethod::kAttnLink);
  EXPECT_EQ(a->k, 16);
  auto b = ParseLinkOptions("cacheblend-0.15@2");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->method, LinkMethod::kCacheBlend);
  EXPECT_DOUBLE_EQ(b->ratio, 0.15);
  EXPECT_EQ(b->check_layer, 2);
  EXPECT_EQ(b->ToString(), "cacheblend-0.15@2");
  EXPECT_TRUE(ParseLinkOptions("naive").ok());
  EXPECT_TRUE(ParseLinkOptions("full").ok());
  for (const char* s : {"", "attnlink-", "attnlink-x", "cacheblend-2", "naive-3", "blend", "attnlink--1"})
    EXPECT_FALSE(ParseLinkOptions(s).ok()) << s;
}

TEST(LinkComputeSlots, EachMethodsSet) {
  // Prompt of 40 slots: chunk [5, 15), chunk [15, 25), text [25, 40) -- and [0, 5).
  const std::vector<LinkedChunk> chunks = {{5, 10, "a", 1}, {15, 10, "b", 1}};
  auto slots = [&](LinkOptions o, int from = 0) { return LinkComputeSlots(o, chunks, from, 40); };
  auto range = [](std::vector<int32_t> v, int lo, int hi) {
    for (int s = lo; s < hi; ++s) v.push_back(s);
    return v;
  };
  LinkOptions o;
  o.method = LinkMethod::kNaive;
  EXPECT_EQ(slots(o), range(range({}, 0, 5), 25, 40));
  o.method = LinkMethod::kAttnLink;
  o.k = 4;
  EXPECT_EQ(slots(o), range(range(range(range(range({}, 0, 7), 13, 17), 23, 25), 25, 40), 0, 0));
  o.k = 100;
  EXPECT_EQ(slots(o), range({}, 0, 40));
  o.method = LinkMethod::kCacheBlend;
  EXPECT_EQ(slots(o), range({}, 0, 40));
  o.method = LinkMethod::kNaive;
  EXPECT_EQ(slots(o, 30), range({}, 30, 40));  // a stored prefix covers [0, 30)
  // The prompt's last slot is always computed, even inside a chunk.
  EXPECT_EQ(LinkComputeSlots(o, {{0, 10, "a", 0}}, 0, 10), std::vector<int32_t>{9});
}

}  // namespace
}  // namespace attic::pic
