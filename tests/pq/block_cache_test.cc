// BlockCache against hand-worked steps and a naive simulator written here (a plain
// vector of blocks scanned linearly), over random selection traces.
#include "attic/pq/block_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

namespace attic::pq {
namespace {

// The reference: the semantics of block_cache.h, with no cleverness.
class NaiveCache {
 public:
  NaiveCache(int capacity, CachePolicy policy, int block_tokens, int update)
      : capacity_(capacity), lfu_(policy == CachePolicy::kLfu), block_tokens_(block_tokens),
        update_(update < 0 ? capacity : std::min(update, capacity)) {}

  AccessResult Access(const std::vector<int32_t>& slots, std::vector<int32_t>* missed) {
    AccessResult r;
    std::map<int32_t, int> counts;
    for (int32_t slot : slots) {
      const int32_t block = slot / block_tokens_;
      if (Find(block) >= 0) {
        r.token_hits++;
      } else {
        r.token_misses++;
        missed->push_back(slot);
      }
      counts[block]++;
    }
    std::vector<int32_t> order;
    for (const auto& [b, c] : counts) order.push_back(b);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return counts[a] > counts[b]; });
    if (static_cast<int>(order.size()) > update_) order.resize(update_);
    const int64_t start = now_;
    for (int32_t b : order) {
      const int i = Find(b);
      if (i >= 0) {
        cache_[i].uses++;
        cache_[i].last = now_++;
      }
    }
    for (int32_t b : order) {
      if (Find(b) >= 0 && cache_[Find(b)].last >= start) continue;  // touched above
      if (static_cast<int>(cache_.size()) == capacity_) {
        int victim = -1;
        for (int i = 0; i < static_cast<int>(cache_.size()); ++i) {
          if (cache_[i].last >= start) continue;
          if (victim < 0) {
            victim = i;
            continue;
          }
          const Slot& a = cache_[i];
          const Slot& v = cache_[victim];
          const bool better = lfu_ ? (a.uses < v.uses || (a.uses == v.uses && a.last < v.last)) : a.last < v.last;
          if (better) victim = i;
        }
        EXPECT_GE(victim, 0);
        cache_.erase(cache_.begin() + victim);
        r.block_evictions++;
      }
      cache_.push_back({b, 1, now_++});
      r.block_insertions++;
    }
    return r;
  }

  std::vector<int32_t> Blocks() const {
    std::vector<int32_t> b;
    for (const Slot& s : cache_) b.push_back(s.block);
    std::sort(b.begin(), b.end());
    return b;
  }

 private:
  struct Slot {
    int32_t block;
    int64_t uses, last;
  };
  int Find(int32_t block) const {
    for (int i = 0; i < static_cast<int>(cache_.size()); ++i) {
      if (cache_[i].block == block) return i;
    }
    return -1;
  }
  int capacity_;
  bool lfu_;
  int block_tokens_, update_;
  int64_t now_ = 0;
  std::vector<Slot> cache_;
};

AccessResult Step(BlockCache& cache, std::vector<int32_t> slots, std::vector<int32_t>* missed = nullptr) {
  return cache.Access(slots.data(), static_cast<int>(slots.size()), missed);
}

