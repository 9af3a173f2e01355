// AVX-512 rotate-half for RopeTable (compiled with -mavx512f). Every product and sum is
// an explicitly rounded AVX-512 operation (the *_round_ps forms are never contracted into
// FMAs), in the scalar code's order, so the results are bit-identical to it.
// GCC 12 reports false -Wmaybe-uninitialized inside its own AVX-512 intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "attention/attention_internal.h"

namespace attic::attention::internal {

void RotateHalfAvx512(const float* x1, const float* x2, float* y1, float* y2, const float* c, const float* s,
                      float sign, int half) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 sg = _mm512_set1_ps(sign);
  for (int i = 0; i < half; i += 16) {
    const __mmask16 m = half - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (half - i)) - 1);
    const __m512 a = _mm512_maskz_loadu_ps(m, x1 + i), b = _mm512_maskz_loadu_ps(m, x2 + i);
    const __m512 cv = _mm512_maskz_loadu_ps(m, c + i);
    const __m512 si = _mm512_mul_round_ps(sg, _mm512_maskz_loadu_ps(m, s + i), kRound);
    const __m512 r1 = _mm512_sub_round_ps(_mm512_mul_round_ps(a, cv, kRound), _mm512_mul_round_ps(b, si, kRound), kRound);
    const __m512 r2 = _mm512_add_round_ps(_mm512_mul_round_ps(b, cv, kRound), _mm512_mul_round_ps(a, si, kRound), kRound);
    _mm512_mask_storeu_ps(y1 + i, m, r1);
    _mm512_mask_storeu_ps(y2 + i, m, r2);
  }
}

}  // namespace attic::attention::internal
