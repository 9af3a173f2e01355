#include "model/random_fill.h"

#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attic/tensor/quants.h"

namespace attic::model {

namespace {

bool HaveAvx2() {
  // F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" for
  // __builtin_cpu_supports, and the sanitizer builds use clang.
  static const bool kHave = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && f16c;
  }();
  return kHave;
}

}  // namespace

namespace internal {

void FillNormalScalar(uint64_t key, uint64_t first, int64_t n, float stddev, float* out) {
  const uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  const uint32_t base = static_cast<uint32_t>(first) * 2u;
  const float scale = NormalScale(stddev);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t c = base + 2u * static_cast<uint32_t>(i);
    const uint32_t a = Fmix32(c ^ k0), b = Fmix32((c + 1u) ^ k1);
    const uint32_t s = (a & 0xffffu) + (a >> 16) + (b & 0xffffu) + (b >> 16);
    out[i] = static_cast<float>(static_cast<int32_t>(s) - 131070) * scale;
  }
}

}  // namespace internal

void FillNormal(uint64_t key, uint64_t first, int64_t n, float stddev, float* out) {
  if (HaveAvx2()) {
    internal::FillNormalAvx2(key, first, n, stddev, out);
  } else {
    internal::FillNormalScalar(key, first, n, stddev, out);
  }
}

void QuantizeQ8_0(const float* src, void* dst, size_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (size_t b = 0; b < n / 32; ++b, out += 34) {
    const float* x = src + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t d16 = F32ToF16(d);
    std::memcpy(out, &d16, 2);
    for (int j = 0; j < 32; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
  }
}

void ConvertForStorage(DType t, const float* src, void* dst, size_t n) {
  if (DTypeIsBlock(t)) {
    QuantizeBlocks(t, src, dst, n);
  } else if (HaveAvx2() && t == DType::kBF16) {
    internal::F32ToBf16Avx2(src, static_cast<uint16_t*>(dst), n);
  } else if (HaveAvx2() && t == DType::kF16) {
    internal::F32ToF16Avx2(src, static_cast<uint16_t*>(dst), n);
  } else {
    ConvertFromF32(t, src, dst, n);
  }
}

}  // namespace attic::model
