// KvStore's prefetch (paper 001 section 3.3): promotes the lower-tier entries of jobs in
// the look-ahead window to DRAM ahead of their admission, as the PrefetchPolicy picks
// them, on the store's prefetch thread.
#include <algorithm>

#include "attic/store/kv_store.h"
#include "store/kv_store_internal.h"

namespace attic::store {

class KvStore::IndexView final : public PrefetchView {
 public:
  explicit IndexView(KvStore& store) : store_(store) {}
  int queued() const override { return static_cast<int>(store_.queue_.size()); }
  AheadEntry Resolve(int position) const override { return store_.ResolveLocked(store_.queue_.at(position)); }
  uint64_t capacity(TierLevel level) const override { return store_.tiers_.at(TierIndex(level))->capacity(); }
  uint64_t bytes(TierLevel level) const override { return store_.tiers_.at(TierIndex(level))->bytes(); }
  uint64_t mean_entry_bytes() const override { return store_.MeanEntryBytesLocked(); }
  uint64_t EvictableFor(TierLevel level, int position) const override {
    uint64_t n = 0;
    for (const auto& [k, e] : store_.entries_)
      if (e.tier == level && (e.queue_position < 0 || e.queue_position > position)) n += e.bytes;
    return n;
  }

 private:
  KvStore& store_;
};

int KvStore::Prefetch() {
  if (n_tiers() < 2) return 0;
  DiscoverQueued();  // queued jobs' sessions that other servers saved to a shared tier
  if (!prefetch_->promotes()) return 0;
  int promoted = 0;
  for (int round = 0; round < 1024; ++round) {
    // Under the lock: what the policy promotes next.
    AheadEntry pick;
    int level = 0;
    uint64_t version = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      IndexView view(*this);
      std::optional<AheadEntry> next = prefetch_->NextPromotion(view);
      if (!next) break;
      const EntryInfo& e = entries_.at(next->key);
      level = TierIndex(e.tier);
      version = e.version;
      pick = std::move(*next);
      prefetching_ = pick.key;  // a Fetch of it waits for this read
    }
    // The read and its checksums happen outside the lock: lookups and saves go on
    // meanwhile. (A DRAM-tier fetch checks only the header, so what enters DRAM from a
    // lower tier is verified here.)
    StatusOr<Fetched> read = ReadChecked(*tiers_[level], pick.key, true);
    if (read.ok() && read->bytes->size() != pick.bytes) read = DataLossError("size changed");
    bool promoted_now = false, same = false;
    {
      std::lock_guard<std::mutex> placing(place_mu_);
      std::unique_lock<std::mutex> lock(mu_);
      auto it = entries_.find(pick.key);
      same = it != entries_.end() && TierIndex(it->second.tier) == level && it->second.version == version;
      if (same && read.ok() && Promote(lock, pick.key, *read)) {
        entries_.at(pick.key).prefetched = true;
        ++stats_.prefetches;
        promoted_now = true;
      }
      prefetching_.clear();
      prefetch_done_.notify_all();
    }
    if (promoted_now) {
      ++promoted;
      continue;
    }
    if (!same || read.ok()) break;  // moved meanwhile, or there is no room for it
    if (ClassifyReadError(read.status()) == ReadError::kTransient) break;  // try again at the next hint
    // Dropped (vanished or corrupt): the next job's entry may be promoted.
    ReadFailed(pick.key, level, version, read.status()).IgnoreError();
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
