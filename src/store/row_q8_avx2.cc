// The q8_0 entry row's dequantization with AVX2 + F16C (entry.h, DequantizeRowQ8): eight
// int8 values widened to f32 and multiplied by their group's scale. The same products as
// the scalar code (an int8 times an f16 scale is exact in f32), so the same bits.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "store/row_q8.h"

namespace attic::store::internal {

void DequantizeRowQ8Avx2(const uint8_t* row, int kv_dim, int group, float* y) {
  const uint8_t* scales = row + kv_dim;
  for (int j = 0; j * group < kv_dim; ++j) {
    uint16_t h;
    std::memcpy(&h, scales + 2 * j, sizeof(h));
    const __m256 d = _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))));
    for (int i = j * group; i < (j + 1) * group; i += 8) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i));
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      _mm256_storeu_ps(y + i, _mm256_mul_ps(d, q));
    }
  }
}

}  // namespace attic::store::internal
