#include "attic/tensor/dtype.h"

namespace attic {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kQ8_0: return "q8_0";
  }
  return "?";
}

StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "f32" || name == "float32" || name == "F32" || name == "fp32") return DType::kF32;
  if (name == "f16" || name == "float16" || name == "F16" || name == "fp16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return DType::kBF16;
  if (name == "q8_0" || name == "Q8_0") return DType::kQ8_0;
  return InvalidArgumentError("unknown dtype '" + name + "' (expected f32, f16, bf16 or q8_0)");
}

size_t DTypeBytes(DType t, size_t n) {
  switch (t) {
    case DType::kF32: return 4 * n;
    case DType::kF16:
    case DType::kBF16: return 2 * n;
    case DType::kQ8_0: return n / 32 * 34;
  }
  return 0;
}

uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absu < 0x38800000u) {  // subnormal or zero in f16
    if (absu < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t exp = absu >> 23;
    uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 113 - exp + 13
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u);  // round to nearest even at bit 13
  r -= 0x38000000u;                                  // rebias 127 -> 15
  return static_cast<uint16_t>(sign | (r >> 13));
}

void ConvertToF32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kQ8_0: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (size_t b = 0; b < n / 32; ++b) {
        uint16_t d16;
        std::memcpy(&d16, s + b * 34, 2);
        float d = F16ToF32(d16);
        const int8_t* q = reinterpret_cast<const int8_t*>(s + b * 34 + 2);
        for (int i = 0; i < 32; ++i) dst[b * 32 + i] = d * static_cast<float>(q[i]);
      }
      return;
    }
  }
}

void ConvertFromF32(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kQ8_0:
      ATTIC_CHECK(false && "ConvertFromF32 to q8_0 is not supported");
  }
}

}  // namespace attic
