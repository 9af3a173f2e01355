// The prefetch policy alone, over a fake view of the store: which entry it promotes and
// which the read buffer fetches, worked by hand.
#include "attic/store/prefetch_policy.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace attic::store {
namespace {

// The store as a list of waiting jobs' entries, DRAM's capacity and use, and the bytes
// of DRAM entries each job position could evict.
class FakeView final : public PrefetchView {
 public:
  std::vector<AheadEntry> jobs;
  uint64_t dram_capacity = 0, dram_bytes = 0, mean = 0;
  std::map<int, uint64_t> evictable;  // position -> bytes

  int queued() const override { return static_cast<int>(jobs.size()); }
  AheadEntry Resolve(int position) const override {
    ++resolved;
    return jobs.at(position);
  }
  uint64_t capacity(TierLevel level) const override { return level == TierLevel::kDram ? dram_capacity : 1 << 30; }
  uint64_t bytes(TierLevel level) const override { return level == TierLevel::kDram ? dram_bytes : 0; }
  uint64_t mean_entry_bytes() const override { return mean; }
  uint64_t EvictableFor(TierLevel, int position) const override {
    auto it = evictable.find(position);
    return it == evictable.end() ? 0 : it->second;
  }
  mutable int resolved = 0;
};

AheadEntry On(TierLevel tier, const std::string& key, uint64_t bytes) {
  AheadEntry e;
  e.key = key;
  e.tier = tier;
  e.bytes = bytes;
  return e;
}

TEST(PrefetchPolicy, PromotesTheFirstLowerTierEntryOfTheWindowThatFits) {
  FakeView v;
  v.dram_capacity = 100;
  v.dram_bytes = 90;  // 10 free
  v.mean = 25;        // window: 100 / 25 = 4 jobs
  v.jobs = {On(TierLevel::kDram, "a", 20), AheadEntry{}, On(TierLevel::kSsd, "c", 30), On(TierAt(2), "d", 20)};
  v.evictable = {{2, 20}};  // job 2's entry may take 10 free + 20 evictable = 30
  LookAheadPrefetch p(/*promote=*/true);
  EXPECT_TRUE(p.promotes());
  auto next = p.NextPromotion(v);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->key, "c");
  // One byte short for c: it does not fit, and nothing behind it is promoted instead
  // (d's promotion would evict entries that c's job, sooner, needs).
  v.evictable = {{2, 19}, {3, 90}};
  EXPECT_FALSE(p.NextPromotion(v).has_value());
  // A third tier's entry is promoted like an SSD one.
  v.jobs[2] = On(TierLevel::kDram, "c", 30);
  v.evictable = {{3, 10}};
  next = p.NextPromotion(v);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->key, "d");
}

TEST(PrefetchPolicy, LooksOnlyInsideThePrefetchWindow) {
  FakeView v;
  v.dram_capacity = 100;
  v.dram_bytes = 0;
  v.mean = 50;  // window: 2 jobs
  v.jobs = {On(TierLevel::kDram, "a", 50), On(TierLevel::kDram, "b", 50), On(TierLevel::kSsd, "c", 10)};
  LookAheadPrefetch p(true);
  EXPECT_FALSE(p.NextPromotion(v).has_value());
  EXPECT_EQ(v.resolved, 2);  // job 2 is behind the window: not even resolved
  v.mean = 0;                // an empty store promotes nothing
  EXPECT_FALSE(p.NextPromotion(v).has_value());
  // An entry larger than DRAM is skipped, not a reason to stop.
  v.mean = 10;
  v.jobs = {On(TierLevel::kSsd, "huge", 101), On(TierLevel::kSsd, "b", 40)};
  auto next = p.NextPromotion(v);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->key, "b");
}

TEST(PrefetchPolicy, BaselinesNeverPromote) {
  FakeView v;
  v.dram_capacity = 100;
  v.mean = 10;
  v.jobs = {On(TierLevel::kSsd, "a", 10)};
  EXPECT_TRUE(LookAheadPrefetch(true).NextPromotion(v).has_value());
  LookAheadPrefetch lru(/*promote=*/false);
  EXPECT_FALSE(lru.promotes());
  EXPECT_FALSE(lru.NextPromotion(v).has_value());
  EXPECT_FALSE(MakePrefetchPolicy(PolicyKind::kLru)->promotes());
  EXPECT_FALSE(MakePrefetchPolicy(PolicyKind::kFifo)->promotes());
  EXPECT_TRUE(MakePrefetchPolicy(PolicyKind::kSchedulerAware)->promotes());
}

