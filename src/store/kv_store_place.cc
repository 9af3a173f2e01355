// KvStore's placement (paper 001 sections 3.1, 3.3): a save goes to the top tier that
// takes it, making room by demoting victims of the eviction policy down the tiers; a
// read entry is promoted back up.
#include <algorithm>

#include "attic/core/log.h"
#include "attic/store/kv_store.h"
#include "attic/store/prefix_match.h"
#include "store/kv_store_internal.h"

namespace attic::store {

using internal::SessionKey;

bool KvStore::PromoteLocked(const std::string& key, SharedBytes bytes) {
  EntryInfo& info = entries_.at(key);
  const uint64_t size = bytes->size();
  // The SSD file stays (inclusive tiers), as a droppable copy: when DRAM victims demoted
  // to make room need SSD space, it goes first, so they take its place instead of pushing
  // another entry out of the SSD tier.
  info.ssd_copy = true;
  bool lost = false;
  if (MakeRoomLocked(TierLevel::kDram, size, key, &info, &lost).ok() && !lost && dram_->PutShared(key, bytes).ok()) {
    info.tier = TierLevel::kDram;  // ssd_copy: whether its file survived the room-making
    stats_.bytes_ssd_to_dram += size;
    return true;
  }
  const bool file_kept = info.ssd_copy;
  info.ssd_copy = false;
  if (file_kept) return false;  // stays on SSD
  lost = false;
  if (MakeRoomLocked(TierLevel::kSsd, size, key, &info, &lost).ok() && !lost && ssd_->PutShared(key, bytes).ok())
    return false;  // stays on SSD
  RemoveLocked(key);
  ++stats_.evictions_ssd;
  return false;
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

  std::lock_guard<std::mutex> lock(mu_);
  uint64_t inserted = 0;
  const uint64_t size = bytes->size();
  auto drop = [&](const std::string& k) {
    auto it = entries_.find(k);
    if (it == entries_.end()) return;
    inserted = inserted == 0 ? it->second.inserted_seq : std::min(inserted, it->second.inserted_seq);
    RemoveLocked(k);
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

  // DRAM first; an entry that does not fit there (or, under a policy that ranks
  // newcomers, would be DRAM's own victim) goes to SSD; one that would be the SSD's
  // victim too is not kept.
  Status st = ResourceExhaustedError("KV entry of " + std::to_string(size) + " bytes fits no tier");
  bool lost = false, placed = false;
  if (size <= dram_->capacity()) {
    st = MakeRoomLocked(TierLevel::kDram, size, key, &info, &lost);
    if (st.ok() && !lost) {
      st = dram_->PutShared(key, bytes);
      placed = st.ok();
      info.tier = TierLevel::kDram;
    }
  }
  if (!placed && ssd_ != nullptr && size <= ssd_->capacity()) {
    lost = false;
    st = MakeRoomLocked(TierLevel::kSsd, size, key, &info, &lost);
    if (st.ok() && !lost) {
      st = ssd_->PutShared(key, bytes);
      placed = st.ok();
      info.tier = TierLevel::kSsd;
    }
  }
  if (!placed) {
    if (!lost) return st;
    ++stats_.saves_not_kept;  // every stored entry is wanted sooner (scheduler-aware)
    return OkStatus();
  }
  IndexLocked(std::move(info));
  ++stats_.saves;
  stats_.bytes_saved += size;
  return OkStatus();
}

Status KvStore::MakeRoomLocked(TierLevel level, uint64_t need, const std::string& pinned,
                               const EntryInfo* newcomer, bool* newcomer_lost) {
  Tier* tier = TierFor(level);
  if (tier == nullptr || need > tier->capacity()) return ResourceExhaustedError("entry larger than the tier");
  const bool rank_newcomer = newcomer != nullptr && newcomer_lost != nullptr && policy_->RanksNewcomer();
  if (newcomer_lost != nullptr) *newcomer_lost = false;
  if (level == TierLevel::kSsd) {  // SSD copies of promoted entries go before any entry
    for (auto& [k, e] : entries_) {
      if (tier->bytes() + need <= tier->capacity()) break;
      if (!e.ssd_copy) continue;
      ssd_->Erase(k).IgnoreError();
      e.ssd_copy = false;
    }
  }
  while (tier->bytes() + need > tier->capacity()) {
    std::vector<const EntryInfo*> candidates;
    for (const auto& [k, e] : entries_)
      if (e.tier == level && k != pinned && &e != newcomer) candidates.push_back(&e);
    if (candidates.empty()) return ResourceExhaustedError(std::string(TierName(level)) + " tier cannot make room");
    if (rank_newcomer) candidates.push_back(newcomer);
    const EntryInfo* victim = policy_->PickVictim(level, candidates, hint_);
    ATTIC_CHECK(victim != nullptr);
    if (rank_newcomer && victim == newcomer) {
      *newcomer_lost = true;
      return OkStatus();
    }
    std::string vkey = victim->key;
    EntryInfo& v = entries_.at(vkey);
    if (level == TierLevel::kDram) {
      ++stats_.evictions_dram;
      v.prefetched = false;
      bool demoted = false;
      if (v.ssd_copy) {  // its bytes are still on SSD: nothing to write
        dram_->Erase(vkey).IgnoreError();
        v.tier = TierLevel::kSsd;
        v.ssd_copy = false;
        demoted = true;
      } else if (ssd_ != nullptr && v.bytes <= ssd_->capacity()) {
        // The demoted entry is itself a newcomer on SSD: under the scheduler-aware
        // policy it is dropped rather than displace an SSD entry needed sooner.
        auto bytes = dram_->GetShared(vkey);
        bool lost = false;
        if (bytes.ok() && MakeRoomLocked(TierLevel::kSsd, (*bytes)->size(), pinned, &v, &lost).ok() && !lost &&
            ssd_->PutShared(vkey, *bytes).ok()) {
          dram_->Erase(vkey).IgnoreError();
          v.tier = TierLevel::kSsd;
          stats_.bytes_dram_to_ssd += (*bytes)->size();
          demoted = true;
        }
      }
      if (!demoted) RemoveLocked(vkey);
    } else {
      ++stats_.evictions_ssd;
      RemoveLocked(vkey);
    }
  }
  return OkStatus();
}

void KvStore::RecordReuse(int n_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.reused_tokens += static_cast<uint64_t>(std::max(0, n_tokens));
}

}  // namespace attic::store
