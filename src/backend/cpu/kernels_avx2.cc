// AVX2 + FMA + F16C kernels: conversions, GEMV and elementwise ops (GEMM: gemm_avx2.cc).
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/kernel_table.h"
#include "backend/cpu/qdot.h"
#include "backend/cpu/qpack.h"

#define ATTIC_UNROLL _Pragma("GCC unroll 32")  // see simd_avx512.h

namespace attic::backend::cpu::avx2 {

namespace {

inline __m256i TailMask(int64_t r) {  // lanes [0, r) set, 0 <= r <= 8
  static const int32_t kBits[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kBits + 8 - r));
}

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for 8 lanes, ~2 ulp (Cephes expf); 0 below -87.3, +large above 88.37.
inline __m256 Exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.3762626647949f);
  __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));  // NaN passes through
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(under, res);
}

// Weight loaders: 8 elements at p (or the first r of them, rest 0) as f32.
struct F32W {
  using T = float;
  static __m256 Load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256 LoadPart(const float* p, int64_t r) { return _mm256_maskload_ps(p, TailMask(r)); }
};
struct Bf16W {
  using T = uint16_t;
  static __m256 Load(const uint16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static __m256 LoadPart(const uint16_t* p, int64_t r) {
    alignas(16) uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(tmp, p, static_cast<size_t>(r) * 2);
    return Load(tmp);
  }
};
struct F16W {
  using T = uint16_t;
  static __m256 Load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static __m256 LoadPart(const uint16_t* p, int64_t r) {
    alignas(16) uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(tmp, p, static_cast<size_t>(r) * 2);
    return Load(tmp);
  }
};

// out[i * R + r] = dot(x row i, weight row r) for R weight rows and MB x rows.
template <class W, int R, int MB>
inline void GemvBlock(const float* x, int64_t ldx, const typename W::T* const* rows, int64_t k, float* out) {
  __m256 acc[MB][R];
  ATTIC_UNROLL
  for (int i = 0; i < MB; ++i)
    ATTIC_UNROLL
    for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_ps();
  int64_t kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    __m256 wv[R];
    ATTIC_UNROLL
    for (int r = 0; r < R; ++r) wv[r] = W::Load(rows[r] + kk);
    ATTIC_UNROLL
    for (int i = 0; i < MB; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * ldx + kk);
      ATTIC_UNROLL
      for (int r = 0; r < R; ++r) acc[i][r] = _mm256_fmadd_ps(wv[r], xv, acc[i][r]);
    }
  }
  if (kk < k) {
    const int64_t rem = k - kk;
    __m256 wv[R];
    ATTIC_UNROLL
    for (int r = 0; r < R; ++r) wv[r] = W::LoadPart(rows[r] + kk, rem);
    ATTIC_UNROLL
    for (int i = 0; i < MB; ++i) {
      __m256 xv = _mm256_maskload_ps(x + i * ldx + kk, TailMask(rem));
      ATTIC_UNROLL
      for (int r = 0; r < R; ++r) acc[i][r] = _mm256_fmadd_ps(wv[r], xv, acc[i][r]);
    }
  }
  ATTIC_UNROLL
  for (int i = 0; i < MB; ++i)
    ATTIC_UNROLL
    for (int r = 0; r < R; ++r) out[i * R + r] = HSum(acc[i][r]);
}

template <class W, int R>
inline void GemvRows(const float* x, int64_t m, int64_t k, const typename W::T* const* rows, const float* bias,
                     float* y, int64_t ldy, int64_t j) {
  float out[4 * R];
  for (int64_t i = 0; i < m; i += 4) {
    const int64_t mb = m - i < 4 ? m - i : 4;
    const float* xi = x + i * k;
    switch (mb) {
      case 1: GemvBlock<W, R, 1>(xi, k, rows, k, out); break;
      case 2: GemvBlock<W, R, 2>(xi, k, rows, k, out); break;
      case 3: GemvBlock<W, R, 3>(xi, k, rows, k, out); break;
      default: GemvBlock<W, R, 4>(xi, k, rows, k, out); break;
    }
    for (int64_t ii = 0; ii < mb; ++ii)
      ATTIC_UNROLL
      for (int r = 0; r < R; ++r) y[(i + ii) * ldy + j + r] = out[ii * R + r] + (bias ? bias[j + r] : 0.0f);
  }
}

template <class W>
void GemvTyped(const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
               int64_t n1) {
  using T = typename W::T;
  const int64_t k = w.cols(), n = w.rows();
  const T* base = static_cast<const T*>(w.data);
  int64_t j = n0;
  for (; j + 4 <= n1; j += 4) {
    const T* rows[4] = {base + j * k, base + (j + 1) * k, base + (j + 2) * k, base + (j + 3) * k};
    GemvRows<W, 4>(x, m, k, rows, bias, y, n, j);
  }
  for (; j < n1; ++j) {
    const T* rows[1] = {base + j * k};
    GemvRows<W, 1>(x, m, k, rows, bias, y, n, j);
  }
}

