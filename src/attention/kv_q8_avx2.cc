// q8_0 values widened with AVX2 + F16C (kv_q8.h, DequantizeQ8): eight int8 values to f32
// at a time, times their group's scale. The same products as the scalar loop (an int8
// times an f16 scale is exact in f32), so the same bits. And the quantizer
// (QuantizeKvRowQ8), eight values at a time, with the scalar loop's bits.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "attention/kv_q8_internal.h"

namespace attic::attention::internal {

void DequantizeQ8Avx2(const int8_t* q, const void* scales, int n, int group, float* y) {
  const auto* s = static_cast<const uint8_t*>(scales);
  for (int j = 0; j * group < n; ++j) {
    uint16_t h;
    std::memcpy(&h, s + 2 * j, sizeof(h));
    const __m256 d = _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))));
    for (int i = j * group; i < (j + 1) * group; i += 8) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
      _mm256_storeu_ps(y + i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
    }
  }
}

void QuantizeQ8Avx2(const float* x, int n, int group, int8_t* q, uint16_t* scales) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 half = _mm256_set1_ps(0.5f), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  for (int g0 = 0, b = 0; g0 < n; g0 += group, ++b) {
    // max|x| over the group; a NaN is skipped, as std::max(amax, NaN) skips it.
    __m256 m = _mm256_setzero_ps();
    for (int i = g0; i < g0 + group; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float amax = _mm_cvtss_f32(m4);
    const uint16_t h = static_cast<uint16_t>(
        _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(std::min(amax / 127.0f, 65504.0f)), _MM_FROUND_TO_NEAREST_INT), 0));
    const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
    scales[b] = h;
    const __m256 dv = _mm256_set1_ps(d);
    for (int i = g0; i < g0 + group; i += 8) {
      __m256 r = _mm256_setzero_ps();
      if (d > 0) {
        const __m256 t = _mm256_div_ps(_mm256_loadu_ps(x + i), dv);
        // Half away from zero: truncate, then step away from zero when the dropped part
        // (exact: t minus its integer part) is at least a half.
        const __m256 whole = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 frac = _mm256_and_ps(_mm256_sub_ps(t, whole), abs_mask);
        const __m256 away = _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ),
                                          _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_andnot_ps(abs_mask, t)));
        r = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(whole, away), lo), hi);
      }
      const __m256i r32 = _mm256_cvtps_epi32(r);  // integers already: exact
      const __m128i r16 = _mm_packs_epi32(_mm256_castsi256_si128(r32), _mm256_extracti128_si256(r32, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(r16, r16));
    }
  }
}

}  // namespace attic::attention::internal