AheadEntry Job(const std::string& key, uint64_t bytes, int n_tokens, int prompt_tokens) {
  AheadEntry e = On(TierLevel::kDram, key, bytes);
  e.n_tokens = n_tokens;
  e.prompt_tokens = prompt_tokens;
  return e;
}

std::vector<std::string> Keys(const std::vector<AheadEntry>& v) {
  std::vector<std::string> out;
  for (const auto& e : v) out.push_back(e.key);
  return out;
}

const auto kNoneStaged = [](const std::string&) -> int64_t { return -1; };

TEST(PrefetchPolicy, FixedReadBufferFillsTheNextJobsInQueueOrder) {
  LookAheadPrefetch p(true, /*stage_ahead=*/3);
  ReadBufferState rb;
  rb.budget = 100;
  rb.min_tokens = 8;
  const std::vector<AheadEntry> next = {Job("a", 60, 100, 110), Job("b", 50, 100, 110), Job("c", 30, 100, 110),
                                        Job("d", 1, 100, 110)};
  // a fits; b would pass the budget: the buffer is full (c is not taken out of order);
  // d is beyond stage_ahead.
  StagePlan plan = p.PlanStaging(next, rb, kNoneStaged);
  EXPECT_EQ(Keys(plan.start), (std::vector<std::string>{"a"}));
  EXPECT_EQ(plan.keep, (std::vector<std::string>{"a", "b", "c"}));
  // a already fetched counts toward the budget; with 60 used, b still does not fit.
  plan = p.PlanStaging(next, rb, [](const std::string& k) -> int64_t { return k == "a" ? 60 : -1; });
  EXPECT_TRUE(plan.start.empty());
  rb.budget = 110;
  plan = p.PlanStaging(next, rb, [](const std::string& k) -> int64_t { return k == "a" ? 60 : -1; });
  EXPECT_EQ(Keys(plan.start), (std::vector<std::string>{"b"}));
  // A job with no entry, or one sharing fewer than min_tokens tokens, is not fetched
  // for, nor kept.
  plan = p.PlanStaging({AheadEntry{}, Job("short", 10, 7, 50), Job("x", 10, 8, 50)}, rb, kNoneStaged);
  EXPECT_EQ(Keys(plan.start), (std::vector<std::string>{"x"}));
  EXPECT_EQ(plan.keep, (std::vector<std::string>{"x"}));
  rb.budget = 0;  // off
  EXPECT_TRUE(p.PlanStaging(next, rb, kNoneStaged).start.empty());
}

TEST(PrefetchPolicy, AutoReadBufferIsThePapersSbuf) {
  ReadBufferState rb;
  rb.budget = -1;
  // Not measured yet: the whole entry.
  EXPECT_EQ(ReadBufferBytes(rb, 1000, 100, 4000), 4000);
  // T_load 2 ms/token, T_pref 10 ms/token. L_hist 1000, L_new 100: the load takes 2 s,
  // the job's own prefill 1 s; B = 4000 bytes / 2 s = 2000 B/s; S_buf = 2000 * 1 = 2000.
  rb.t_load_per_token = 0.002;
  rb.t_prefill_per_token = 0.010;
  EXPECT_EQ(ReadBufferBytes(rb, 1000, 100, 4000), 2000);
  // L_new 200: the prefill (2 s) hides the load (2 s): nothing to fetch ahead.
  EXPECT_EQ(ReadBufferBytes(rb, 1000, 200, 4000), 0);
  LookAheadPrefetch p(true);
  StagePlan plan = p.PlanStaging({Job("hidden", 4000, 1000, 1200), Job("shown", 4000, 1000, 1100)}, rb, kNoneStaged);
  EXPECT_EQ(Keys(plan.start), (std::vector<std::string>{"shown"}));
  EXPECT_EQ(plan.keep, (std::vector<std::string>{"hidden", "shown"}));
}

}  // namespace
}  // namespace attic::store
