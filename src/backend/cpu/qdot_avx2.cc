// Block-quantized GEMV on AVX2 (qdot.h): vpmaddubsw of |q| with xq signed by q, then
// vpmaddwd with ones into int32.
#include "backend/cpu/qdot_simd.h"

namespace attic::backend::cpu::avx2 {

namespace {

struct MaddDot {
  static __m256i Chunk(const int8_t* q, const int8_t* xq) {
    const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qv, qv), _mm256_sign_epi8(xv, qv));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
  }
};

}  // namespace

void GemvQuant(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
               int64_t n1) {
  GemvQuantT<MaddDot>(xp, m, w, bias, y, n0, n1);
}

}  // namespace attic::backend::cpu::avx2
