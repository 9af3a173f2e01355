// q4_0 values widened with AVX2 + F16C (kv_q4.h, DequantizeKvRowQ4): eight bytes of codes
// at a time, their low nibbles to the first half of the group and their high nibbles to
// the second, each code minus 8 times the group's scale: the scalar loop's products, so
// the same bits.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "attention/kv_q4_internal.h"

namespace attic::attention::internal {

void DequantizeQ4Avx2(const uint8_t* q, const void* scales, int n, int group, float* y) {
  const auto* s = static_cast<const uint8_t*>(scales);
  const int half = group / 2;
  const __m256i low = _mm256_set1_epi32(0xF), eight = _mm256_set1_epi32(8);
  for (int g0 = 0, b = 0; g0 < n; g0 += group, ++b) {
    uint16_t h;
    std::memcpy(&h, s + 2 * b, sizeof(h));
    const __m256 d = _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))));
    const uint8_t* in = q + g0 / 2;
    for (int j = 0; j < half; j += 8) {
      const __m256i b32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + j)));
      const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(b32, low), eight);
      const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(b32, 4), eight);
      _mm256_storeu_ps(y + g0 + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(lo)));
      _mm256_storeu_ps(y + g0 + half + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(hi)));
    }
  }
}

}  // namespace attic::attention::internal
