// Offloading a sparse sequence's KV below the compute buffer (paper 004, sections 3.3-3.4):
// only the sequence's first block (the initial slots), its local window and a block cache
// stay in the compute buffer; every complete 128-slot block is written, pre-RoPE and in
// a store type (OffloadOptions::tier_dtype: f32 by default, the server's store type --
// q8_0 ~0.27x f32's bytes, kivi4 ~0.14x), to a slower tier (a store::Tier: the DRAM
// tier's class by default) and released
// (kv::SequenceKv::ReleaseBlock). Each decode step the selector (pq or streaming) chooses
// per KV head as it does with everything resident; the chosen slots are then staged into a
// small buffer that attention reads instead (kv::Visibility::view):
//   resident slots (first block, local window)   copied from the compute buffer;
//   slots in a block the cache holds             copied from the cache's copy;
//   any other slot                               fetched from the tier, decoded, RoPE
//                                                applied on entry (DESIGN.md decision 1).
// The cache is PQCache's (pq/block_cache.h), one per layer and KV head, holding its
// blocks' rows (RoPE applied) in blocks of the compute buffer's pool: each step the
// blocks with most selected slots enter it (LRU or LFU victims), fetched whole.
//
// Steps that need every slot -- a prefill chunk (its rows attend in full), the first
// sparse step of a layer for pq (its codebooks are trained on every key), a step below
// min_slots -- stage the whole layer (one layer's KV: 1/n_layers of the sequence's) from
// the compute buffer and the tier. With an f32 tier, attention's result is the one it
// gives with everything resident (same slots, same order; tests/pq/offload_test.cc);
// with another type, an offloaded row enters as the store's entries of that type do
// (its pre-RoPE K and V rounded by the type, each value within the type's step of the
// computed one), the selection unchanged where it reads no offloaded key (pq's codes
// and streaming's positions do not).
//
// What counts toward the compute buffer: the resident blocks, the cache's blocks, and the
// staging buffer (OffloadStats::buffer_bytes).
//
// REQUIRES: the steps through the hooks append (prefill chunks, decode rows); the
// sequence's pool holds cache_blocks free blocks when the cache fills.
// Thread-safety: as SparseAttention (one sequence, one step at a time).
#pragma once

#include <cstdint>
#include <memory>

#include "attic/attention/rope.h"
#include "attic/core/status.h"
#include "attic/kv/block_pool.h"
#include "attic/pq/block_cache.h"
#include "attic/pq/sparse.h"
#include "attic/store/entry.h"
#include "attic/store/tier.h"

namespace attic::pq {

struct OffloadOptions {
  int cache_blocks = kDefaultOffloadCacheBlocks;  // block cache capacity per layer and KV head, in pool blocks
  CachePolicy policy = CachePolicy::kLru;   // its victims
  int update_blocks = -1;                   // blocks a step may insert (-1: cache_blocks); BlockCache's
  // The type of the blocks in the tier (store/entry.h's types and rows; kivi4: K per
  // channel with one group per block, V in q4_0): the server's --kv-store-dtype. f32
  // enters exactly what the forward computed.
  store::KvDtype tier_dtype = store::KvDtype::kF32;
};

struct OffloadStats {
  int64_t offloaded_blocks = 0;   // blocks written to the tier and released from the compute buffer
  int64_t backing_bytes = 0;      // bytes the tier holds for the sequence
  int64_t backing_errors = 0;     // failed writes (the block stays resident) and reads (the slot is
                                  // left out of that step's attention), each logged
  // Selected slots of released blocks, per layer and KV head, over sparse steps: found
  // in the cache at the step's start, or not (BlockCacheStats' token hits and misses).
  int64_t cache_hits = 0;
  int64_t cache_misses = 0;
  int64_t resident_reads = 0;     // selected slots that were resident (first block, local window)
  int64_t fetched_bytes = 0;      // read from the tier: cache fills, single slots, whole-layer staging
  double fetch_seconds = 0;       // reading the tier and rotating what it returned
  double stage_seconds = 0;       // staging per step (fetches included)
  int64_t full_stagings = 0;      // layer passes that staged every slot
  // Compute-buffer bytes of the sequence now and at most: resident blocks + cache blocks
  // + staging buffer (the whole-layer staging buffer included while it is held).
  int64_t buffer_bytes = 0;
  int64_t peak_buffer_bytes = 0;
  double hit_rate() const {
    return cache_hits + cache_misses > 0 ? static_cast<double>(cache_hits) / (cache_hits + cache_misses) : 0.0;
  }
};

class OffloadedSparseAttention : public SparseAttention {
 public:
  virtual const OffloadStats& offload_stats() const = 0;
};

// The pool blocks an offloaded sequence of at most max_slots slots holds at once, its
// cache aside: before options.min_slots nothing leaves; from there on the first block,
// the local window and the block before it, and the block being written stay -- plus a
// prefill chunk of chunk_tokens before its complete blocks leave at the step's end. An
// upper bound (the scheduler admits by it), never more than every block.
int OffloadWorkingBlocks(const SparseOptions& options, int block_size, int max_slots, int chunk_tokens);

// Bytes the tier holds for an offloaded sequence of n_slots slots: per block, every
// layer's pre-RoPE K and V in `dtype` (the layout in offload.cc).
int64_t OffloadTierBytes(const kv::KvShape& shape, int n_slots, store::KvDtype dtype = store::KvDtype::kF32);

// Wraps `inner` (method pq or streaming: the selectors that read no offloaded key once
// their codebooks exist; InvalidArgument otherwise, and for a tier type the shape's rows
// cannot take) so that `seq`'s KV is offloaded to
// `backing` as it is computed. `rope` must be the model's (the one that rotated the
// compute buffer's K). `seq`, `rope` and `backing` must outlive the result; the sequence's
// keys in `backing` are erased when it is destroyed.
StatusOr<std::unique_ptr<OffloadedSparseAttention>> MakeOffloadedSparseAttention(
    std::unique_ptr<SparseAttention> inner, const OffloadOptions& options, kv::SequenceKv* seq,
    const attention::RopeTable& rope, store::Tier* backing, int n_layers, backend::ThreadPool& pool);

}  // namespace attic::pq
