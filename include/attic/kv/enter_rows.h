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

#include "attic/attention/kv_q4.h"
#include "attic/attention/kv_q8.h"
#include "attic/attention/rope.h"
#include "attic/backend/convert.h"
#include "attic/kv/block_pool.h"

namespace attic::kv {

// n_heads contiguous f32 rows of head_dim elements into rows of `dtype` whose heads lie
// dst_head_stride elements apart (q8_0: bytes, with each row's f16 scales at `scales`,
// heads scale_head_stride scales apart: quantized as the compute buffer's writes are,
// attention::QuantizeKvRowQ8; q4_0 likewise, its heads dst_head_stride / 2 bytes apart,
// attention::QuantizeKvRowQ4).
inline void StoreHeads(DType dtype, const float* src, int n_heads, int head_dim, void* dst, int64_t dst_head_stride,
                       uint16_t* scales, int64_t scale_head_stride) {
  for (int h = 0; h < n_heads; ++h) {
    const float* row = src + static_cast<int64_t>(h) * head_dim;
    if (dtype == DType::kQ8_0) {
      attention::QuantizeKvRowQ8(row, head_dim, static_cast<int8_t*>(dst) + h * dst_head_stride,
                                 scales + h * scale_head_stride);
    } else if (dtype == DType::kQ4_0) {
      attention::QuantizeKvRowQ4(row, head_dim, static_cast<uint8_t*>(dst) + h * dst_head_stride / 2,
                                 scales + h * scale_head_stride);
    } else if (dtype == DType::kF16) {
      backend::ConvertF32ToF16(row, static_cast<uint16_t*>(dst) + h * dst_head_stride, head_dim);
    } else {
      std::memcpy(static_cast<float*>(dst) + h * dst_head_stride, row, static_cast<size_t>(head_dim) * sizeof(float));
    }
  }
}

// One token's pre-RoPE K and V -- n_heads heads of head_dim f32 elements each, contiguous
// (a kv_dim row, or the part of it from some head on) -- into rows of k_dtype / v_dtype
// whose heads lie dst_head_stride elements apart: K rotated to `position` in f32, then
// stored in k_dtype; V stored in v_dtype (StoreHeads). The per-token step of
// EnterRotatedRows, for destinations that are not slots of a block table too (a staging
// buffer, one head's part of a block: pq/offload.h). q8_0 / q4_0 rows' f16 scales go to
// k_scales / v_scales (heads scale_head_stride scales apart), which only they use.
inline void EnterRotatedHeads(DType k_dtype, DType v_dtype, const attention::RopeTable& rope, const float* k,
                              const float* v, int n_heads, int head_dim, int32_t position, void* k_dst, void* v_dst,
                              int64_t dst_head_stride, uint16_t* k_scales = nullptr, uint16_t* v_scales = nullptr,
                              int64_t scale_head_stride = 0) {
  for (DType t : {k_dtype, v_dtype}) {
    ATTIC_CHECK(t == DType::kF32 || t == DType::kF16 || t == DType::kQ8_0 || t == DType::kQ4_0);
  }
  ATTIC_CHECK((!attention::KvHasScales(k_dtype) || k_scales != nullptr) &&
              (!attention::KvHasScales(v_dtype) || v_scales != nullptr));
  if (k_dtype == DType::kF32) {
    // K rotated straight into place.
    rope.ApplyToken(k, static_cast<float*>(k_dst), n_heads, dst_head_stride, position);
  } else {
    // K rotated into a row buffer (one token: stays in L1), then stored.
    thread_local std::vector<float> krow;
    krow.resize(static_cast<size_t>(n_heads) * head_dim);
    rope.ApplyToken(k, krow.data(), n_heads, head_dim, position);
    StoreHeads(k_dtype, krow.data(), n_heads, head_dim, k_dst, dst_head_stride, k_scales, scale_head_stride);
  }
  StoreHeads(v_dtype, v, n_heads, head_dim, v_dst, dst_head_stride, v_scales, scale_head_stride);
}

// Rows of IEEE half elements (an f16 entry): K widened to f32 (exact), rotated in f32,
// then stored in the pool's K type; V copied as it is into an f16 V (widened into an
// f32 one, widened and quantized into q8_0). Into an f16 pool, V gets the bits the forward pass writes; K is
// f16(RoPE(f16(k))) where the forward writes f16(RoPE(k)): many elements differ, by
// up to one f16 unit of their head's largest element (the forward does not round K
// before RoPE).
template <class KRow, class VRow>
void EnterRotatedF16Rows(BlockPool& pool, const attention::RopeTable& rope, int layer, const int32_t* blocks,
                         int first, int n, const int32_t* positions, KRow k_row, VRow v_row) {
  const KvShape& shape = pool.shape();
  const int n_kv_heads = shape.n_kv_heads, hd = shape.head_dim, kvd = shape.kv_dim();
  const int64_t hs = shape.head_stride(), ss = shape.head_stride() / shape.q8_group();
  const bool kq8 = attention::KvHasScales(shape.k_dtype), vq8 = attention::KvHasScales(shape.v_dtype);
  thread_local std::vector<float> kin, krow, vrow;
  kin.resize(static_cast<size_t>(kvd));
  krow.resize(static_cast<size_t>(kvd));
  vrow.resize(static_cast<size_t>(kvd));
  for (int s = first; s < first + n; ++s) {
    backend::ConvertF16ToF32(k_row(s), kin.data(), kvd);
    if (shape.k_dtype == DType::kF32) {  // rotated straight into place
      rope.ApplyToken(kin.data(), pool.k_slot_f32(layer, blocks, s), n_kv_heads, hs, positions[s]);
    } else {
      rope.ApplyToken(kin.data(), krow.data(), n_kv_heads, hd, positions[s]);
      StoreHeads(shape.k_dtype, krow.data(), n_kv_heads, hd, pool.k_slot_bytes(layer, blocks, s), hs,
                 kq8 ? pool.k_slot_q8_scales(layer, blocks, s) : nullptr, ss);
    }
    const uint16_t* v = v_row(s);
    if (shape.v_dtype == DType::kF16) {  // the entry's bits as they are
      uint16_t* vd = reinterpret_cast<uint16_t*>(pool.v_slot_bytes(layer, blocks, s));
      for (int h = 0; h < n_kv_heads; ++h) {
        std::memcpy(vd + h * hs, v + h * hd, static_cast<size_t>(hd) * sizeof(uint16_t));
      }
    } else {  // widened (exact), then stored (q8_0, q4_0: quantized as the forward pass writes it)
      backend::ConvertF16ToF32(v, vrow.data(), kvd);
      StoreHeads(shape.v_dtype, vrow.data(), n_kv_heads, hd, pool.v_slot_bytes(layer, blocks, s), hs,
                 vq8 ? pool.v_slot_q8_scales(layer, blocks, s) : nullptr, ss);
    }
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
    const bool kq8 = attention::KvHasScales(shape.k_dtype), vq8 = attention::KvHasScales(shape.v_dtype);
    const int64_t scale_head_stride = shape.head_stride() / shape.q8_group();
    for (int s = first; s < first + n; ++s) {
      EnterRotatedHeads(shape.k_dtype, shape.v_dtype, rope, k_row(s), v_row(s), shape.n_kv_heads, shape.head_dim,
                        positions[s], pool.k_slot_bytes(layer, blocks, s), pool.v_slot_bytes(layer, blocks, s),
                        shape.head_stride(), kq8 ? pool.k_slot_q8_scales(layer, blocks, s) : nullptr,
                        vq8 ? pool.v_slot_q8_scales(layer, blocks, s) : nullptr, scale_head_stride);
    }
  }
}

}  // namespace attic::kv
