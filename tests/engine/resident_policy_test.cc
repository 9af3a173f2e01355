#include "attic/engine/resident_policy.h"

#include <gtest/gtest.h>

namespace attic::engine {
namespace {

TEST(ResidentPolicy, LruEvictsTheLeastRecentlyUsed) {
  LruResidentPolicy lru;
  // Listed in no particular order: the one used longest ago goes, whatever its size.
  EXPECT_EQ(lru.PickVictim({{7, 1}, {3, 9}, {5, 2}}), 1u);
  EXPECT_EQ(lru.PickVictim({{2, 4}, {8, 1}}), 0u);
  EXPECT_EQ(lru.PickVictim({{4, 1}}), 0u);
  // A reused resident (its last_used raised) is no longer the victim.
  EXPECT_EQ(lru.PickVictim({{9, 1}, {3, 9}, {5, 2}}), 1u);
  EXPECT_EQ(lru.PickVictim({{9, 1}, {10, 9}, {5, 2}}), 2u);
}

}  // namespace
}  // namespace attic::engine
