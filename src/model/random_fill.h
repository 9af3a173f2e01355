// Fast kernels for the checkpoint writers: a counter-based approximate-normal generator
// and f32 -> f16/bf16 conversion, with AVX2/F16C versions (random_fill_avx2.cc) chosen
// at run time. Vector and scalar paths give bit-identical results.
//
// Thread-safety: stateless.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attic/tensor/dtype.h"

namespace attic::model {

// out[i] ~ N(0, stddev) (Irwin-Hall: sum of four 16-bit uniforms from two murmur3
// finalisers), depending only on (key, first + i): any range of a stream can be made
// independently. The stream repeats after 2^31 elements.
void FillNormal(uint64_t key, uint64_t first, int64_t n, float stddev, float* out);

// Same results as ConvertFromF32 (f32, f16 or bf16), vectorised where the CPU allows;
// block types with QuantizeBlocks (attic/tensor/quants.h). REQUIRES for those: whole blocks.
void ConvertForStorage(DType t, const float* src, void* dst, size_t n);

// ggml's reference Q8_0 quantisation (quantize_row_q8_0_ref): per block of 32,
// d = max|x| / 127 stored as f16, q = roundf(x / d). REQUIRES: n % 32 == 0.
void QuantizeQ8_0(const float* src, void* dst, size_t n);

namespace internal {
// Scalar reference and AVX2 versions (the latter REQUIRE avx2 + f16c).
void FillNormalScalar(uint64_t key, uint64_t first, int64_t n, float stddev, float* out);
void FillNormalAvx2(uint64_t key, uint64_t first, int64_t n, float stddev, float* out);
void F32ToBf16Avx2(const float* src, uint16_t* dst, size_t n);
void F32ToF16Avx2(const float* src, uint16_t* dst, size_t n);

inline uint32_t Fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}
// stddev / sqrt((2^32 - 1) / 3): the standard deviation of the 4 x 16-bit sum.
inline float NormalScale(float stddev) { return stddev / 37837.2270f; }
}  // namespace internal

}  // namespace attic::model
