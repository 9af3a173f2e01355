// KvStore::Fetch (and Load on top of it): the store side of layer-wise pre-loading
// (paper 001 section 3.2). The entry's bytes are handed out shared (a DRAM-tier value is
// not copied), verified, and read from SSD outside the store's lock so lookups and saves
// go on; Peek plans the read buffer.
#include "attic/core/log.h"
#include "attic/store/kv_store.h"

namespace attic::store {

StatusOr<KvStore::Fetched> KvStore::Fetch(const std::string& key) {
  for (int attempt = 0;; ++attempt) {
    auto f = FetchOnce(key);
    // The entry moved between tiers while it was read (a demotion or a promotion): read
    // it again from where it is now.
    if (f.ok() || f.status().code() != StatusCode::kUnavailable || attempt == 3) return f;
  }
}

StatusOr<KvStore::Fetched> KvStore::FetchOnce(const std::string& key) {
  Tier* tier = nullptr;
  TierLevel level;
  {
    std::unique_lock<std::mutex> lock(mu_);
    prefetch_done_.wait(lock, [&] { return prefetching_ != key; });  // then it is in DRAM (or not)
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotFoundError("no KV entry " + key);
    EntryInfo& info = it->second;
    if (Expired(info)) {
      RemoveLocked(key);
      ++stats_.expired;
      return NotFoundError("KV entry " + key + " expired");
    }
    level = info.tier;
    tier = TierFor(level);
    info.access_seq = ++seq_;
    if (level == TierLevel::kDram && info.prefetched) {
      info.prefetched = false;
      ++stats_.prefetches_useful;
    }
  }
  // The read and the checksums happen outside the lock: lookups and saves go on. The
  // layer checksums guard what crossed a persistence boundary (every SSD read, and
  // restart); DRAM-tier bytes never left this process's memory, so only their header is
  // checked (verifying 46 MB of a 1k-token 135M entry took ~3 ms of a ~80 ms TTFT).
  StatusOr<Fetched> read = ReadChecked(*tier, key, level != TierLevel::kDram);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (!read.ok()) {
    if (it == entries_.end()) return NotFoundError("KV entry " + key + " was erased");
    if (it->second.tier != level) return UnavailableError("KV entry " + key + " moved");
    DropUnreadableLocked(key, read.status());
    return NotFoundError("KV entry " + key + " unreadable");
  }
  Fetched f = std::move(*read);
  stats_.bytes_loaded += f.bytes->size();
  // The paper fetches whole sessions SSD -> DRAM; a failure leaves it on SSD.
  if (it != entries_.end() && it->second.tier == TierLevel::kSsd && f.bytes->size() <= dram_->capacity())
    PromoteLocked(key, f.bytes);
  return f;
}

StatusOr<KvStore::Fetched> KvStore::FetchFromDram(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.tier != TierLevel::kDram || Expired(it->second))
      return NotFoundError("KV entry " + key + " is not in DRAM");
  }
  // A demotion between the check and the read makes GetShared fail: NotFound as well.
  StatusOr<Fetched> read = ReadChecked(*dram_, key, false);
  if (!read.ok()) return NotFoundError("KV entry " + key + " is not in DRAM");
  return read;
}

StatusOr<KvStore::Fetched> KvStore::ReadChecked(Tier& tier, const std::string& key, bool check_layers) const {
  ATTIC_ASSIGN_OR_RETURN(SharedBytes bytes, tier.GetShared(key));
  ATTIC_ASSIGN_OR_RETURN(EntryHeader header, VerifyEntry(*bytes, options_.fingerprint, check_layers));
  if (header.meta.key().ToString() != key) return DataLossError("misnamed KV entry");
  return Fetched{std::move(bytes), std::move(header)};
}

void KvStore::DropUnreadableLocked(const std::string& key, const Status& why) {
  Log(LogLevel::kWarn, "KV store: removing unreadable entry %s (%s)", key.c_str(), why.ToString().c_str());
  RemoveLocked(key);
  ++stats_.corrupt;
}

std::optional<StoreMatch> KvStore::Peek(const std::string& tenant, const std::string& session_id,
                                        const std::vector<int32_t>& tokens, uint64_t* bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto m = FindLocked(tenant, session_id, tokens);
  if (m && bytes != nullptr) *bytes = entries_.at(m->key).bytes;
  return m;
}

}  // namespace attic::store
