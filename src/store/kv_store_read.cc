// KvStore::Fetch: the store side of layer-wise pre-loading (paper 001 section 3.2). The
// entry's bytes are handed out shared (a DRAM-tier value is not copied), verified layer
// by layer, and read from SSD outside the store's lock so lookups and saves go on.
#include <cstdio>

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
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotFoundError("no KV entry " + key);
    if (Expired(it->second)) {
      RemoveLocked(key);
      ++stats_.expired;
      return NotFoundError("KV entry " + key + " expired");
    }
    level = it->second.tier;
    tier = TierFor(level);
    it->second.access_seq = ++seq_;
  }
  auto bytes = tier->GetShared(key);
  Status bad = bytes.ok() ? OkStatus() : bytes.status();
  Fetched f;
  if (bad.ok()) {
    auto h = ParseEntryHeader(**bytes);
    if (!h.ok()) {
      bad = h.status();
    } else if (h->meta.fingerprint != options_.fingerprint) {
      bad = FailedPreconditionError("KV entry belongs to another model");
    } else if (h->meta.key().ToString() != key) {
      bad = DataLossError("misnamed KV entry");
    } else {
      for (int l = 0; l < h->meta.n_layers && bad.ok(); ++l) bad = VerifyEntryLayer(**bytes, *h, l);
    }
    if (bad.ok()) f.header = std::move(*h);
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (!bad.ok() && !bytes.ok()) {
    if (it == entries_.end()) return NotFoundError("KV entry " + key + " was erased");
    if (it->second.tier != level) return UnavailableError("KV entry " + key + " moved");
  }
  if (!bad.ok()) {
    std::fprintf(stderr, "attic: KV store: dropping unreadable entry %s (%s)\n", key.c_str(), bad.ToString().c_str());
    if (it != entries_.end()) RemoveLocked(key);
    ++stats_.corrupt;
    return NotFoundError("KV entry " + key + " unreadable");
  }
  f.key = key;
  f.bytes = std::move(*bytes);
  f.from = level;
  stats_.bytes_loaded += f.bytes->size();
  if (it != entries_.end() && it->second.tier == TierLevel::kSsd && level == TierLevel::kSsd &&
      f.bytes->size() <= dram_->capacity()) {
    PromoteLocked(key, f.bytes);  // the paper fetches whole sessions SSD -> DRAM; a failure leaves it on SSD
  }
  return f;
}

}  // namespace attic::store

namespace attic::store {

std::optional<StoreMatch> KvStore::Peek(const std::string& tenant, const std::string& session_id,
                                        const std::vector<int32_t>& tokens, uint64_t* bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto m = FindLocked(tenant, session_id, tokens);
  if (m && bytes != nullptr) *bytes = entries_.at(m->key).bytes;
  return m;
}

}  // namespace attic::store
