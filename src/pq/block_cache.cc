// BlockCache: a map from block to (uses, last_used) and an ordered set of eviction ranks;
// a step costs O(n + b log b) for n selected slots in b blocks.
#include "attic/pq/block_cache.h"

#include <algorithm>

#include "attic/core/status.h"

namespace attic::pq {

const char* CachePolicyName(CachePolicy policy) {
  switch (policy) {
    case CachePolicy::kLru: return "lru";
    case CachePolicy::kLfu: return "lfu";
  }
  return "?";
}

double BlockCacheStats::hit_rate() const {
  const int64_t total = token_hits + token_misses;
  return total > 0 ? static_cast<double>(token_hits) / static_cast<double>(total) : 0.0;
}

BlockCache::BlockCache(int capacity_blocks, CachePolicy policy, int block_tokens, int update_blocks)
    : capacity_(capacity_blocks), policy_(policy), block_tokens_(block_tokens) {
  ATTIC_CHECK(capacity_blocks >= 0);
  ATTIC_CHECK(block_tokens >= 1);
  update_blocks_ = update_blocks < 0 ? capacity_ : std::min(update_blocks, capacity_);
}

BlockCache::Rank BlockCache::RankOf(int32_t block, const Entry& e) const {
  return {policy_ == CachePolicy::kLfu ? e.uses : 0, e.last_used, block};
}

void BlockCache::Touch(int32_t block, Entry& e) {
  order_.erase(RankOf(block, e));
  e.uses += 1;
  e.last_used = clock_++;
  order_.insert(RankOf(block, e));
}

void BlockCache::EvictOne(int64_t step_start) {
  // Blocks this step touched or inserted have last_used >= step_start; there are fewer
  // of them than capacity_ (at most update_blocks_ - 1 before this insertion), so a
  // victim exists. Under LRU they come last in order; under LFU they may be passed over.
  for (auto it = order_.begin(); it != order_.end(); ++it) {
    if (std::get<1>(*it) >= step_start) continue;
    entries_.erase(std::get<2>(*it));
    order_.erase(it);
    return;
  }
  ATTIC_CHECK(false);
}

AccessResult BlockCache::Access(const int32_t* selected_slots, int n, std::vector<int32_t>* missed) {
  AccessResult r;
  step_counts_.clear();
  for (int i = 0; i < n; ++i) {
    const int32_t slot = selected_slots[i];
    ATTIC_CHECK(slot >= 0);
    const int32_t block = slot / block_tokens_;
    if (entries_.count(block) != 0) {
      ++r.token_hits;
    } else {
      ++r.token_misses;
      if (missed != nullptr) missed->push_back(slot);
    }
    ++step_counts_[block];
  }

  step_blocks_.clear();
  for (const auto& [block, count] : step_counts_) step_blocks_.emplace_back(-count, block);
  const size_t n_update = std::min<size_t>(step_blocks_.size(), static_cast<size_t>(update_blocks_));
  std::partial_sort(step_blocks_.begin(), step_blocks_.begin() + n_update, step_blocks_.end());

  // The cached blocks among them are touched first, so that none of them is evicted to
  // make room for another of the same step; then the others enter, most selected first.
  const int64_t step_start = clock_;
  for (size_t j = 0; j < n_update; ++j) {
    const int32_t block = step_blocks_[j].second;
    auto it = entries_.find(block);
    if (it != entries_.end()) Touch(block, it->second);
  }
  for (size_t j = 0; j < n_update; ++j) {
    const int32_t block = step_blocks_[j].second;
    if (entries_.count(block) != 0) continue;
    if (static_cast<int>(entries_.size()) >= capacity_) {
      EvictOne(step_start);
      ++r.block_evictions;
    }
    Entry& e = entries_[block];
    e.uses = 1;
    e.last_used = clock_++;
    order_.insert(RankOf(block, e));
    ++r.block_insertions;
  }

  ++stats_.steps;
  stats_.token_hits += r.token_hits;
  stats_.token_misses += r.token_misses;
  stats_.block_insertions += r.block_insertions;
  stats_.block_evictions += r.block_evictions;
  return r;
}

std::vector<int32_t> BlockCache::CachedBlocks() const {
  std::vector<int32_t> blocks;
  blocks.reserve(entries_.size());
  for (const auto& [block, e] : entries_) blocks.push_back(block);
  std::sort(blocks.begin(), blocks.end());
  return blocks;
}

}  // namespace attic::pq
