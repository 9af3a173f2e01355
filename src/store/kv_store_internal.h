// Internal helpers shared by the KvStore's source files (kv_store*.cc).
#pragma once

#include <chrono>
#include <string>
#include <utility>

#include "attic/store/entry.h"
#include "attic/store/eviction_policy.h"
#include "attic/store/tier.h"

namespace attic::store::internal {

// The sessions_ map's key of (tenant, session id).
inline std::string SessionKey(const std::string& tenant, const std::string& session_id) {
  return tenant + std::string(1, '\0') + session_id;
}

// The index record of entry `key` as read from tier `level`: its header's `meta`
// (whose tokens are moved out) and its size in bytes. Not yet sequenced (inserted_seq,
// access_seq): the caller does that under the store's lock.
inline EntryInfo ReadEntryInfo(const std::string& key, KvEntry& meta, uint64_t bytes, int level) {
  EntryInfo info;
  info.key = key;
  info.tenant = meta.tenant;
  info.session_id = meta.session_id;
  info.tokens = std::move(meta.tokens);
  info.bytes = bytes;
  info.tier = TierAt(level);
  info.expires_at_ms = meta.expires_at_ms;
  return info;
}

inline double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace attic::store::internal
