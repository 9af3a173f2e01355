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
  e[2].queue_position = 0;  // c and a will be read soon
  e[0].queue_position = 1;
  // Among b and d, LRU: d (access 7) before b (8).
  EXPECT_EQ(SchedulerAwarePolicy().PickVictim(TierLevel::kDram, Ptrs(e), hint)->key, "d");
  EXPECT_EQ(SchedulerAwarePolicy().PickVictim(TierLevel::kSsd, Ptrs(e), hint)->key, "d");
}

TEST(EvictionPolicy, SchedulerAwarePicksWindowTailWhenAllQueued) {
  auto e = Entries();
  QueueHint hint;
  hint.window = 4;
  for (int i = 0; i < 4; ++i) e[i].queue_position = std::vector<int>{0, 3, 1, 2}[i];
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

namespace attic::store {
namespace {

// Paper Fig. 9: waiting jobs 2..9, eviction window 6 (jobs 2..7, positions 0..5). Host
// memory holds Job 2's and Job 4's KV, the disk Jobs 6, 8 and 9's (Jobs 5 and 7 are new
// sessions). All DRAM entries are wanted, so the one nearest the window's tail goes:
// Job 4. Moving it to a full disk evicts the last arrived job's KV: Job 9 (behind the
// window).
TEST(EvictionPolicy, SchedulerAwareFollowsPaperFigure9) {
  std::vector<EntryInfo> dram(2), ssd(3);
  dram[0].key = "job2", dram[0].queue_position = 0;
  dram[1].key = "job4", dram[1].queue_position = 2;
  ssd[0].key = "job6", ssd[0].queue_position = 4;
  ssd[1].key = "job8", ssd[1].queue_position = 6;
  ssd[2].key = "job9", ssd[2].queue_position = 7;
  QueueHint hint;
  hint.window = 6;
  SchedulerAwarePolicy ca;
  const EntryInfo* demoted = ca.PickVictim(TierLevel::kDram, Ptrs(dram), hint);
  EXPECT_EQ(demoted->key, "job4");
  auto on_disk = Ptrs(ssd);
  on_disk.push_back(demoted);  // the newcomer competes with the residents
  EXPECT_EQ(ca.PickVictim(TierLevel::kSsd, on_disk, hint)->key, "job9");
}

TEST(EvictionPolicy, SchedulerAwareEvictsUnqueuedBeforeJobsBehindTheWindow) {
  // a: queued behind the window (position 10 of a 4-job window); b: no queued job reads
  // it (least recently used would be a); c: inside the window.
  std::vector<EntryInfo> e(3);
  e[0].key = "a", e[0].queue_position = 10, e[0].access_seq = 1;
  e[1].key = "b", e[1].queue_position = -1, e[1].access_seq = 5;
  e[2].key = "c", e[2].queue_position = 1, e[2].access_seq = 2;
  QueueHint hint;
  hint.window = 4;
  EXPECT_EQ(SchedulerAwarePolicy().PickVictim(TierLevel::kSsd, Ptrs(e), hint)->key, "b");
  e.erase(e.begin() + 1);
  EXPECT_EQ(SchedulerAwarePolicy().PickVictim(TierLevel::kSsd, Ptrs(e), hint)->key, "a");
  EXPECT_EQ(LruPolicy().PickVictim(TierLevel::kSsd, Ptrs(e), hint)->key, "a");
}

TEST(EvictionPolicy, OnlySchedulerAwareRanksNewcomers) {
  EXPECT_TRUE(SchedulerAwarePolicy().RanksNewcomer());
  EXPECT_FALSE(LruPolicy().RanksNewcomer());
  EXPECT_FALSE(FifoPolicy().RanksNewcomer());
}

}  // namespace
}  // namespace attic::store
