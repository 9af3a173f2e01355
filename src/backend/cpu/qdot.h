// Internal: GEMV on GGUF block-quantized weights (q4_0 ... iq4_xs, not q8_0, which has
// its own f32 kernels) by integer dot products, without widening the weights to f32.
//
// x is quantized once per Linear call (QuantizeX): each row in blocks of 32, an f32
// scale dx = max|x| / 127 and int8 codes xq = round(x / dx), plus the sum of the codes
// of every 16 elements. Each weight block is decoded (DecodeBlock) into int8 codes q and,
// per 16 elements g, a scale sc_g and an offset mn_g with w = sc_g * q + mn_g (the
// format's own arithmetic: quants.h). A row's dot product is then
//   sum over 32-blocks b of dx_b * sum over its two groups g of
//       (sc_g * sum_{i in g} q_i * xq_i  +  mn_g * sum_{i in g} xq_i)
// with the inner sums in int32. The only error beyond f32 rounding is x's quantization:
// |x_i - dx * xq_i| <= dx / 2 = max|x of the block| / 254.
#pragma once

#include <cstdint>

#include "attic/tensor/weight_tensor.h"
#include "attic/tensor/buffer.h"

namespace attic::backend::cpu {

// Whether the block-quantized GEMV serves this dtype.
inline bool UsesQuantDot(DType t) { return DTypeIsBlock(t) && t != DType::kQ8_0; }

// Bytes of one quantized x row of k elements (k % 32 == 0): xq[k] int8, then dx[k/32]
// f32, then s[k/16] int32 (sums of xq per 16).
inline int64_t QuantXRowBytes(int64_t k) { return k + 4 * (k / 32) + 4 * (k / 16); }
// Quantizes m rows of x (row stride k) into scratch; returns it as the GEMV's prepared x.
const float* QuantizeX(const float* x, int64_t m, int64_t k, AlignedBuffer* scratch);

// One decoded weight block: DTypeBlockSize(t) codes and per 16 elements sc, mn.
struct DecodedBlock {
  alignas(64) int8_t q[256];
  float sc[16];
  float mn[16];
};
void DecodeBlock(DType t, const uint8_t* blk, DecodedBlock* out);

// The kernels: portable (qdot.cc), AVX2 (qdot_avx2.cc), AVX512-VNNI (qdot_vnni.cc; the
// AVX-512 table takes it when the CPU has VNNI, else the AVX2 one).
namespace generic {
void GemvQuant(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
               int64_t n1);
}
namespace avx2 {
void GemvQuant(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
               int64_t n1);
}
namespace vnni {
void GemvQuant(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
               int64_t n1);
}

}  // namespace attic::backend::cpu
