// KvStore over shared tiers (TierTraits::shared: a Redis Cluster tier that several
// instances use; docs/store.md "Remote tier"). The store's index is a cache of such a
// tier: what this instance saved is indexed when saved; what another instance saved is
// found by session (Tier::FindSession) when a queued job's session is not indexed here
// (the prefetch thread, DiscoverQueued) or, failing that, when its lookup misses, and
// indexed where it lies after its header checked out. A session indexed here is asked
// for too (a lookup, a queued job): another instance may have saved a later turn of it. A save may also be
// written through to the shared tier at once (StoreOptions::write_through), so the
// other instances can find it before it is ever demoted.
#include "attic/core/log.h"
#include "attic/store/kv_store.h"
#include "attic/store/layer_read.h"
#include "attic/store/prefix_match.h"
#include "store/kv_store_internal.h"

namespace attic::store {

using internal::SessionKey;

void KvStore::DiscoverSession(const std::string& tenant, const std::string& session_id,
                              const std::vector<int32_t>* tokens) {
  if (session_id.empty() || !any_shared_) return;
  const std::string sk = SessionKey(tenant, session_id);
  // The session's entry indexed here, if any: another instance may have saved a later
  // turn of it since (a conversation that went A -> B -> A). Without the request's
  // tokens there is nothing to judge a newer entry by, and the indexed one stands.
  std::string local;
  int local_common = 0;  // the prompt tokens it shares
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto s = sessions_.find(sk);
    if (s != sessions_.end()) {
      if (tokens == nullptr) return;
      local = s->second;
      auto e = entries_.find(local);
      if (e != entries_.end()) local_common = CommonPrefix(e->second.tokens, *tokens);
    }
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
    if (*key == local) return;  // the newest save is the one indexed here
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
    // With an entry of the session indexed here, the other one is taken only when it
    // serves this request better (its tokens share more with the prompt): a later turn
    // another instance saved, not an older one (a write-back instance's newer turn that
    // has not reached the cluster yet) nor another branch of the conversation.
    if (!local.empty() && CommonPrefix(info.tokens, *tokens) <= local_common) return;
    std::lock_guard<std::mutex> placing(place_mu_);
    std::unique_lock<std::mutex> lock(mu_);
    // Saved or found by this instance meanwhile: that one stands.
    if (entries_.count(info.key) != 0) return;
    auto s = sessions_.find(sk);
    if ((s == sessions_.end() ? std::string() : s->second) != local) return;
    // The turn it continues is replaced, as a save of the next turn here replaces it
    // (KvStore::Place); an entry it does not continue stays, found by prefix only.
    if (auto e = entries_.find(local);
        e != entries_.end() && CommonPrefix(e->second.tokens, info.tokens) == static_cast<int>(e->second.tokens.size())) {
      Unindex(local);
      ++stats_.shared_superseded;
    }
    info.inserted_seq = info.access_seq = ++seq_;
    IndexLocked(std::move(info));
    ++stats_.shared_found;
    EraseDoomed(lock);
    return;
  }
}

void KvStore::DiscoverQueued() {
  constexpr size_t kJobs = 4;           // queued jobs looked at per prefetch run
  constexpr int64_t kRetryMs = 1000;    // a session asked for is not asked again sooner
  if (!any_shared_) return;
  struct Todo {
    std::string tenant, session_id;
    SharedTokens tokens;
  };
  std::vector<Todo> todo;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = clock_->NowMs();
    if (discover_tried_.size() > 4096) discover_tried_.clear();
    for (size_t i = 0; i < queue_.size() && todo.size() < kJobs; ++i) {
      const QueuedJob& j = queue_[i];
      if (j.session_id.empty() || !j.key.empty()) continue;
      const std::string sk = SessionKey(j.tenant, j.session_id);
      auto t = discover_tried_.find(sk);
      if (t != discover_tried_.end() && now - t->second < kRetryMs) continue;
      discover_tried_[sk] = now;
      todo.push_back({j.tenant, j.session_id, j.tokens});
    }
  }
  for (const Todo& t : todo) DiscoverSession(t.tenant, t.session_id, &*t.tokens);
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
