// KV rows in q8_0: 8-bit values with one f16 scale per group of (up to) 32 values of a
// row, as llama.cpp's q8_0 (block_q8_0: d = max|x| / 127 stored as f16, q = round(x / d)).
//
// A row is one KV head's head_dim values of one slot. Its groups are 32 values long, or
// the whole row when head_dim < 32 (stories260K, head_dim 8: one scale per 8 values);
// head_dim must be below 32 or a multiple of 32 (KvQ8Supports). In the compute buffer the
// int8 values of a block's rows stay contiguous, row after row as f32 / f16 rows do, and
// the scales follow them (attention.h, KvLayerView): rows are then addressed like the
// other types' rows, and a 64-value row is one cache line.
//
// Rounding: q = round(x / d') (halves away from zero) with d' the stored (f16) scale, clamped to
// [-127, 127], so |x - d' q| <= d' / 2 for every value (up to f32 rounding of x / d'),
// the bound the attention tests derive their tolerances from. A group of zeros has scale 0.
//
// Thread-safety: stateless functions.
#pragma once

#include <cstdint>

namespace attic::attention {

// Values per scale in a row of head_dim values.
constexpr int KvQ8Group(int head_dim) { return head_dim < 32 ? head_dim : 32; }
// Whether rows of head_dim values can be stored in q8_0.
constexpr bool KvQ8Supports(int head_dim) { return head_dim > 0 && head_dim % KvQ8Group(head_dim) == 0; }
// In a q8_0 block (int8 values, then their f16 scales from byte `scales_at` of the
// block): the byte offset from the block's start of the first scale of the row whose
// values start `value_at` bytes into the block.
constexpr int64_t KvQ8ScaleAt(int64_t scales_at, int64_t value_at, int head_dim) {
  return scales_at + value_at / KvQ8Group(head_dim) * static_cast<int64_t>(sizeof(uint16_t));
}

// Quantizes one row: q [head_dim] int8, scales [head_dim / KvQ8Group(head_dim)] f16.
void QuantizeKvRowQ8(const float* x, int head_dim, int8_t* q, uint16_t* scales);
// y [head_dim] = the row's values (exact: an int8 times an f16 scale is an f32 without rounding).
void DequantizeKvRowQ8(const int8_t* q, const uint16_t* scales, int head_dim, float* y);
// y [n] = q [n] in groups of `group` values (n a multiple of group), each times its f16
// scale: scales holds n / group of them, read byte-wise (they need no alignment). What
// every q8_0 reader widens with: the compute buffer's rows (DequantizeKvRowQ8) and the
// store's q8_0 entry rows (store::DequantizeRowQ8, kv_dim values a row). Vectorised with
// AVX2 + F16C when the active ISA has them and group % 8 == 0; the same bits either way.
void DequantizeQ8(const int8_t* q, const void* scales, int n, int group, float* y);

}  // namespace attic::attention
