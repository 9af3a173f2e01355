// PQCache's block cache (paper 004, section 3.4 and Fig. 10d): the slots that sparse
// decoding selects beyond the initial and local ones are fetched from slower memory; the
// blocks of `block_tokens` consecutive slots that recent steps selected most are kept in
// a cache of `capacity_blocks` blocks, so a selected slot whose block is cached need not
// be fetched. One BlockCache models one (layer, KV head); it holds only the cache's
// structure (which blocks, their recency and use counts), not the KV rows: the benchmark
// replaying selection traces and the offload path both drive it with the slots each step
// selected.
//
// One step, Access(selected):
//  1. counting, against the cache as it was before the step: a selected slot whose block
//     (slot / block_tokens) is cached is a token hit, any other a token miss (each
//     selected slot counts once; duplicates in the list count again);
//  2. updating, the PQCache way: the step's blocks, most selected slots first (ties: the
//     lower block), at most `update_blocks` of them (default: capacity_blocks): first
//     each of them already cached is touched (recency now, use count + 1), in that
//     order; then each other one, in that order, is inserted with use count 1, evicting
//     first, when the cache is full, the victim the policy picks among the blocks this
//     step did not touch or insert:
//       LRU  the least recently touched or inserted;
//       LFU  the lowest use count (touches since its insertion, that one included); ties:
//            the least recently touched or inserted.
//     A block evicted and later inserted again starts over at use count 1.
//     Blocks selected beyond the first update_blocks neither count as touched nor enter.
// Capacity 0: every selected slot misses and nothing is inserted.
//
// Thread-safety: none; one BlockCache per (layer, KV head), used by one thread at a time.
#pragma once

#include <cstdint>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace attic::pq {

enum class CachePolicy { kLru, kLfu };
const char* CachePolicyName(CachePolicy policy);  // "lru", "lfu"

// Totals since construction (or ResetStats), over every Access call.
struct BlockCacheStats {
  int64_t steps = 0;             // Access calls
  int64_t token_hits = 0;        // selected slots whose block was cached at the step's start
  int64_t token_misses = 0;      // selected slots whose block was not (what must be fetched)
  int64_t block_insertions = 0;  // blocks that entered the cache
  int64_t block_evictions = 0;   // blocks that left it to make room
  // token_hits / (token_hits + token_misses); 0 before any selected slot.
  double hit_rate() const;
};

// One step's counts (the step's share of BlockCacheStats).
struct AccessResult {
  int64_t token_hits = 0;
  int64_t token_misses = 0;
  int block_insertions = 0;
  int block_evictions = 0;
};

class BlockCache {
 public:
  // capacity_blocks >= 0 blocks of block_tokens >= 1 slots; update_blocks: how many of a
  // step's blocks may update the cache (PQCache's top-k_cache), -1 = capacity_blocks,
  // otherwise clamped to [0, capacity_blocks]. Invalid sizes are a caller bug (ATTIC_CHECK).
  BlockCache(int capacity_blocks, CachePolicy policy, int block_tokens = 128, int update_blocks = -1);

  // One decode step's selected slots (each >= 0; any order). When `missed` is not null it
  // receives the selected slots that missed, in the order given (what must be fetched).
  AccessResult Access(const int32_t* selected_slots, int n, std::vector<int32_t>* missed = nullptr);

  // Whether block `block` is cached now.
  bool Contains(int32_t block) const { return entries_.count(block) != 0; }
  // The cached blocks, ascending.
  std::vector<int32_t> CachedBlocks() const;
  int size() const { return static_cast<int>(entries_.size()); }

  int capacity_blocks() const { return capacity_; }
  int block_tokens() const { return block_tokens_; }
  int update_blocks() const { return update_blocks_; }
  CachePolicy policy() const { return policy_; }
  const BlockCacheStats& stats() const { return stats_; }
  void ResetStats() { stats_ = BlockCacheStats(); }

 private:
  struct Entry {
    int64_t uses = 0;       // LFU's count
    int64_t last_used = 0;  // clock_ at the latest touch or insertion
  };
  // Eviction order, first = the next victim: (LFU: uses, else 0; last_used; block).
  using Rank = std::tuple<int64_t, int64_t, int32_t>;
  Rank RankOf(int32_t block, const Entry& e) const;
  void Touch(int32_t block, Entry& e);
  // Evicts the first block in eviction order not used at or after `step_start`.
  void EvictOne(int64_t step_start);

  int capacity_;
  CachePolicy policy_;
  int block_tokens_;
  int update_blocks_;
  int64_t clock_ = 0;  // +1 per touch or insertion
  std::unordered_map<int32_t, Entry> entries_;
  std::set<Rank> order_;
  BlockCacheStats stats_;
  // Scratch for one step: the step's blocks and their selected-slot counts.
  std::unordered_map<int32_t, int> step_counts_;
  std::vector<std::pair<int, int32_t>> step_blocks_;  // (-count, block)
};

}  // namespace attic::pq