TEST(BlockCacheTest, HandWorkedLru) {
  BlockCache cache(2, CachePolicy::kLru, 4);
  // Blocks 0 (slots 0, 1) and 1 (slot 5): all miss, both enter.
  AccessResult r = Step(cache, {0, 1, 5});
  EXPECT_EQ(r.token_hits, 0);
  EXPECT_EQ(r.token_misses, 3);
  EXPECT_EQ(r.block_insertions, 2);
  EXPECT_EQ(r.block_evictions, 0);
  EXPECT_EQ(cache.CachedBlocks(), (std::vector<int32_t>{0, 1}));
  // Block 2 (3 slots) and block 0 (slot 2, a hit). Block 0 is touched first, so block 2
  // evicts block 1 (the least recent of the others), not block 0.
  std::vector<int32_t> missed;
  r = Step(cache, {9, 10, 11, 2}, &missed);
  EXPECT_EQ(r.token_hits, 1);
  EXPECT_EQ(r.token_misses, 3);
  EXPECT_EQ(missed, (std::vector<int32_t>{9, 10, 11}));
  EXPECT_EQ(r.block_insertions, 1);
  EXPECT_EQ(r.block_evictions, 1);
  EXPECT_EQ(cache.CachedBlocks(), (std::vector<int32_t>{0, 2}));
  // Block 3 alone: evicts block 0 (touched before block 2 entered).
  r = Step(cache, {12});
  EXPECT_EQ(cache.CachedBlocks(), (std::vector<int32_t>{2, 3}));
  // Three new blocks, two places: the two most selected (ties: the lower) enter.
  r = Step(cache, {20, 24, 25, 28, 29});  // blocks 5 (1 slot), 6 (2), 7 (2)
  EXPECT_EQ(r.token_misses, 5);
  EXPECT_EQ(r.block_insertions, 2);
  EXPECT_EQ(r.block_evictions, 2);
  EXPECT_EQ(cache.CachedBlocks(), (std::vector<int32_t>{6, 7}));
  const BlockCacheStats& s = cache.stats();
  EXPECT_EQ(s.steps, 4);
  EXPECT_EQ(s.token_hits, 1);
  EXPECT_EQ(s.token_misses, 3 + 3 + 1 + 5);
  EXPECT_EQ(s.block_insertions, 2 + 1 + 1 + 2);
  EXPECT_EQ(s.block_evictions, 0 + 1 + 1 + 2);
  EXPECT_DOUBLE_EQ(s.hit_rate(), 1.0 / 13);
}

TEST(BlockCacheTest, HandWorkedLfu) {
  // block_tokens 1: a slot is its block.
  BlockCache lfu(2, CachePolicy::kLfu, 1), lru(2, CachePolicy::kLru, 1);
  for (BlockCache* c : {&lfu, &lru}) {
    Step(*c, {0});
    Step(*c, {0});  // block 0: used twice
    Step(*c, {1});
    Step(*c, {2});  // LFU evicts block 1 (used once); LRU evicts block 0 (older)
  }
  EXPECT_EQ(lfu.CachedBlocks(), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(lru.CachedBlocks(), (std::vector<int32_t>{1, 2}));
  // Equal use counts: the least recently used goes.
  BlockCache tie(2, CachePolicy::kLfu, 1);
  Step(tie, {0});
  Step(tie, {1});
  Step(tie, {2});
  EXPECT_EQ(tie.CachedBlocks(), (std::vector<int32_t>{1, 2}));
  // A block inserted in a step is not evicted by another of the same step, even with the
  // lowest count: 3 enters evicting 1 (2 uses, older than 2), then 4 evicts 2 (2 uses),
  // not 3 (1 use).
  BlockCache guard(2, CachePolicy::kLfu, 1);
  Step(guard, {1});
  Step(guard, {1, 2});
  Step(guard, {2});  // 1: 2 uses, 2: 2 uses, 2 the more recent
  AccessResult r = Step(guard, {3, 3, 4});
  EXPECT_EQ(r.block_evictions, 2);
  EXPECT_EQ(guard.CachedBlocks(), (std::vector<int32_t>{3, 4}));
}

TEST(BlockCacheTest, LfuCountsStartOverOnReinsertion) {
  BlockCache cache(2, CachePolicy::kLfu, 1);
  for (int i = 0; i < 3; ++i) Step(cache, {0});  // 0: 3 uses
  Step(cache, {1});
  Step(cache, {2});  // evicts 1
  for (int i = 0; i < 3; ++i) Step(cache, {2});  // 2: 4 uses
  Step(cache, {3});  // evicts 0 (3 uses)
  EXPECT_EQ(cache.CachedBlocks(), (std::vector<int32_t>{2, 3}));
  Step(cache, {0});  // evicts 3; 0 is back with 1 use (not 4)
  Step(cache, {4});  // so 0 goes, not 2 (with 4 uses 0 would tie 2 and 2 is older)
  EXPECT_EQ(cache.CachedBlocks(), (std::vector<int32_t>{2, 4}));
}

TEST(BlockCacheTest, UpdateBlocksLimitsWhatEnters) {
  BlockCache cache(3, CachePolicy::kLru, 10, /*update_blocks=*/1);
  EXPECT_EQ(cache.update_blocks(), 1);
  AccessResult r = Step(cache, {0, 15, 17, 25});  // blocks 0 (1), 1 (2), 2 (1)
  EXPECT_EQ(r.block_insertions, 1);
  EXPECT_EQ(cache.CachedBlocks(), (std::vector<int32_t>{1}));
  r = Step(cache, {11, 0});
  EXPECT_EQ(r.token_hits, 1);
  EXPECT_EQ(r.token_misses, 1);
  EXPECT_EQ(BlockCache(3, CachePolicy::kLru, 10, 7).update_blocks(), 3);  // clamped
}

TEST(BlockCacheTest, CapacityZeroMissesEverything) {
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kLfu}) {
    BlockCache cache(0, p);
    EXPECT_EQ(cache.block_tokens(), 128);
    for (int step = 0; step < 3; ++step) {
      std::vector<int32_t> missed;
      AccessResult r = Step(cache, {1, 2, 300, 5000}, &missed);
      EXPECT_EQ(r.token_hits, 0);
      EXPECT_EQ(r.token_misses, 4);
      EXPECT_EQ(r.block_insertions, 0);
      EXPECT_EQ(missed.size(), 4u);
    }
    EXPECT_EQ(cache.size(), 0);
    EXPECT_EQ(cache.stats().hit_rate(), 0.0);
  }
  BlockCache empty(4, CachePolicy::kLru);
  AccessResult r = Step(empty, {});
  EXPECT_EQ(r.token_hits + r.token_misses, 0);
  EXPECT_EQ(empty.stats().hit_rate(), 0.0);
}

