#include "attic/store/eviction_policy.h"

#include <gtest/gtest.h>

namespace attic::store {
namespace {

std::vector<EntryInfo> Entries() {
  // Inserted a, b, c, d in order; accessed in order c, a, d, b.
  std::vector<EntryInfo> e(4);
  const char* names[] = {"a", "b", "c", "d"};
  uint64_t access[] = {6, 8, 5, 7};
  for (int i = 0; i < 4; ++i) {
    e[i].key = names[i];
    e[i].inserted_seq = i + 1;
    e[i].access_seq = access[i];
  }
  return e;
}

std::vector<const EntryInfo*> Ptrs(const std::vector<EntryInfo>& e) {
  std::vector<const EntryInfo*> p;
  for (const auto& x : e) p.push_back(&x);
  return p;
}

TEST(EvictionPolicy, LruPicksLeastRecentlyUsed) {
  auto e = Entries();
  EXPECT_EQ(LruPolicy().PickVictim(TierLevel::kDram, Ptrs(e), {})->key, "c");
}

TEST(EvictionPolicy, FifoPicksFirstInserted) {
  auto e = Entries();
  EXPECT_EQ(FifoPolicy().PickVictim(TierLevel::kDram, Ptrs(e), {})->key, "a");
}

TEST(EvictionPolicy, SchedulerAwareExemptsQueuedJobs) {
  auto e = Entries();
  QueueHint hint;
  hint.window = 3;
  hint.position = {{"c", 0}, {"a", 1}};  // c and a will be read soon
  // Among b and d, LRU: d (access 7) before b (8).
  EXPECT_EQ(SchedulerAwarePolicy().PickVictim(TierLevel::kDram, Ptrs(e), hint)->key, "d");
  EXPECT_EQ(SchedulerAwarePolicy().PickVictim(TierLevel::kSsd, Ptrs(e), hint)->key, "d");
}

TEST(EvictionPolicy, SchedulerAwarePicksWindowTailWhenAllQueued) {
  auto e = Entries();
  QueueHint hint;
  hint.window = 4;
  hint.position = {{"a", 0}, {"b", 3}, {"c", 1}, {"d", 2}};
  // DRAM->SSD: the entry whose job runs last; SSD->out: the last job in the queue.
  EXPECT_EQ(SchedulerAwarePolicy().PickVictim(TierLevel::kDram, Ptrs(e), hint)->key, "b");
  EXPECT_EQ(SchedulerAwarePolicy().PickVictim(TierLevel::kSsd, Ptrs(e), hint)->key, "b");
}

TEST(EvictionPolicy, ParsesNames) {
  EXPECT_EQ(*ParsePolicy("lru"), PolicyKind::kLru);
  EXPECT_EQ(*ParsePolicy("fifo"), PolicyKind::kFifo);
  EXPECT_EQ(*ParsePolicy("scheduler-aware"), PolicyKind::kSchedulerAware);
  EXPECT_FALSE(ParsePolicy("random").ok());
  EXPECT_STREQ(PolicyName(PolicyKind::kLru), "lru");
}

}  // namespace
}  // namespace attic::store
