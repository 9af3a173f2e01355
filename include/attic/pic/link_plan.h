// Planning a linked prompt against the KV store (paper 002, Epic): which of its chunks'
// stored KV can be read for the request and where it enters, what the waiting queue's
// linked requests ask the store to keep and fetch ahead, and how a truncated prompt's
// chunks follow the tokens they cover. These are linking's decisions; the KV connector's
// link planner (link_planner.h) calls them.
//
// Thread-safety: free functions; the store is the caller's (its own rules apply).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attic/kv/block_pool.h"
#include "attic/pic/link.h"
#include "attic/store/kv_loader.h"
#include "attic/store/kv_store.h"

namespace attic::pic {

// The linked chunks whose stored KV entered a plan, and from where.
struct LinkedLoad {
  std::vector<store::LoadSegment> segments;  // ascending slots: each chunk's rows that enter
  std::vector<LinkedChunk> present;          // those chunks (LinkRun's `present`)
};

// The chunks of `spec` that lie (at least partly) after the first `from` slots of
// `prompt` (a stored prefix holds those), each cut to its part after `from`, whose stored
// entry can be opened and fits: stored by `tenant` (a chunk is linked only into a request
// of the tenant that stored it), of `shape`'s layers and KV width, with the rows and the
// tokens the prompt has there. A chunk that is gone (evicted, expired, bad) or does not
// fit is left out: its tokens are computed.
LinkedLoad OpenLinkedChunks(store::KvStore& store, const LinkSpec& spec, const std::string& tenant,
                            const std::vector<int32_t>& prompt, int from, const kv::KvShape& shape);

// The slot after the last chunk of `spec` (0 when it has none): KV reused from elsewhere
// replaces the link only when it covers this far.
int LinkedEnd(const LinkSpec& spec);

// `spec` after truncation dropped prompt tokens [keep, keep + drop): a chunk's part before
// `keep` stays, its part after the drop moves down by `drop`; null when no chunk is left.
std::shared_ptr<const LinkSpec> TruncateLinkSpec(const LinkSpec& spec, int keep, int drop);

// Look-ahead hints for a waiting linked request of `tenant`: its chunks' entries by key
// (kept from eviction, promoted and fetched ahead like a session's history); none for
// method full (it uses nothing cached).
void AppendLinkedJobs(const LinkSpec& spec, const std::string& tenant, std::vector<store::QueuedJob>* jobs);

}  // namespace attic::pic
