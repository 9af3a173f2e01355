#include "attic/tensor/dtype.h"

#include <cctype>

#include "attic/tensor/quants.h"

namespace attic {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_0: return "q4_0";
    case DType::kQ4_1: return "q4_1";
    case DType::kQ5_0: return "q5_0";
    case DType::kQ5_1: return "q5_1";
    case DType::kQ2_K: return "q2_k";
    case DType::kQ3_K: return "q3_k";
    case DType::kQ4_K: return "q4_k";
    case DType::kQ5_K: return "q5_k";
    case DType::kQ6_K: return "q6_k";
    case DType::kIQ4_NL: return "iq4_nl";
    case DType::kIQ4_XS: return "iq4_xs";
  }
  return "?";
}

int64_t DTypeBlockSize(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: return 1;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kIQ4_NL: return 32;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_XS: return 256;
  }
  return 1;
}

size_t DTypeBlockBytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kQ8_0: return 34;
    case DType::kQ4_0: return 18;
    case DType::kQ4_1: return 20;
    case DType::kQ5_0: return 22;
    case DType::kQ5_1: return 24;
    case DType::kIQ4_NL: return 18;
    case DType::kQ2_K: return 84;
    case DType::kQ3_K: return 110;
    case DType::kQ4_K: return 144;
    case DType::kQ5_K: return 176;
    case DType::kQ6_K: return 210;
    case DType::kIQ4_XS: return 136;
  }
  return 0;
}

StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "f32" || name == "float32" || name == "F32" || name == "fp32") return DType::kF32;
  if (name == "f16" || name == "float16" || name == "F16" || name == "fp16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return DType::kBF16;
  std::string lower = name;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (int i = static_cast<int>(DType::kQ8_0); i < kNumDTypes; ++i) {
    if (lower == DTypeName(static_cast<DType>(i))) return static_cast<DType>(i);
  }
  return InvalidArgumentError("unknown dtype '" + name +
                              "' (expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, "
                              "q6_k, iq4_nl or iq4_xs)");
}

size_t DTypeBytes(DType t, size_t n) { return n / static_cast<size_t>(DTypeBlockSize(t)) * DTypeBlockBytes(t); }

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
    default:
      DequantizeBlocks(t, src, dst, n);
      return;
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
    default:
      ATTIC_CHECK(false && "ConvertFromF32 to a block type is not supported");
  }
}

}  // namespace attic
