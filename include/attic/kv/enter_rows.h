// Entering stored KV into the compute buffer: pre-RoPE K rotated to each slot's position
// (DESIGN.md decision 1: RoPE is applied when KV enters the compute buffer, at whatever
// position it has now) and V copied, into a sequence's blocks. The one "RoPE and copy"
// every path uses: the store's loader (stored entries, queued saves) and
// Transformer::EnterKv (tests, truncation benchmark).
//
// Thread-safety: writes only the given slots' rows; calls for disjoint slots may run
// concurrently.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attic/attention/kv_q8.h"
#include "attic/attention/rope.h"
#include "attic/backend/convert.h"
#include "attic/kv/block_pool.h"

namespace attic::kv {

// Rows of IEEE half elements (an f16 entry): K widened to f32 (exact), rotated in f32,
// then stored in the pool's element type; V copied as it is into an f16 pool (widened
// into an f32 one). Into an f16 pool, V gets the bits the forward pass writes; K is
// f16(RoPE(f16(k))) where the forward writes f16(RoPE(k)): many elements differ, by
// up to one f16 unit of their head's largest element (the forward does not round K
// before RoPE).
template <class KRow, class VRow>
void EnterRotatedF16Rows(BlockPool& pool, const attention::RopeTable& rope, int layer, const int32_t* blocks,
                         int first, int n, const int32_t* positions, KRow k_row, VRow v_row) {
  const KvShape& shape = pool.shape();
  const int n_kv_heads = shape.n_kv_heads, hd = shape.head_dim, kvd = shape.kv_dim();
  const int64_t hs = shape.head_stride();
  thread_local std::vector<float> kin, krow;
  kin.resize(static_cast<size_t>(kvd));
  krow.resize(static_cast<size_t>(kvd));
  thread_local std::vector<float> vrow;
  for (int s = first; s < first + n; ++s) {
    backend::ConvertF16ToF32(k_row(s), kin.data(), kvd);
    const uint16_t* v = v_row(s);
    if (shape.dtype == DType::kQ8_0) {  // both rows in f32, then quantized as the forward pass writes them
      vrow.resize(static_cast<size_t>(kvd));
      backend::ConvertF16ToF32(v, vrow.data(), kvd);
      rope.ApplyToken(kin.data(), krow.data(), n_kv_heads, hd, positions[s]);
      pool.WriteRows(layer, blocks, s, 1, krow.data(), vrow.data());
    } else if (shape.dtype == DType::kF16) {
      rope.ApplyToken(kin.data(), krow.data(), n_kv_heads, hd, positions[s]);
      uint16_t* kd = reinterpret_cast<uint16_t*>(pool.k_slot_bytes(layer, blocks, s));
      uint16_t* vd = reinterpret_cast<uint16_t*>(pool.v_slot_bytes(layer, blocks, s));
      for (int h = 0; h < n_kv_heads; ++h) {
        backend::ConvertF32ToF16(krow.data() + h * hd, kd + h * hs, hd);
        std::memcpy(vd + h * hs, v + h * hd, static_cast<size_t>(hd) * sizeof(uint16_t));
      }
    } else {
      rope.ApplyToken(kin.data(), pool.k_slot_f32(layer, blocks, s), n_kv_heads, hs, positions[s]);
      float* vd = pool.v_slot_f32(layer, blocks, s);
      for (int h = 0; h < n_kv_heads; ++h) backend::ConvertF16ToF32(v + h * hd, vd + h * hs, hd);
    }
  }
}

// One token's pre-RoPE K and V -- n_heads heads of head_dim f32 elements each, contiguous
// (a kv_dim row, or the part of it from some head on) -- into rows of `dtype` whose heads
// lie dst_head_stride elements apart: K rotated to `position` in f32, then stored (and V
// converted) in dtype. The per-token step of EnterRotatedRows, for destinations that are
// not slots of a block table too (a staging buffer, one head's part of a block:
// pq/offload.h). q8_0: each head's row quantized as the compute buffer's writes are
// (attention::QuantizeKvRowQ8), its values at k_dst / v_dst (int8; heads dst_head_stride
// bytes apart) and its f16 scales at k_scales / v_scales (heads scale_head_stride scales
// apart), which only q8_0 uses.
inline void EnterRotatedHeads(DType dtype, const attention::RopeTable& rope, const float* k, const float* v,
                              int n_heads, int head_dim, int32_t position, void* k_dst, void* v_dst,
                              int64_t dst_head_stride, uint16_t* k_scales = nullptr, uint16_t* v_scales = nullptr,
                              int64_t scale_head_stride = 0) {
  ATTIC_CHECK(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kQ8_0);
  const size_t row_bytes = static_cast<size_t>(head_dim) * sizeof(float);
  if (dtype == DType::kF32) {
    // K rotated straight into place, V copied head by head.
    float* vd = static_cast<float*>(v_dst);
    rope.ApplyToken(k, static_cast<float*>(k_dst), n_heads, dst_head_stride, position);
    for (int h = 0; h < n_heads; ++h) std::memcpy(vd + h * dst_head_stride, v + h * head_dim, row_bytes);
    return;
  }
  // f16 and q8_0: K rotated into a row buffer (one token: stays in L1), then both stored.
  thread_local std::vector<float> krow;
  krow.resize(static_cast<size_t>(n_heads) * head_dim);
  rope.ApplyToken(k, krow.data(), n_heads, head_dim, position);
  if (dtype == DType::kQ8_0) {
    ATTIC_CHECK(k_scales != nullptr && v_scales != nullptr);
    int8_t* kd = static_cast<int8_t*>(k_dst);
    int8_t* vd = static_cast<int8_t*>(v_dst);
    for (int h = 0; h < n_heads; ++h) {
      attention::QuantizeKvRowQ8(krow.data() + h * head_dim, head_dim, kd + h * dst_head_stride,
                                 k_scales + h * scale_head_stride);
      attention::QuantizeKvRowQ8(v + h * head_dim, head_dim, vd + h * dst_head_stride,
                                 v_scales + h * scale_head_stride);
    }
    return;
  }
  uint16_t* kd = static_cast<uint16_t*>(k_dst);
  uint16_t* vd = static_cast<uint16_t*>(v_dst);
  for (int h = 0; h < n_heads; ++h) {
    backend::ConvertF32ToF16(krow.data() + h * head_dim, kd + h * dst_head_stride, head_dim);
    backend::ConvertF32ToF16(v + h * head_dim, vd + h * dst_head_stride, head_dim);
  }
}

// Slots [first, first + n) of the sequence whose block table is `blocks`, at `layer`:
// slot s takes K_row(s) rotated to positions[s] and V_row(s) (each kv_dim pre-RoPE
// elements). K_row / V_row: callables int slot -> const float* (an f32 entry, or rows
// computed in f32), or -> const uint16_t* (an f16 entry: EnterRotatedF16Rows).
template <class KRow, class VRow>
void EnterRotatedRows(BlockPool& pool, const attention::RopeTable& rope, int layer, const int32_t* blocks, int first,
                      int n, const int32_t* positions, KRow k_row, VRow v_row) {
  using Elem = std::remove_cv_t<std::remove_pointer_t<decltype(k_row(first))>>;
  if constexpr (std::is_same_v<Elem, uint16_t>) {
    EnterRotatedF16Rows(pool, rope, layer, blocks, first, n, positions, k_row, v_row);
    return;
  } else {
    const KvShape& shape = pool.shape();
    const bool q8 = shape.dtype == DType::kQ8_0;
    const int64_t scale_head_stride = q8 ? shape.head_stride() / shape.q8_group() : 0;
    for (int s = first; s < first + n; ++s) {
      EnterRotatedHeads(shape.dtype, rope, k_row(s), v_row(s), shape.n_kv_heads, shape.head_dim, positions[s],
                        pool.k_slot_bytes(layer, blocks, s), pool.v_slot_bytes(layer, blocks, s), shape.head_stride(),
                        q8 ? pool.k_slot_q8_scales(layer, blocks, s) : nullptr,
                        q8 ? pool.v_slot_q8_scales(layer, blocks, s) : nullptr, scale_head_stride);
    }
  }
}

}  // namespace attic::kv
