// q8_0 values widened with AVX2 + F16C (kv_q8.h, DequantizeQ8): eight int8 values to f32
// at a time, times their group's scale. The same products as the scalar loop (an int8
// times an f16 scale is exact in f32), so the same bits.
#include <immintrin.h>

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

}  // namespace attic::attention::internal
