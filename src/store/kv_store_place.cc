// KvStore's placement (paper 001 sections 3.1, 3.3) over its ordered tiers: a save goes
// to the first tier that takes it, making room by moving victims of the eviction policy
// one tier down (out of the store from the last tier); a read entry moves back to the
// top tier.
//
// Lock protocol (kv_store.h): a placement holds place_mu_ throughout, so one runs at a
// time, and mu_ except around the I/O of tiers that are not local memory (TierIo,
// EraseDoomed): lookups, look-ahead hints, reads and the write buffer go on meanwhile.
// Only a holder of place_mu_ inserts or erases index entries, so references into
// entries_ stay valid across those unlocked stretches; other threads change only ranking
// fields (access_seq, queue_position, prefetched) under mu_. What a concurrent Fetch sees
// of an entry that moves:
//   - demoted (a tier down): it stays indexed where it was, its bytes there, until the
//     copy below is written; then the index moves it (a new `version`) and the source is
//     erased. A read of the source after that fails, finds `version` changed and reads
//     again from the new tier ("moved, retry").
//   - promoted (to the top): `moving`, with its read bytes in in_transit_, served to a
//     Fetch meanwhile (room-making may drop its lower copy before the top copy exists).
//   - evicted: unindexed first, then erased: a read finds it gone (a miss).
//   - saved again: a new entry, indexed with a new `version`; a read of the old one
//     that fails reads again (the new one may since sit where the old one was).
#include <algorithm>

#include "attic/core/log.h"
#include "attic/store/kv_store.h"
#include "attic/store/prefix_match.h"
#include "store/kv_store_internal.h"

