// KV rows in q4_0: 4-bit codes with one f16 scale per group of (up to) 32 values of a
// row, with llama.cpp's block_q4_0 arithmetic: d = m / -8 where m is the group's value of
// largest magnitude (its sign kept), stored as f16; code c = min(15, trunc(x / d + 8.5))
// with x / d computed as x * (1 / d); a value reads back as (c - 8) * d. Zero is exact,
// the largest-magnitude value maps to code 0 exactly, and values of the other sign near
// the same magnitude are capped at code 15 (7 * d).
//
// Groups follow q8_0's rule (kv_q8.h, KvQ8Group): 32 values, or the whole row when
// head_dim < 32 (then head_dim must be even). In a group of g values, byte j holds value
// j in its low nibble and value j + g / 2 in its high one (llama.cpp's order for g = 32,
// so a row of head_dim >= 32 is head_dim / 32 block_q4_0's codes with their scales kept
// apart). In the compute buffer a row's head_dim / 2 bytes of codes stay contiguous, row
// after row, and the scales follow the block's codes, as q8_0's do (attention.h,
// KvLayerView).
//
// Error: |x - read(x)| <= |d'| (1 + 2^-7) for every value, with d' the stored scale (half
// a step from rounding, up to a whole step for a value capped at code 15, and the f16
// rounding of d over at most 8 steps), the bound the tests derive tolerances from. A
// group of zeros has scale 0.
//
// Thread-safety: stateless functions.
#pragma once

#include <cstdint>

#include "attic/attention/kv_q8.h"

namespace attic::attention {

// Values per scale in a row of head_dim values (q8_0's groups).
constexpr int KvQ4Group(int head_dim) { return KvQ8Group(head_dim); }
// Whether rows of head_dim values can be stored in q4_0.
constexpr bool KvQ4Supports(int head_dim) { return KvQ8Supports(head_dim) && KvQ4Group(head_dim) % 2 == 0; }

// Quantizes one row: q [head_dim / 2] bytes of codes, scales [head_dim /
// KvQ4Group(head_dim)] f16.
void QuantizeKvRowQ4(const float* x, int head_dim, uint8_t* q, uint16_t* scales);
// y [head_dim] = the row's values (exact: a small integer times an f16 scale is an f32).
// `scales` is read byte-wise (it needs no alignment).
void DequantizeKvRowQ4(const uint8_t* q, const void* scales, int head_dim, float* y);

}  // namespace attic::attention
