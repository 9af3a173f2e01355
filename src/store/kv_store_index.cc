// KvStore's index: entries by key, sessions, block-aligned prefix hashes; lookups
// (session, else the longest stored prefix: prefix_match.h) and the look-ahead hint.
#include <algorithm>

#include "attic/core/hash.h"
#include "attic/store/kv_store.h"
#include "attic/store/prefix_match.h"
#include "store/kv_store_internal.h"

namespace attic::store {

using internal::SessionKey;

bool KvStore::Expired(const EntryInfo& e) const { return e.expires_at_ms != 0 && e.expires_at_ms <= clock_->NowMs(); }

std::vector<uint64_t> KvStore::PrefixHashes(const std::string& tenant, const std::vector<int32_t>& tokens) const {
  const size_t b = static_cast<size_t>(options_.prefix_block);
  std::vector<uint64_t> out;
  uint64_t h = Hash64(tenant, 0x7465);
  for (size_t end = b; end <= tokens.size(); end += b) {
    h = Hash64(tokens.data() + end - b, b * sizeof(int32_t), h);
    out.push_back(h);
  }
  return out;
}

void KvStore::IndexLocked(EntryInfo info) {
  info.version = ++version_seq_;
  if (!info.session_id.empty()) sessions_[SessionKey(info.tenant, info.session_id)] = info.key;
  for (uint64_t h : PrefixHashes(info.tenant, info.tokens)) prefixes_[h].insert(info.key);
  std::string key = info.key;
  entries_[key] = std::move(info);
}

std::optional<StoreMatch> KvStore::FindLocked(const std::string& tenant, const std::string& session_id,
                                              const std::vector<int32_t>& tokens, bool* other_type) {
  int n = 0;
  const EntryInfo* best = FindEntryLocked(tenant, session_id, tokens, &n, other_type);
  if (best == nullptr) return std::nullopt;
  StoreMatch m;
  m.key = best->key;
  m.n_tokens = n;
  m.entry_tokens = static_cast<int>(best->tokens.size());
  m.tier = best->tier;
  return m;
}

EntryInfo* KvStore::FindEntryLocked(const std::string& tenant, const std::string& session_id,
                                    const std::vector<int32_t>& tokens, int* n_tokens, bool* other_type) {
  BestPrefixMatch<EntryInfo*> best;
  auto consider = [&](const std::string& key) {
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.tenant != tenant || Expired(it->second)) return;
    if (!EntryKeyHasDtype(key, kv_dtype())) {  // another store type's entry: never served
      if (other_type != nullptr && CommonPrefix(it->second.tokens, tokens) > 0) *other_type = true;
      return;
    }
    EntryInfo& e = it->second;
    best.Offer(&e, {CommonPrefix(e.tokens, tokens), !session_id.empty() && e.session_id == session_id, e.access_seq});
  };
  if (!session_id.empty()) {
    auto s = sessions_.find(SessionKey(tenant, session_id));
    if (s != sessions_.end()) consider(s->second);
  }
  std::vector<uint64_t> hashes = PrefixHashes(tenant, tokens);
  // The chain hash of a longer prefix implies all shorter ones: the deepest level
  // present holds the longest block-aligned matches.
  const std::unordered_set<std::string>* deepest = nullptr;
  for (uint64_t h : hashes) {
    auto p = prefixes_.find(h);
    if (p == prefixes_.end()) break;
    deepest = &p->second;
  }
  if (deepest != nullptr)
    for (const std::string& key : *deepest) consider(key);
  if (!best.found()) return nullptr;
  *n_tokens = best.common();
  return best.item();
}

AheadEntry KvStore::ResolveLocked(const QueuedJob& job) {
  AheadEntry out;
  out.prompt_tokens = job.prompt_tokens > 0 ? job.prompt_tokens : static_cast<int>(job.tokens->size());
  if (!job.key.empty()) {
    auto it = entries_.find(job.key);
    if (it == entries_.end() || it->second.tenant != job.tenant) return out;
    out.key = job.key;
    out.tier = it->second.tier;
    out.bytes = it->second.bytes;
    out.n_tokens = static_cast<int>(it->second.tokens.size());
    return out;
  }
  auto m = FindLocked(job.tenant, job.session_id, *job.tokens);
  if (!m) return out;
  out.key = m->key;
  out.tier = m->tier;
  out.bytes = entries_.at(m->key).bytes;
  out.n_tokens = m->n_tokens;
  return out;
}

std::optional<StoreMatch> KvStore::Lookup(const std::string& tenant, const std::string& session_id,
                                          const std::vector<int32_t>& tokens) {
  AwaitQueuedSaves(tenant, session_id, &tokens, /*wait=*/true);
  DiscoverSession(tenant, session_id, &tokens);  // another instance's save of it, in a shared tier
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.lookups;
  bool other_type = false;
  auto m = FindLocked(tenant, session_id, tokens, &other_type);
  if (!m) {
    ++stats_.misses;
    if (other_type) ++stats_.other_type_misses;
  } else {
    ++stats_.tiers[TierIndex(m->tier)].hits;
    EntryInfo& e = entries_.at(m->key);
    // The job it was prefetched for (or a later one) reads it from DRAM.
    if (m->tier == TierLevel::kDram && e.prefetched) {
      e.prefetched = false;
      ++stats_.prefetches_useful;
    }
  }
  return m;
}

StatusOr<KvEntry> KvStore::Load(const std::string& key) {
  ATTIC_ASSIGN_OR_RETURN(Fetched f, Fetch(key));
  return MaterializeEntry(*f.bytes, std::move(f.header));
}


bool KvStore::Contains(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.count(key) != 0;
}

std::optional<TierLevel> KvStore::TierOf(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second.tier;
}

uint64_t KvStore::MeanEntryBytesLocked() const {
  if (entries_.empty()) return 0;
  uint64_t total = 0;
  for (const auto& [k, e] : entries_) total += e.bytes;
  return std::max<uint64_t>(1, total / entries_.size());
}

void KvStore::SetLookAhead(std::vector<QueuedJob> jobs) {
  // The read buffer fetches the next jobs' entries ahead of their admission.
  StageReads(jobs);
  std::lock_guard<std::mutex> lock(mu_);
  queue_ = std::move(jobs);
  for (auto& [k, e] : entries_) e.queue_position = -1;
  // Eviction window: (C_mem + C_disk) / S_kv jobs (paper 3.3.2). Jobs behind it are
  // resolved too: the policy evicts the entry of the last queued job first (Fig. 9).
  uint64_t mean = MeanEntryBytesLocked();
  uint64_t cap = 0;
  for (const auto& t : tiers_) cap += t->capacity();
  size_t window = mean == 0 ? queue_.size() : std::min<uint64_t>(queue_.size(), cap / mean);
  hint_.window = static_cast<int>(window);
  for (size_t i = 0; i < queue_.size(); ++i) {
    const QueuedJob& j = queue_[i];
    int n = 0;
    EntryInfo* e = nullptr;
    if (j.key.empty()) {
      e = FindEntryLocked(j.tenant, j.session_id, *j.tokens, &n);
    } else if (auto it = entries_.find(j.key); it != entries_.end() && it->second.tenant == j.tenant) {
      e = &it->second;  // read by key (a linked chunk)
    }
    if (e != nullptr && e->queue_position < 0) e->queue_position = static_cast<int>(i);  // soonest job wins
  }
}

}  // namespace attic::store