void GemvQ8(const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
            int64_t n1) {
  const int64_t k = w.cols(), n = w.rows(), nb = k / 32;
  for (int64_t j = n0; j < n1; ++j) {
    const uint8_t* row = w.row(j);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * k;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * 34;
        uint16_t d16;
        std::memcpy(&d16, blk, 2);
        const __m128i q16a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
        const __m128i q16b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
        __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q16a)), _mm256_loadu_ps(xi + b * 32));
        p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q16a, 8))),
                            _mm256_loadu_ps(xi + b * 32 + 8), p);
        p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q16b)), _mm256_loadu_ps(xi + b * 32 + 16), p);
        p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q16b, 8))),
                            _mm256_loadu_ps(xi + b * 32 + 24), p);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(attic::F16ToF32(d16)), p, acc);
      }
      y[i * n + j] = HSum(acc) + (bias ? bias[j] : 0.0f);
    }
  }
}

}  // namespace

void F16ToF32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, F16W::Load(src + i));
  for (; i < n; ++i) dst[i] = attic::F16ToF32(src[i]);
}

void Bf16ToF32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, Bf16W::Load(src + i));
  for (; i < n; ++i) dst[i] = attic::Bf16ToF32(src[i]);
}

void F32ToBf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_loadu_ps(src + i);
    __m256i u = _mm256_castps_si256(f);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
    r = _mm256_srli_epi32(r, 16);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, nan, _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)));
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), packed);
  }
  for (; i < n; ++i) dst[i] = attic::F32ToBf16(src[i]);
}

void F32ToF16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = attic::F32ToF16(src[i]);
}

void RowToF32(DType dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::kF16: F16ToF32(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::kBF16: Bf16ToF32(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::kQ8_0: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (int64_t b = 0; b < n / 32; ++b, s += 34) {
        uint16_t d16;
        std::memcpy(&d16, s, 2);
        const __m256 d = _mm256_set1_ps(attic::F16ToF32(d16));
        for (int h = 0; h < 4; ++h) {
          __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 2 + 8 * h));
          _mm256_storeu_ps(dst + b * 32 + 8 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
        }
      }
      return;
    }
    default: attic::ConvertToF32(dtype, src, dst, static_cast<size_t>(n)); return;
  }
}

const float* GemvPrepare(const WeightTensor& w, const float* x, int64_t m, AlignedBuffer* scratch) {
  return UsesQuantDot(w.dtype) || qpack::IsPacked(w, Isa::kAvx2) ? QuantizeX(x, m, w.cols(), scratch) : x;
}
int64_t GemvLayout(const WeightTensor& w) { return UsesQuantDot(w.dtype) || qpack::IsPacked(w, Isa::kAvx2) ? -1 : 0; }

void Gemv(const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0, int64_t n1) {
  if (qpack::IsPacked(w, Isa::kAvx2)) {
    GemvPackedQuant(x, m, w, bias, y, n0, n1);
    return;
  }
  switch (w.dtype) {
    case DType::kF32: GemvTyped<F32W>(x, m, w, bias, y, n0, n1); return;
    case DType::kBF16: GemvTyped<Bf16W>(x, m, w, bias, y, n0, n1); return;
    case DType::kF16: GemvTyped<F16W>(x, m, w, bias, y, n0, n1); return;
    case DType::kQ8_0: GemvQ8(x, m, w, bias, y, n0, n1); return;
    default: GemvQuant(x, m, w, bias, y, n0, n1); return;
  }
}

void RmsNormRow(const float* x, const float* weight, int64_t n, float eps, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    a0 = _mm256_fmadd_ps(v0, v0, a0);
    a1 = _mm256_fmadd_ps(v1, v1, a1);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    a0 = _mm256_fmadd_ps(v, v, a0);
  }
  double ss = HSum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  const __m256 s = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), s), _mm256_loadu_ps(weight + i)));
  for (; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

inline __m256 SiluMul8(__m256 g, __m256 u) {
  const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

// The tail takes the same vector arithmetic (masked), so an element's result depends on
// its value alone, not on where it falls in the range: the callers cut rows x
// intermediate_size into ranges that vary with the step's row count, and a row's result
// must not (LinearMode::kRowInvariant, --deterministic).
void SiluMul(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(gate + i, SiluMul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(gate + i, m, SiluMul8(_mm256_maskload_ps(gate + i, m), _mm256_maskload_ps(up + i, m)));
  }
}

void Add(float* x, const float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) x[i] += y[i];
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  __m256 mv = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  float mx = HMax(mv);
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  const __m256 m8 = _mm256_set1_ps(mx);
  __m256 sv = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), m8));
    _mm256_storeu_ps(x + i, e);
    sv = _mm256_add_ps(sv, e);
  }
  double sum = HSum(sv);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (; i < n; ++i) x[i] *= static_cast<float>(1.0 / sum);
}

}  // namespace attic::backend::cpu::avx2
