// KvStore::Fetch (and Load on top of it): the store side of layer-wise pre-loading
// (paper 001 section 3.2). The entry's bytes are handed out shared (a DRAM-tier value is
// not copied), verified, and read from any tier outside the store's lock so lookups and
// saves go on; Peek plans the read buffer. A read that fails is "moved, retry" (the
// entry changed tiers meanwhile), a transient miss, or an entry dropped (ReadFailed).
#include "attic/core/log.h"
#include "attic/store/kv_store.h"

namespace attic::store {

namespace {
constexpr int kMaxMoveRetries = 8;  // reads of an entry that keeps moving before it is a miss
}  // namespace

StatusOr<KvStore::Fetched> KvStore::Fetch(const std::string& key) {
  for (int attempt = 0;; ++attempt) {
    bool moved = false;
    auto f = FetchOnce(key, &moved);
    // The entry moved between tiers while it was read (a demotion or a promotion): read
    // it again from where it is now.
    if (!moved) return f;
    if (attempt + 1 == kMaxMoveRetries) return UnavailableError("KV entry " + key + " kept moving");
  }
}

StatusOr<KvStore::ReadStart> KvStore::BeginRead(const std::string& key) {
  std::unique_lock<std::mutex> lock(mu_);
  // A prefetch reading it: wait for that read (then it is in DRAM, in transit, or not).
  prefetch_done_.wait(lock, [&] { return prefetching_ != key || in_transit_.count(key) != 0; });
  auto it = entries_.find(key);
  if (it == entries_.end()) return NotFoundError("no KV entry " + key);
  EntryInfo& info = it->second;
  if (Expired(info)) {
    lock.unlock();
    if (RemoveIf(key, [&](const EntryInfo& e) { return Expired(e); })) {
      lock.lock();
      ++stats_.expired;
    }
    return NotFoundError("KV entry " + key + " expired");
  }
  info.access_seq = ++seq_;
  ReadStart start;
  if (auto t = in_transit_.find(key); t != in_transit_.end()) {  // being promoted: read already
    stats_.bytes_loaded += t->second.bytes->size();
    start.in_transit = t->second;
    return start;
  }
  start.level = TierIndex(info.tier);
  start.version = info.version;
  if (start.level == 0 && info.prefetched) {
    info.prefetched = false;
    ++stats_.prefetches_useful;
  }
  return start;
}

StatusOr<KvStore::Fetched> KvStore::FetchOnce(const std::string& key, bool* moved) {
  *moved = false;
  ATTIC_ASSIGN_OR_RETURN(ReadStart start, BeginRead(key));
  if (start.in_transit) return std::move(*start.in_transit);
  const int level = start.level;
  // The read and the checksums happen outside the lock: lookups and saves go on. The
  // layer checksums guard what crossed a persistence boundary (every read of a tier
  // that is not local memory, and restart); DRAM-tier bytes never left this process's
  // memory, so only their header is checked (verifying 46 MB of a 1k-token 135M entry
  // took ~3 ms of a ~80 ms TTFT).
  StatusOr<Fetched> read = ReadChecked(*tiers_[level], key, ChecksLayers(level));
  if (!read.ok()) return ReadFailedOrMoved(key, level, start.version, read.status(), moved);
  Fetched f = std::move(*read);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_loaded += f.bytes->size();
  }
  PromoteRead(key, level, start.version, f);
  return f;
}

Status KvStore::ReadFailedOrMoved(const std::string& key, int level, uint64_t version, const Status& why, bool* moved) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotFoundError("KV entry " + key + " was erased");
    const EntryInfo& e = it->second;
    if (TierIndex(e.tier) != level || e.version != version || e.moving) {
      *moved = true;
      return UnavailableError("KV entry " + key + " moved");
    }
  }
  return ReadFailed(key, level, version, why);
}

void KvStore::PromoteRead(const std::string& key, int level, uint64_t version, const Fetched& read) {
  if (level == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.tier == TierLevel::kDram || read.bytes->size() > tiers_[0]->capacity())
      return;
  }
  // The paper fetches whole sessions to DRAM; a failure leaves it where it is.
  std::lock_guard<std::mutex> placing(place_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && TierIndex(it->second.tier) == level && it->second.version == version)
    Promote(lock, key, read);
}

Status KvStore::ReadFailed(const std::string& key, int level, uint64_t version, const Status& why) {
  const ReadError kind = ClassifyReadError(why);
  if (kind == ReadError::kTransient) {  // a miss now; the entry stays for the next read
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.read_errors;
    return UnavailableError("KV entry " + key + " cannot be read now: " + why.ToString());
  }
  // Dropped only if it is still what was read (not moved or replaced meanwhile).
  const bool removed = RemoveIf(
      key, [&](const EntryInfo& e) { return TierIndex(e.tier) == level && e.version == version && !e.moving; });
  const bool quiet = kind == ReadError::kVanished && (traits_[level].shared || traits_[level].evicts_itself);
  if (removed) {
    if (!quiet)
      Log(LogLevel::kWarn, "KV store: removing unreadable entry %s (%s)", key.c_str(), why.ToString().c_str());
    std::lock_guard<std::mutex> lock(mu_);
    ++(quiet ? stats_.vanished : stats_.corrupt);
  }
  return NotFoundError("KV entry " + key + (quiet ? " is gone" : " unreadable"));
}

StatusOr<KvStore::Fetched> KvStore::FetchFromDram(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.tier != TierLevel::kDram || Expired(it->second))
      return NotFoundError("KV entry " + key + " is not in DRAM");
  }
  // A demotion between the check and the read makes GetShared fail: NotFound as well.
  StatusOr<Fetched> read = ReadChecked(*tiers_[0], key, ChecksLayers(0));
  if (!read.ok()) return NotFoundError("KV entry " + key + " is not in DRAM");
  return read;
}

StatusOr<KvStore::Fetched> KvStore::ReadChecked(Tier& tier, const std::string& key, bool check_layers) const {
  ATTIC_ASSIGN_OR_RETURN(SharedBytes bytes, tier.GetShared(key));
  ATTIC_ASSIGN_OR_RETURN(EntryHeader header, VerifyEntry(*bytes, options_.fingerprint, check_layers));
  if (header.meta.key().ToString() != key) return DataLossError("misnamed KV entry");
  // A bad attachment does not make the entry bad: its user finds it bad when it reads it
  // (EntryAttachmentBytes) and goes without. Counted and logged where the layers are
  // checked too (bytes that crossed a persistence boundary).
  if (check_layers) CheckAttachments(key, *bytes, header);
  return Fetched{std::move(bytes), std::move(header)};
}

void KvStore::CheckAttachments(const std::string& key, std::string_view bytes, const EntryHeader& h) const {
  for (const AttachmentInfo& a : h.attachments) {
    if (auto view = EntryAttachmentBytes(bytes, h, a.kind); !view.ok()) {
      corrupt_attachments_.fetch_add(1);
      Log(LogLevel::kWarn, "KV store: entry %s: %s (dropped; the KV is served)", key.c_str(),
          view.status().ToString().c_str());
    }
  }
}

std::optional<StoreMatch> KvStore::Peek(const std::string& tenant, const std::string& session_id,
                                        const std::vector<int32_t>& tokens, uint64_t* bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto m = FindLocked(tenant, session_id, tokens);
  if (m && bytes != nullptr) *bytes = entries_.at(m->key).bytes;
  return m;
}

}  // namespace attic::store
