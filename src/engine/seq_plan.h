// SeqPlan (internal to the scheduler): where a sequence's KV comes from before its
// first forward step -- DESIGN.md's "plan per layer (reuse / load / link / recompute)".
// It says which slots take cached KV, from where (a finished sequence still in the
// compute buffer, or stored KV: an entry or a save still queued), the position each
// cached slot takes, and which slots the forward computes. Prefix reuse and
// CachedAttention's decoupled truncation produce one today; linking cached chunks
// (Epic) will produce one with several sources and recomputed boundary slots.
//
// Thread-safety: value types and pure functions.
#pragma once

#include <memory>
#include <vector>

#include "attic/kv/block_pool.h"
#include "attic/pic/link.h"
#include "attic/store/kv_loader.h"

namespace attic::engine {

// How a truncated prompt maps onto the session's stored entry (paper 001 section 3.4).
// The stored entry E holds original tokens [0, keep) + [o, o+m); the prompt after
// truncation is original [0, keep) + [o+skip, n). `store_view` is the prompt as E saw
// it: original [0, keep) + [o, n) (what to look E up with; shared with look-ahead
// hints).
struct Truncation {
  bool active = false;
  int keep = 0;
  int skip = 0;
  std::shared_ptr<const std::vector<int32_t>> store_view;
};

struct SeqPlan {
  // Compute-buffer reuse: slots [0, n_cached) are those of `from_seq` (a finished
  // sequence kept resident), adopted with its blocks (`adopt`) or copied.
  const kv::SequenceKv* from_seq = nullptr;
  bool adopt = false;
  // Stored KV: `segments` enter slots [0, n_cached) in slot order, each slot s at
  // positions[s] (RoPE applied as it enters), holding tokens[s].
  std::vector<store::LoadSegment> segments;
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  // Slots [0, n_cached) exist when the sequence starts; the forward computes the
  // prompt's slots after them.
  int n_cached = 0;
  // Linking: the linked chunks entered (after link_from; pic::LinkRun derives the slots
  // the forward computes in place from them), and of the n_cached slots, how many came
  // from linked chunks.
  std::vector<pic::LinkedChunk> linked;
  int n_linked = 0;
  int link_from = 0;  // the linked part starts here (after a stored prefix)

  bool empty() const { return n_cached == 0; }
};

// The first n rows of a stored source, at the positions they were computed at.
SeqPlan PlanStoredPrefix(std::shared_ptr<const store::KvSource> source, int n);
// A truncated prompt over its session's stored entry `source`, whose first `common`
// tokens match t.store_view: entry rows [0, keep) and [keep + skip, common) re-enter at
// positions 0, 1, ... (K is pre-RoPE, so re-embedding is exact per token; the KV itself
// was computed with the dropped tokens in context -- the paper's approximation), at most
// `cap` of them. `prompt`: the truncated prompt (the slots' tokens).
SeqPlan PlanTruncated(const Truncation& t, std::shared_ptr<const store::KvSource> source, int common, int cap,
                      const std::vector<int32_t>& prompt);

}  // namespace attic::engine
