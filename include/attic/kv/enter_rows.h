// Entering stored KV into the compute buffer: pre-RoPE K rotated to each slot's position
// (DESIGN.md decision 1: RoPE is applied when KV enters the compute buffer, at whatever
// position it has now) and V copied, into a sequence's blocks. The one "RoPE and copy"
// every path uses: the store's loader (stored entries, queued saves) and
// Transformer::EnterKv (tests, truncation benchmark).
//
// Thread-safety: writes only the given slots' rows; calls for disjoint slots may run
// concurrently.
#pragma once

#include <cstring>
#include <vector>

#include "attic/attention/rope.h"
#include "attic/kv/block_pool.h"

namespace attic::kv {

// Slots [first, first + n) of the sequence whose block table is `blocks`, at `layer`:
// slot s takes K_row(s) rotated to positions[s] and V_row(s) (each kv_dim pre-RoPE
// floats). K_row / V_row: callables int slot -> const float*.
template <class KRow, class VRow>
void EnterRotatedRows(BlockPool& pool, const attention::RopeTable& rope, int layer, const int32_t* blocks, int first,
                      int n, const int32_t* positions, KRow k_row, VRow v_row) {
  const KvShape& shape = pool.shape();
  const int n_kv_heads = shape.n_kv_heads, hd = shape.head_dim;
  if (shape.dtype == DType::kF32) {
    // K rotated straight into its slot (heads head_stride apart), V copied head by head.
    const int64_t hs = shape.head_stride();
    for (int s = first; s < first + n; ++s) {
      rope.ApplyToken(k_row(s), pool.k_slot_f32(layer, blocks, s), n_kv_heads, hs, positions[s]);
      const float* v = v_row(s);
      float* vd = pool.v_slot_f32(layer, blocks, s);
      for (int h = 0; h < n_kv_heads; ++h) std::memcpy(vd + h * hs, v + h * hd, static_cast<size_t>(hd) * sizeof(float));
    }
    return;
  }
  // Other element types: K rotated into a row buffer (one token: stays in L1), then
  // converted and stored with V.
  thread_local std::vector<float> krow;
  krow.resize(static_cast<size_t>(shape.kv_dim()));
  for (int s = first; s < first + n; ++s) {
    rope.ApplyToken(k_row(s), krow.data(), n_kv_heads, hd, positions[s]);
    pool.WriteRows(layer, blocks, s, 1, krow.data(), v_row(s));
  }
}

}  // namespace attic::kv