TEST(BlockCacheTest, MatchesNaiveSimulatorOnRandomTraces) {
  std::mt19937 rng(81);
  for (int trial = 0; trial < 120; ++trial) {
    const CachePolicy policy = trial % 2 ? CachePolicy::kLfu : CachePolicy::kLru;
    const int capacity = std::uniform_int_distribution<int>(0, 12)(rng);
    const int block_tokens = std::uniform_int_distribution<int>(1, 16)(rng);
    const int update = trial % 3 == 0 ? -1 : std::uniform_int_distribution<int>(0, 14)(rng);
    const int n_slots = std::uniform_int_distribution<int>(16, 600)(rng);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << CachePolicyName(policy) << " capacity "
                                      << capacity << " block_tokens " << block_tokens << " update " << update);
    BlockCache cache(capacity, policy, block_tokens, update);
    NaiveCache ref(capacity, policy, block_tokens, update);
    // Selections with a persistent hot set (what makes caching pay) plus random slots.
    std::vector<int32_t> hot(8);
    for (int32_t& h : hot) h = std::uniform_int_distribution<int>(0, n_slots - 1)(rng);
    int64_t hits = 0, misses = 0;
    for (int step = 0; step < 60; ++step) {
      std::vector<int32_t> slots;
      const int n = std::uniform_int_distribution<int>(0, 40)(rng);
      for (int i = 0; i < n; ++i) {
        slots.push_back(rng() % 3 == 0 ? hot[rng() % hot.size()]
                                       : std::uniform_int_distribution<int>(0, n_slots - 1)(rng));
      }
      std::vector<int32_t> missed, ref_missed;
      const AccessResult got = cache.Access(slots.data(), n, &missed);
      const AccessResult want = ref.Access(slots, &ref_missed);
      ASSERT_EQ(got.token_hits, want.token_hits) << "step " << step;
      ASSERT_EQ(got.token_misses, want.token_misses) << "step " << step;
      ASSERT_EQ(got.block_insertions, want.block_insertions) << "step " << step;
      ASSERT_EQ(got.block_evictions, want.block_evictions) << "step " << step;
      ASSERT_EQ(missed, ref_missed) << "step " << step;
      ASSERT_EQ(cache.CachedBlocks(), ref.Blocks()) << "step " << step;
      ASSERT_LE(cache.size(), capacity);
      hits += want.token_hits;
      misses += want.token_misses;
    }
    EXPECT_EQ(cache.stats().token_hits, hits);
    EXPECT_EQ(cache.stats().token_misses, misses);
    EXPECT_EQ(cache.stats().steps, 60);
  }
}

}  // namespace
}  // namespace attic::pq
