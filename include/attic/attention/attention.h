// Attention over paged KV. One entry point serves the three uses Attic needs:
//  (a) causal prefill / decode: query i attends to slots [0, kv_end[i]);
//  (b) queries at arbitrary positions attending to an explicit KV set (partial
//      recompute when linking cached chunks): pass kv_end per query and/or `indices`;
//  (c) sparse decoding over a list of token indices (PQ top-k): pass `indices`, or
//      `head_indices` for a list per KV head.
// Slots are the sequence's KV entries in order; RoPE has already been applied to both q
// and the K stored in the compute buffer.
//
// Thread-safety: stateless; parallelises internally over the pool.
#pragma once

#include <cstdint>

#include "attic/backend/thread_pool.h"
#include "attic/tensor/dtype.h"

namespace attic::attention {

// One layer's KV of one sequence, in a paged pool.
// Layout of each block: K and V are separate arrays, each [n_kv_heads][block_size][head_dim]
// f32 (k_pool / v_pool) or f16 (k_f16 / v_f16: set these instead, and leave k_pool / v_pool
// null; the kernels widen the rows they read, so decode reads half the bytes), or q8_0
// (k_q8 / v_q8, below).
// Slot s lives in block block_table[s / block_size] at row s % block_size.
//
// q8_0 (attention/kv_q8.h): a block is block_stride bytes: the rows' int8 values
// [n_kv_heads][block_size][head_dim] at bytes [0, q8_scales), then their f16 scales
// [n_kv_heads][block_size][head_dim / KvQ8Group(head_dim)] at byte q8_scales. Element i
// of a row is scale[i / group] * q[i]. The kernels dequantize the rows they read, a chunk
// of slots at a time.
// q4_0 (attention/kv_q4.h) is laid out the same way with head_dim / 2 bytes of 4-bit
// codes per row: the codes [n_kv_heads][block_size][head_dim / 2] at bytes
// [0, q8_scales), then the f16 scales as q8_0's. The general tile kernels dequantize
// its rows; no few-row decode kernel reads it yet.
//
// K and V may have different types (a pool with K in q8_0 and V in f16, say): each has
// its own pointer, block stride and scale offset. Set exactly one of K's four
// pointers and one of V's. The few-row decode kernels read rows in place for one type;
// a view whose K and V types differ runs the general tile kernel, which widens each
// tensor's rows by its own type.
struct KvLayerView {
  const float* k_pool = nullptr;   // this layer's K storage; block b starts at k_pool + b * block_stride
  const float* v_pool = nullptr;   // ... V's, at v_pool + b * v_block_stride
  const uint16_t* k_f16 = nullptr;  // ... or f16 storage, same layout
  const uint16_t* v_f16 = nullptr;
  const int8_t* k_q8 = nullptr;     // ... or q8_0 storage (the block stride then counts bytes)
  const int8_t* v_q8 = nullptr;
  const uint8_t* k_q4 = nullptr;    // ... or q4_0 storage (bytes, as q8_0's)
  const uint8_t* v_q4 = nullptr;
  int64_t q8_scales = 0;           // K in q8_0 or q4_0: bytes from a block's start to its scales
  int64_t block_stride = 0;        // K: elements per block (= n_kv_heads * block_size * head_dim); q8_0, q4_0: bytes
  int64_t v_q8_scales = 0;         // the same two for V (equal to K's when the types are)
  int64_t v_block_stride = 0;
  int block_size = 0;
  const int32_t* block_table = nullptr;
  int n_slots = 0;                 // slots that hold valid KV
};

// Element type of a view's K / V storage (kF32, kF16, kQ8_0 or kQ4_0: whichever pointer is set).
inline DType KType(const KvLayerView& kv) {
  return kv.k_q8 != nullptr    ? DType::kQ8_0
         : kv.k_q4 != nullptr  ? DType::kQ4_0
         : kv.k_f16 != nullptr ? DType::kF16
                               : DType::kF32;
}
inline DType VType(const KvLayerView& kv) {
  return kv.v_q8 != nullptr    ? DType::kQ8_0
         : kv.v_q4 != nullptr  ? DType::kQ4_0
         : kv.v_f16 != nullptr ? DType::kF16
                               : DType::kF32;
}

// Whether rows of KV type t carry f16 scales after a block's values (q8_0, q4_0).
inline bool KvHasScales(DType t) { return t == DType::kQ8_0 || t == DType::kQ4_0; }
// Bytes of n values of KV type t: f32 4n, f16 2n, q8_0 n, q4_0 n / 2 (n even); the
// scales are not counted.
inline int64_t KvValueBytes(DType t, int64_t n) {
  return t == DType::kF16 ? 2 * n : t == DType::kQ8_0 ? n : t == DType::kQ4_0 ? n / 2 : 4 * n;
}

struct AttentionShape {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 0;  // usually 1/sqrt(head_dim)
};

// q:   [n_q, n_heads, head_dim]
// out: [n_q, n_heads, head_dim]
// kv_end[i]: query i sees slots < kv_end[i] (must be >= 1 and <= kv.n_slots).
// indices (optional, ascending, < n_slots): if non-null, only these slots are visible
//   (still limited by kv_end[i]). A query that then sees no slot gets a zero output row.
// out must not alias q. f32 accumulation with an online softmax; for a given pool size the
// result is bit-identical run to run (pool sizes may differ in the last bits: with few
// queries the slots are split across threads and merged).
// Performance: keep k_pool / v_pool 64-byte aligned (decode loads whole rows); larger
// block_size gives longer contiguous runs per KV head, which DRAM-bound decode prefers.
void Attend(backend::ThreadPool& pool, const AttentionShape& shape, const float* q, int n_q, const int32_t* kv_end,
            const int32_t* indices, int n_indices, const KvLayerView& kv, float* out);

// One sequence's part of a batched call: Attend's arguments.
struct AttendRequest {
  const float* q = nullptr;         // [n_q, n_heads, head_dim]
  int n_q = 0;
  const int32_t* kv_end = nullptr;  // [n_q]
  const int32_t* indices = nullptr;
  int n_indices = 0;
  KvLayerView kv;
  float* out = nullptr;             // [n_q, n_heads, head_dim]
  // Per-KV-head visibility (optional; not together with `indices`): KV head h, and the
  // query heads of its group, see only the slots head_indices[h][0 .. n_head_indices[h])
  // (ascending, < kv.n_slots; still limited by kv_end). The lists may differ in length
  // per head and may be empty (a head that sees nothing gets zero output rows). Both
  // arrays have n_kv_heads entries. PQCache's decode: each KV head attends to its own
  // top-k plus the initial and local windows. Same numerics as `indices` per head.
  const int32_t* const* head_indices = nullptr;
  const int32_t* n_head_indices = nullptr;
};

// How AttendBatch plans a request's work.
//   kFastest       a few-row kernel for decode-sized requests, and a request's slots split
//                  across threads by its own size and the pool size: a query's last bits
//                  depend on how many queries its request has (a row of a prefill chunk
//                  vs the same row alone), never on the other requests.
//   kRowInvariant  one kernel for every request and slots split at fixed 1024-slot
//                  boundaries: a query's result depends only on the query, its visible
//                  slots and their KV, whatever its request or the batch holds, and on no
//                  pool size (a deterministic server; decode attention runs the general
//                  tile kernel, slower than the few-row one).
enum class AttendMode { kFastest, kRowInvariant };

// Attend for several sequences (same shape) in one parallel pass: continuous batching's
// per-sequence decode steps are too small to keep the pool busy one call at a time.
// Each request gets exactly the result Attend gives it alone (in kFastest mode, how its
// slots are split across threads depends on the request and the pool size only).
void AttendBatch(backend::ThreadPool& pool, const AttentionShape& shape, const AttendRequest* requests,
                 int n_requests, AttendMode mode = AttendMode::kFastest);

}  // namespace attic::attention