namespace attic::store {

using internal::SessionKey;

Status KvStore::TierIo(std::unique_lock<std::mutex>& lock, int level, const std::function<Status()>& io) {
  if (traits_[level].local_memory) return io();
  lock.unlock();
  Status st = io();
  lock.lock();
  return st;
}

Status KvStore::TierPut(std::unique_lock<std::mutex>& lock, int level, const std::string& key,
                        const SharedBytes& bytes) {
  Status st = TierIo(lock, level, [&] { return tiers_[level]->PutShared(key, bytes); });
  if (tier_failing_.size() < tiers_.size()) tier_failing_.resize(tiers_.size(), false);
  if (!st.ok()) {
    ++stats_.write_errors;
    if (!tier_failing_[level])
      Log(LogLevel::kWarn, "KV store: writes to the %s tier fail (%s): serving from the other tiers until it works",
          tiers_[level]->name().c_str(), st.ToString().c_str());
    tier_failing_[level] = true;
  } else if (tier_failing_[level]) {
    Log(LogLevel::kInfo, "KV store: writes to the %s tier work again", tiers_[level]->name().c_str());
    tier_failing_[level] = false;
  }
  return st;
}

void KvStore::Unindex(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  const EntryInfo& e = it->second;
  if (!e.session_id.empty()) {
    auto s = sessions_.find(SessionKey(e.tenant, e.session_id));
    if (s != sessions_.end() && s->second == key) sessions_.erase(s);
  }
  for (uint64_t h : PrefixHashes(e.tenant, e.tokens)) {
    auto p = prefixes_.find(h);
    if (p == prefixes_.end()) continue;
    p->second.erase(key);
    if (p->second.empty()) prefixes_.erase(p);
  }
  for (int level : {TierIndex(e.tier), e.copy_level}) {
    if (level < 0) continue;
    if (traits_[level].local_memory) {
      tiers_[level]->Erase(key).IgnoreError();
    } else {
      doomed_.emplace_back(level, key);
    }
  }
  entries_.erase(it);
}

void KvStore::EraseDoomed(std::unique_lock<std::mutex>& lock) {
  while (!doomed_.empty()) {
    std::vector<std::pair<int, std::string>> batch;
    batch.swap(doomed_);
    // A copy the index names again (a key saved anew) stays. (A promoting entry's own
    // tier holds only its droppable copy: copy_level says whether that is wanted.)
    batch.erase(std::remove_if(batch.begin(), batch.end(),
                               [&](const std::pair<int, std::string>& d) {
                                 auto it = entries_.find(d.second);
                                 if (it == entries_.end()) return false;
                                 const EntryInfo& e = it->second;
                                 return (TierIndex(e.tier) == d.first && !e.moving) || e.copy_level == d.first;
                               }),
                batch.end());
    if (batch.empty()) continue;
    lock.unlock();
    for (const auto& [level, key] : batch) tiers_[level]->Erase(key).IgnoreError();
    lock.lock();
  }
}

bool KvStore::RemoveIf(const std::string& key, const std::function<bool(const EntryInfo&)>& still) {
  std::lock_guard<std::mutex> placing(place_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !still(it->second)) return false;
  Unindex(key);
  EraseDoomed(lock);
  return true;
}

void KvStore::Stamp(KvEntry* entry, int64_t ttl_ms) const {
  if (entry->fingerprint.empty()) entry->fingerprint = options_.fingerprint;
  const int64_t ttl = ttl_ms < 0 ? options_.default_ttl_ms : ttl_ms;
  entry->expires_at_ms = ttl == 0 ? 0 : clock_->NowMs() + ttl;
}

Status KvStore::Save(KvEntry entry, const std::string& replaces, int64_t ttl_ms) {
  Stamp(&entry, ttl_ms);
  return Place(entry, replaces);
}

Status KvStore::Place(const KvEntry& entry, const std::string& replaces) {
  if (entry.fingerprint != options_.fingerprint) return InvalidArgumentError("KV entry of another model");
  ATTIC_ASSIGN_OR_RETURN(std::unique_ptr<Bytes> serialized, SerializeEntryBytes(entry));
  SharedBytes bytes(std::move(serialized));
  const std::string key = entry.key().ToString();

  std::lock_guard<std::mutex> placing(place_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t inserted = 0;
  const uint64_t size = bytes->size();
  auto drop = [&](const std::string& k) {
    auto it = entries_.find(k);
    if (it == entries_.end()) return;
    inserted = inserted == 0 ? it->second.inserted_seq : std::min(inserted, it->second.inserted_seq);
    Unindex(k);
  };
  if (!entry.session_id.empty()) {
    auto s = sessions_.find(SessionKey(entry.tenant, entry.session_id));
    if (s != sessions_.end()) drop(std::string(s->second));
  }
  if (!replaces.empty()) drop(replaces);
  drop(key);

  EntryInfo info;
  info.key = key;
  info.tenant = entry.tenant;
  info.session_id = entry.session_id;
  info.tokens = entry.tokens;  // the entry may be shared (a queued save's readers)
  info.bytes = size;
  info.expires_at_ms = entry.expires_at_ms;
  info.access_seq = ++seq_;
  // A session keeps its place in FIFO order across turns.
  info.inserted_seq = inserted != 0 ? inserted : info.access_seq;
  // The first queued job of the session whose prompt extends the new entry will read it
  // (the hint named the old entry). Not the job that produced it: its prompt is shorter.
  if (!info.session_id.empty())
    for (size_t i = 0; i < queue_.size(); ++i) {
      const QueuedJob& j = queue_[i];
      if (j.session_id != info.session_id || j.tenant != info.tenant) continue;
      if (CommonPrefix(*j.tokens, info.tokens) == static_cast<int>(info.tokens.size()))
        info.queue_position = static_cast<int>(i);
      break;
    }

  // The top tier first; an entry that does not fit a tier (or, under a policy that
  // ranks newcomers, would be that tier's own victim) goes to the next; one that would
  // be the last tier's victim too is not kept.
  Status st = ResourceExhaustedError("KV entry of " + std::to_string(size) + " bytes fits no tier");
  bool lost = false, placed = false;
  for (int level = 0; level < n_tiers() && !placed; ++level) {
    if (size > tiers_[level]->capacity()) continue;
    lost = false;
    st = MakeRoom(lock, level, size, key, &info, &lost);
    if (st.ok() && !lost) {
      st = TierPut(lock, level, key, bytes);
      placed = st.ok();
      info.tier = TierAt(level);
    }
  }
  if (placed) {
    const std::string& through = options_.write_through_session_prefix;
    if (options_.write_through || (!through.empty() && info.session_id.compare(0, through.size(), through) == 0))
      WriteThrough(lock, &info, bytes);
    IndexLocked(std::move(info));
    ++stats_.saves;
    stats_.bytes_saved += size;
  } else if (lost) {
    ++stats_.saves_not_kept;  // every stored entry is wanted sooner (scheduler-aware)
    st = OkStatus();
  }
  EraseDoomed(lock);
  return placed ? OkStatus() : st;
}

Status KvStore::MakeRoom(std::unique_lock<std::mutex>& lock, int level, uint64_t need, const std::string& pinned,
                         const EntryInfo* newcomer, bool* newcomer_lost) {
  Tier* tier = tiers_[level].get();
  if (need > tier->capacity()) return ResourceExhaustedError("entry larger than the tier");
  const bool rank_newcomer = newcomer != nullptr && newcomer_lost != nullptr && policy_->RanksNewcomer();
  if (newcomer_lost != nullptr) *newcomer_lost = false;
  if (traits_[level].evicts_itself) return OkStatus();  // it makes its own room
  EraseDoomed(lock);
  if (level > 0) {
    // Droppable copies of promoted entries go before any entry.
    uint64_t used = tier->bytes();
    for (auto& [k, e] : entries_) {
      if (used + need <= tier->capacity()) break;
      if (e.copy_level != level) continue;
      e.copy_level = -1;
      used -= std::min(used, e.bytes);
      if (traits_[level].local_memory) {
        tier->Erase(k).IgnoreError();
      } else {
        doomed_.emplace_back(level, k);
      }
    }
    EraseDoomed(lock);
  }
  while (tier->bytes() + need > tier->capacity()) {
    std::vector<const EntryInfo*> candidates;
    for (const auto& [k, e] : entries_)
      if (TierIndex(e.tier) == level && k != pinned && &e != newcomer && !e.moving) candidates.push_back(&e);
    if (candidates.empty()) return ResourceExhaustedError(tier->name() + " tier cannot make room");
    if (rank_newcomer) candidates.push_back(newcomer);
    const EntryInfo* victim = policy_->PickVictim(TierAt(level), candidates, hint_);
    ATTIC_CHECK(victim != nullptr);
    if (rank_newcomer && victim == newcomer) {
      *newcomer_lost = true;
      return OkStatus();
    }
    ++stats_.tiers[level].evictions;
    Demote(lock, entries_.at(victim->key), level, pinned);
    EraseDoomed(lock);
  }
  return OkStatus();
}

void KvStore::Demote(std::unique_lock<std::mutex>& lock, EntryInfo& v, int level, const std::string& pinned) {
  const std::string key = v.key;
  auto erase_source = [&] {
    if (traits_[level].local_memory) {
      tiers_[level]->Erase(key).IgnoreError();
    } else {
      doomed_.emplace_back(level, key);
    }
  };
  v.prefetched = false;
  if (v.copy_level > level) {  // its bytes are still in its copy's tier: nothing to write
    v.tier = TierAt(v.copy_level);
    v.copy_level = -1;
    v.version = ++version_seq_;
    erase_source();
    return;
  }
  const int below = level + 1;
  if (below < n_tiers() && v.bytes <= tiers_[below]->capacity()) {
    SharedBytes bytes;
    Status read = TierIo(lock, level, [&] {
      StatusOr<SharedBytes> b = tiers_[level]->GetShared(key);
      if (b.ok()) bytes = std::move(*b);
      return b.status();
    });
    // The demoted entry is itself a newcomer below: under the scheduler-aware policy it
    // leaves the store rather than displace an entry needed sooner.
    bool lost = false;
    if (read.ok() && MakeRoom(lock, below, bytes->size(), pinned, &v, &lost).ok() && !lost &&
        TierPut(lock, below, key, bytes).ok()) {
      v.tier = TierAt(below);
      v.version = ++version_seq_;
      erase_source();
      stats_.bytes_dram_to_ssd += bytes->size();
      return;
    }
  }
  Unindex(key);
}

bool KvStore::Promote(std::unique_lock<std::mutex>& lock, const std::string& key, const Fetched& read) {
  EntryInfo& info = entries_.at(key);
  const int from = TierIndex(info.tier);
  const uint64_t size = read.bytes->size();
  // The lower copy stays (inclusive tiers), as a droppable copy: when entries demoted to
  // make room for this one need space in its tier, it goes first, so they take its place
  // instead of pushing another entry out.
  info.copy_level = from;
  info.moving = true;
  info.version = ++version_seq_;
  in_transit_[key] = read;
  prefetch_done_.notify_all();  // a Fetch waiting for a prefetch of it may take these bytes
  bool lost = false, promoted = false, kept = true;
  if (MakeRoom(lock, 0, size, key, &info, &lost).ok() && !lost &&
      TierPut(lock, 0, key, read.bytes).ok()) {
    info.tier = TierLevel::kDram;  // copy_level: whether the lower copy survived the room-making
    stats_.bytes_ssd_to_dram += size;
    promoted = true;
  } else if (info.copy_level != from) {
    // Its lower copy made room for others: it goes back there, unless not even that fits.
    info.copy_level = -1;
    lost = false;
    kept = MakeRoom(lock, from, size, key, &info, &lost).ok() && !lost &&
           TierPut(lock, from, key, read.bytes).ok();
  } else {
    info.copy_level = -1;  // stays where it was
  }
  info.moving = false;
  in_transit_.erase(key);
  if (!kept) {
    ++stats_.tiers[from].evictions;
    Unindex(key);
  }
  EraseDoomed(lock);
  return promoted;
}

KvStore::PersistReport KvStore::PersistDram() {
  PersistReport report;
  Flush();
  std::lock_guard<std::mutex> placing(place_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  if (n_tiers() < 2 || !traits_[0].local_memory || traits_[1].local_memory || traits_[1].shared) return report;
  // Least recently used first: where the tier below cannot hold them all, the entries
  // demoted last (the most recently used) push the earlier ones out, not the reverse.
  std::vector<std::pair<uint64_t, std::string>> order;  // (access_seq, key)
  for (const auto& [key, e] : entries_)
    if (TierIndex(e.tier) == 0 && !e.moving && !Expired(e)) order.emplace_back(e.access_seq, key);
  std::sort(order.begin(), order.end());
  const uint64_t written_before = stats_.bytes_dram_to_ssd;
  for (const auto& [seq, key] : order) {
    auto it = entries_.find(key);
    if (it == entries_.end() || TierIndex(it->second.tier) != 0 || it->second.moving) continue;
    Demote(lock, it->second, 0, /*pinned=*/"");
    EraseDoomed(lock);
  }
  for (const auto& [seq, key] : order) {
    auto it = entries_.find(key);
    if (it != entries_.end() && TierIndex(it->second.tier) == 1) {
      ++report.entries;
    } else {
      ++report.dropped;
    }
  }
  report.bytes_written = stats_.bytes_dram_to_ssd - written_before;
  return report;
}

void KvStore::RecordReuse(int n_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.reused_tokens += static_cast<uint64_t>(std::max(0, n_tokens));
}

}  // namespace attic::store
