// Element types Attic stores and computes with, and scalar conversions between them.
// Vectorised conversions live in backend/cpu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "attic/core/status.h"

namespace attic {

enum class DType : uint8_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kQ8_0 = 3,  // GGUF block format: 32 int8 + one f16 scale per block (34 bytes)
  // The other GGUF block formats (layouts in attic/tensor/quants.h): weights only.
  kQ4_0 = 4,
  kQ4_1 = 5,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ2_K = 8,
  kQ3_K = 9,
  kQ4_K = 10,
  kQ5_K = 11,
  kQ6_K = 12,
  kIQ4_NL = 13,
  kIQ4_XS = 14,
};
constexpr int kNumDTypes = 15;

const char* DTypeName(DType t);  // "f32", "f16", "bf16", "q8_0", "q4_0", ..., "q4_k", ..., "iq4_xs"
// Accepts f32/float32, f16/float16, bf16/bfloat16 and the block types' names in either case.
StatusOr<DType> ParseDType(const std::string& name);
// Elements per block (1 for f32/f16/bf16; 32 for q4_0..q8_0 and iq4_nl; 256 for the
// K-quants and iq4_xs) and bytes per block.
int64_t DTypeBlockSize(DType t);
size_t DTypeBlockBytes(DType t);
inline bool DTypeIsBlock(DType t) { return DTypeBlockSize(t) > 1; }
// Bytes for `n` elements (n must be a multiple of DTypeBlockSize(t)).
size_t DTypeBytes(DType t, size_t n);

inline float Bf16ToF32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, with overflow to inf and gradual underflow.
uint16_t F32ToF16(float f);

// Scalar element conversion of a contiguous run to f32 (block types handle whole
// blocks: `n` must be a multiple of DTypeBlockSize and `src` block-aligned).
void ConvertToF32(DType t, const void* src, float* dst, size_t n);
// Converts f32 to f32/f16/bf16 (block types: attic/tensor/quants.h).
void ConvertFromF32(DType t, const float* src, void* dst, size_t n);

}  // namespace attic
