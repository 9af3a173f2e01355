// Block-quantized GEMV with AVX512-VNNI (qdot.h): vpdpbusd (256-bit, AVX512-VL) of |q|
// with xq signed by q. The AVX-512 kernel table uses it on CPUs with AVX512-VNNI.
#include "backend/cpu/qdot_simd.h"

namespace attic::backend::cpu::vnni {

namespace {

struct DpbusdDot {
  static __m256i Chunk(const int8_t* q, const int8_t* xq) {
    const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qv, qv), _mm256_sign_epi8(xv, qv));
  }
};

}  // namespace

void GemvQuant(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
               int64_t n1) {
  GemvQuantT<DpbusdDot>(xp, m, w, bias, y, n0, n1);
}

}  // namespace attic::backend::cpu::vnni
