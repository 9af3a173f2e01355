// AVX2 + F16C kernels for random_fill.h (this file is built with -mavx2 -mfma -mf16c;
// callers check the CPU first). Results equal the scalar versions bit for bit.
#include <immintrin.h>

#include "model/random_fill.h"

namespace attic::model::internal {

namespace {

inline __m256i Fmix32x8(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85ebca6bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xc2b2ae35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

// 8 floats -> 8 uint16 in order (packus works per 128-bit lane; fix the lane order).
inline __m128i Pack32To16(__m256i v) {
  __m256i p = _mm256_packus_epi32(v, v);
  p = _mm256_permute4x64_epi64(p, 0x08);  // lanes 0 and 2
  return _mm256_castsi256_si128(p);
}

}  // namespace

void FillNormalAvx2(uint64_t key, uint64_t first, int64_t n, float stddev, float* out) {
  const __m256i k0 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(key)));
  const __m256i k1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(key >> 32)));
  const __m256i lane = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i low16 = _mm256_set1_epi32(0xffff);
  const __m256i mean = _mm256_set1_epi32(131070);
  const __m256 scale = _mm256_set1_ps(NormalScale(stddev));
  const uint32_t base = static_cast<uint32_t>(first) * 2u;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i c = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base + 2u * static_cast<uint32_t>(i))), lane);
    __m256i a = Fmix32x8(_mm256_xor_si256(c, k0));
    __m256i b = Fmix32x8(_mm256_xor_si256(_mm256_add_epi32(c, one), k1));
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_and_si256(a, low16), _mm256_srli_epi32(a, 16)),
                                 _mm256_add_epi32(_mm256_and_si256(b, low16), _mm256_srli_epi32(b, 16)));
    __m256 f = _mm256_cvtepi32_ps(_mm256_sub_epi32(s, mean));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(f, scale));
  }
  if (i < n) FillNormalScalar(key, first + static_cast<uint64_t>(i), n - i, stddev, out + i);
}

void F32ToBf16Avx2(const float* src, uint16_t* dst, size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, odd)), 16);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
    __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), Pack32To16(r));
  }
  if (i < n) ConvertFromF32(DType::kBF16, src + i, dst + i, n - i);
}

void F32ToF16Avx2(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(src + i);
    // F16C keeps NaN payload bits where the scalar path writes 0x7e00: leave NaNs to it.
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      ConvertFromF32(DType::kF16, src + i, dst + i, 8);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) ConvertFromF32(DType::kF16, src + i, dst + i, n - i);
}

}  // namespace attic::model::internal
