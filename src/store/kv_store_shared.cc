// KvStore over shared tiers (TierTraits::shared: a Redis Cluster tier that several
// instances use; docs/store.md "Remote tier"). The store's index is a cache of such a
// tier: what this instance saved is indexed when saved; what another instance saved is
// found by session (Tier::FindSession) when a queued job's session is not indexed here
// (the prefetch thread, DiscoverQueued) or, failing that, when its lookup misses, and
// indexed where it lies after its header checked out. A save may also be
// written through to the shared tier at once (StoreOptions::write_through), so the
// other instances can find it before it is ever demoted.
#include "attic/core/log.h"
#include "attic/store/kv_store.h"
#include "attic/store/layer_read.h"
#include "store/kv_store_internal.h"

namespace attic::store {

using internal::SessionKey;

void KvStore::DiscoverSession(const std::string& tenant, const std::string& session_id) {
  if (session_id.empty() || !any_shared_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sessions_.count(SessionKey(tenant, session_id)) != 0) return;  // indexed: this instance's or found before
  }
  EntryKey want;
  want.tenant = tenant;
  want.fingerprint = options_.fingerprint;
  want.dtype = options_.kv_dtype;
  want.session_id = session_id;
  for (int level = 0; level < n_tiers(); ++level) {
    if (!traits_[level].shared) continue;
    Tier& tier = *tiers_[level];
    auto count = [&](uint64_t StoreStats::*counter) {
      std::lock_guard<std::mutex> lock(mu_);
      ++(stats_.*counter);
    };
    StatusOr<std::string> key = tier.FindSession(want);
    if (!key.ok()) {
      if (ClassifyReadError(key.status()) == ReadError::kTransient) count(&StoreStats::read_errors);
      continue;  // none there (or a pointer that names something else: never followed)
    }
    // The header only (a ranged read): the layers are read, and verified, when the entry
    // is loaded, like any entry of that tier.
    StatusOr<EntryHeader> h = ReadEntryHeader(tier, *key, options_.fingerprint);
    if (h.ok() && (h->meta.key().ToString() != *key || h->meta.tenant != tenant || h->meta.session_id != session_id))
      h = DataLossError("misnamed KV entry");
    if (!h.ok()) {
      const ReadError kind = ClassifyReadError(h.status());
      if (kind == ReadError::kTransient) {
        count(&StoreStats::read_errors);
      } else if (kind == ReadError::kCorrupt) {
        Log(LogLevel::kWarn, "KV store: removing corrupt entry %s from the %s tier (%s)", key->c_str(),
            tier.name().c_str(), h.status().ToString().c_str());
        tier.Erase(*key).IgnoreError();
        count(&StoreStats::corrupt);
      }
      continue;
    }
    EntryInfo info = internal::ReadEntryInfo(*key, h->meta, h->total_bytes, level);  // tenant, session: checked above
    if (Expired(info)) continue;
    std::lock_guard<std::mutex> placing(place_mu_);
    std::lock_guard<std::mutex> lock(mu_);
    // Saved or found by this instance meanwhile: that one stands.
    if (entries_.count(info.key) != 0 || sessions_.count(SessionKey(tenant, session_id)) != 0) return;
    info.inserted_seq = info.access_seq = ++seq_;
    IndexLocked(std::move(info));
    ++stats_.shared_found;
    return;
  }
}

void KvStore::DiscoverQueued() {
  constexpr size_t kJobs = 4;           // queued jobs looked at per prefetch run
  constexpr int64_t kRetryMs = 1000;    // a session asked for is not asked again sooner
  if (!any_shared_) return;
  std::vector<std::pair<std::string, std::string>> todo;  // (tenant, session id)
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = clock_->NowMs();
    if (discover_tried_.size() > 4096) discover_tried_.clear();
    for (size_t i = 0; i < queue_.size() && todo.size() < kJobs; ++i) {
      const QueuedJob& j = queue_[i];
      if (j.session_id.empty() || !j.key.empty()) continue;
      const std::string sk = SessionKey(j.tenant, j.session_id);
      if (sessions_.count(sk) != 0) continue;
      auto t = discover_tried_.find(sk);
      if (t != discover_tried_.end() && now - t->second < kRetryMs) continue;
      discover_tried_[sk] = now;
      todo.emplace_back(j.tenant, j.session_id);
    }
  }
  for (const auto& [tenant, session_id] : todo) DiscoverSession(tenant, session_id);
}

void KvStore::WriteThrough(std::unique_lock<std::mutex>& lock, EntryInfo* info, const SharedBytes& bytes) {
  for (int level = TierIndex(info->tier) + 1; level < n_tiers(); ++level) {
    if (!traits_[level].shared) continue;
    if (bytes->size() > tiers_[level]->capacity()) return;
    const std::string key = info->key;
    Status st = TierIo(lock, level, [&] { return tiers_[level]->PutShared(key, bytes); });
    if (st.ok()) {
      info->copy_level = level;
      ++stats_.write_throughs;
    } else {
      ++stats_.write_through_errors;
      Log(LogLevel::kWarn, "KV store: cannot write entry %s through to the %s tier (%s): kept locally", key.c_str(),
          tiers_[level]->name().c_str(), st.ToString().c_str());
    }
    return;
  }
}

}  // namespace attic::store
