// KvStore's prefetch (paper 001 section 3.3): promotes the entries of jobs in the
// look-ahead window to DRAM ahead of their admission, on the store's prefetch thread.
#include <algorithm>

#include "attic/store/kv_store.h"
#include "store/kv_store_internal.h"

namespace attic::store {

int KvStore::Prefetch() {
  if (ssd_ == nullptr || policy_->kind() != PolicyKind::kSchedulerAware) return 0;
  int promoted = 0;
  for (int round = 0; round < 1024; ++round) {
    // Under the lock: the first job in the prefetch window whose entry is on SSD and
    // fits DRAM by evicting only entries not wanted before that job.
    std::string key;
    uint64_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      uint64_t mean = MeanEntryBytesLocked();
      if (mean == 0) break;
      size_t window = std::min<uint64_t>(queue_.size(), dram_->capacity() / mean);  // C_mem / S_kv
      for (size_t i = 0; i < window && key.empty(); ++i) {
        auto m = FindLocked(queue_[i].tenant, queue_[i].session_id, *queue_[i].tokens);
        if (!m || m->tier != TierLevel::kSsd) continue;
        const EntryInfo& info = entries_.at(m->key);
        if (info.bytes > dram_->capacity()) continue;
        uint64_t free = dram_->capacity() - dram_->bytes();
        for (const auto& [k, e] : entries_)
          if (e.tier == TierLevel::kDram && (e.queue_position < 0 || e.queue_position > static_cast<int>(i)))
            free += e.bytes;
        if (free < info.bytes) break;
        key = m->key;
        size = info.bytes;
      }
      if (!key.empty()) prefetching_ = key;  // a Fetch of it waits for this read
    }
    if (key.empty()) break;
    // The read and its checksums happen outside the lock: lookups and saves go on
    // meanwhile. (A DRAM-tier fetch checks only the header, so what enters DRAM from SSD
    // is verified here.)
    StatusOr<Fetched> read = ReadChecked(*ssd_, key, true);
    std::lock_guard<std::mutex> lock(mu_);
    prefetching_.clear();
    prefetch_done_.notify_all();
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.tier != TierLevel::kSsd) break;
    if (!read.ok() || read->bytes->size() != size) {
      const Status why = read.ok() ? DataLossError("size changed") : read.status();
      if (why.code() == StatusCode::kNotFound || why.code() == StatusCode::kUnavailable) break;
      DropUnreadableLocked(key, why);
      continue;
    }
    if (!PromoteLocked(key, std::move(read->bytes))) break;
    entries_.at(key).prefetched = true;
    ++stats_.prefetches;
    ++promoted;
  }
  return promoted;
}

void KvStore::RequestPrefetch() {
  if (!prefetcher_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(pmu_);
    prefetch_requested_ = true;
  }
  pcv_.notify_one();
}

void KvStore::PrefetchLoop() {
  std::unique_lock<std::mutex> lock(pmu_);
  for (;;) {
    pcv_.wait(lock, [&] { return stop_prefetcher_ || prefetch_requested_; });
    if (stop_prefetcher_) return;
    prefetch_requested_ = false;
    lock.unlock();
    Prefetch();
    lock.lock();
  }
}

}  // namespace attic::store
