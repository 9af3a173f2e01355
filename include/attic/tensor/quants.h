// GGUF/ggml block formats of weights: layouts and dequantization, written from the format
// definitions (ggml-common.h's block structs and ggml-quants.c's dequantize_row_*).
// All fields little-endian; "half" is IEEE f16.
//
//   type    elems bytes layout
//   q4_0      32   18  half d; u8 qs[16]                  w = d * (q - 8),   q in 0..15
//   q4_1      32   20  half d, m; u8 qs[16]               w = d * q + m
//   q5_0      32   22  half d; u8 qh[4]; u8 qs[16]        w = d * (q - 16),  q in 0..31
//   q5_1      32   24  half d, m; u8 qh[4]; u8 qs[16]     w = d * q + m
//   q8_0      32   34  half d; i8 qs[32]                  w = d * q
//   iq4_nl    32   18  half d; u8 qs[16]                  w = d * kIq4nlValues[q]
//   q2_k     256   84  u8 scales[16]; u8 qs[64]; half d, dmin
//                      16 groups of 16: w = (d * (sc & 15)) * q - dmin * (sc >> 4), q in 0..3
//   q3_k     256  110  u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d
//                      16 groups of 16, 6-bit scales s: w = (d * (s - 32)) * (q - 4 * !hbit)
//   q4_k     256  144  half d, dmin; u8 scales[12]; u8 qs[128]
//                      8 groups of 32, 6-bit scale/min: w = (d * sc) * q - dmin * mn
//   q5_k     256  176  half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]   as q4_k, q in 0..31
//   q6_k     256  210  u8 ql[128]; u8 qh[64]; i8 scales[16]; half d
//                      16 groups of 16: w = (d * sc) * (q - 32), q in 0..63
//   iq4_xs   256  136  half d; u16 scales_h; u8 scales_l[4]; u8 qs[128]
//                      8 groups of 32, 6-bit scale ls: w = (d * (ls - 32)) * kIq4nlValues[q]
//
// In the 4-bit layouts of q4_0/q4_1/q5_0/q5_1/iq4_nl, element j < 16 of a block is the
// low nibble of qs[j] and element j + 16 its high nibble; the K-quants' orders are given
// by the functions below. Each dequantization does its float operations in the order
// written above (products rounded to f32 one at a time), so results are bit-exact
// against any implementation of the same definition.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attic/tensor/dtype.h"

namespace attic {

// The 16 non-linear levels of iq4_nl and iq4_xs.
extern const int8_t kIq4nlValues[16];

// Dequantizes n elements (whole blocks of `t`, a block type) from src to f32.
void DequantizeBlocks(DType t, const void* src, float* dst, size_t n);

// Whether QuantizeBlocks writes t: q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q6_k (the types
// of llama.cpp's Q4_0..Q8_0 and Q4_K_M presets).
bool CanQuantize(DType t);
// Quantizes n values (whole blocks) to t with llama.cpp's reference algorithms: absmax
// scales for the 32-blocks (q4_0/q5_0 signed by the largest magnitude), min/max for
// q4_1/q5_1, the weighted scale/min search for q4_k and the refined symmetric search
// for q6_k. REQUIRES: CanQuantize(t).
void QuantizeBlocks(DType t, const float* src, void* dst, size_t n);

// Q4_K / Q5_K: the 6-bit scale and min of group j (0..7) from the 12 packed scale bytes.
inline void KQuantScaleMin(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q3_K: the 16 6-bit scales (0..63, before the -32) from the 12 packed scale bytes.
void Q3KScales(const uint8_t* packed, uint8_t out[16]);

}  // namespace attic
