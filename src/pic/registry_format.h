// Internal: the context-cache record format the local registry's files and the shared
// registry's Redis values have in common (src/pic/registry.cc): ids, chunk ids, the JSON
// record of a cache. One format, so that a record reads the same wherever it was written.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "attic/core/status.h"
#include "attic/pic/registry.h"

namespace attic::pic::internal {

// "ctx-" + 12 hex of `stamp_ms` (unix ms, at most 2^48 - 1) + 12 hex of `random`'s low 48
// bits: ids sort in creation order (ContextCache::id).
std::string MakeCacheId(int64_t stamp_ms, uint64_t random);
// Whether `id` has the form MakeCacheId gives.
bool IsCacheIdText(std::string_view id);
// Sets each chunk's id ("<cache id>-c<index>") and store session from cache->id, bos and
// its tokens.
void AssignChunkIds(ContextCache* cache);
// The cache as its JSON record (format version 1); InvalidArgument when a string is not
// UTF-8.
StatusOr<std::string> CacheRecordText(const ContextCache& cache);
// Parses a record written by CacheRecordText whose id must be `id`: DataLoss for anything
// else, Unimplemented for a newer format version.
StatusOr<ContextCache> ParseCacheRecord(const std::string& text, const std::string& id);
// NotFound("context cache '<id>' not found"): one status for unknown, expired and
// another tenant's ids.
Status CacheNotFound(const std::string& id);

}  // namespace attic::pic::internal
