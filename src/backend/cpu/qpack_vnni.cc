// The packed block-quantized GEMV with AVX512-VNNI (qpack.h; the layout and the
// arithmetic are described in qpack.cc): one vpdpbusd gives 4 products for each of the
// panel's 16 rows, whose lanes are its 16 outputs.

// GCC 12 warns about the deliberately undefined registers inside its AVX-512 intrinsic
// headers once they are inlined (as simd_avx512.h notes); before the first <immintrin.h>.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "attic/tensor/quants.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/qdot.h"
#include "backend/cpu/qpack.h"

// The register arrays below (codes, accumulators) stay in registers only when their
// loops are fully unrolled.
#define ATTIC_UNROLL _Pragma("GCC unroll 32")  // see simd_avx512.h

namespace attic::backend::cpu::vnni {

namespace {

constexpr int64_t kP = kQuantPanelRows;
using qpack::Fmt;
using qpack::PrefetchAhead;
using qpack::XRow;
using qpack::TypeInfo;
using qpack::Info;
using qpack::PanelBytes;

inline __m512i Bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The 8 code vectors of one block: code[c] pairs with x's elements 4c..4c+3.
template <bool kNibbles>
inline void LoadCodes(const uint8_t* p, __m512i (&code)[8]) {
  if constexpr (kNibbles) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    ATTIC_UNROLL
    for (int c = 0; c < 4; ++c) {
      const __m512i raw = _mm512_loadu_si512(p + 64 * c);
      code[c] = _mm512_and_si512(raw, m4);
      code[c + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    }
  } else {
    ATTIC_UNROLL
    for (int c = 0; c < 8; ++c) code[c] = _mm512_loadu_si512(p + 64 * c);
  }
}

// sum over c in [c0, c1) of code[c] . xq[4c..4c+3], per row lane; two dependency
// chains (vpdpbusd's latency is several cycles).
template <int c0, int c1>
inline __m512i Dot(const __m512i (&code)[8], const int8_t* xq) {
  __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
  ATTIC_UNROLL
  for (int c = c0; c < c1; c += 2) {
    a = _mm512_dpbusd_epi32(a, code[c], Bcast4(xq + 4 * c));
    b = _mm512_dpbusd_epi32(b, code[c + 1], Bcast4(xq + 4 * c + 4));
  }
  return _mm512_add_epi32(a, b);
}

inline __m512 Half16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512 U8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline __m512 I8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// One panel (16 rows) against MI x rows: acc[i] = the 16 rows' dot products with x row i.
template <int MI, bool kNibbles, int kOffset, bool kMin>
void PanelPer32(const uint8_t* panel, int64_t nblk, const XRow* x, __m512 (&acc)[MI]) {
  constexpr int64_t cb = kNibbles ? 256 : 512;
  constexpr int64_t ub = (kMin ? 64 : 32) + cb;
  ATTIC_UNROLL
  for (int i = 0; i < MI; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nblk; ++b) {
    const uint8_t* unit = panel + b * ub;
    PrefetchAhead(unit, ub);
    const __m512 d = Half16(unit);
    __m512i code[8];
    LoadCodes<kNibbles>(unit + (kMin ? 64 : 32), code);
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) {
      __m512i a = Dot<0, 8>(code, x[i].q + 32 * b);
      const int32_t s32 = x[i].s[2 * b] + x[i].s[2 * b + 1];
      if constexpr (kOffset != 0) a = _mm512_sub_epi32(a, _mm512_set1_epi32(kOffset * s32));
      const float dx = x[i].dx[b];
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[i]);
      if constexpr (kMin) acc[i] = _mm512_fmadd_ps(Half16(unit + 32), _mm512_set1_ps(dx * static_cast<float>(s32)), acc[i]);
    }
  }
}

template <int MI>
void PanelQ4K(const uint8_t* panel, int64_t nsb, const XRow* x, __m512 (&acc)[MI]) {
  constexpr int64_t cb = 256, ub = 64 + 16 * kP + 8 * cb;
  ATTIC_UNROLL
  for (int i = 0; i < MI; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* unit = panel + sb * ub;
    __m512 sacc[MI], macc[MI];
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) sacc[i] = macc[i] = _mm512_setzero_ps();
      for (int j = 0; j < 8; ++j) {
      const uint8_t* codes = unit + 64 + 16 * kP + j * cb;
      PrefetchAhead(codes, cb + (j == 0 ? 64 + 16 * kP : 0));
      __m512i code[8];
      LoadCodes<true>(codes, code);
      const __m512 sc = U8x16(unit + 64 + kP * j), mn = U8x16(unit + 64 + 8 * kP + kP * j);
      const int64_t b = 8 * sb + j;
      ATTIC_UNROLL
      for (int i = 0; i < MI; ++i) {
        const __m512i a = Dot<0, 8>(code, x[i].q + 32 * b);
        const float dx = x[i].dx[b];
        sacc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(sc, _mm512_set1_ps(dx)), sacc[i]);
        macc[i] = _mm512_fmadd_ps(mn, _mm512_set1_ps(dx * static_cast<float>(x[i].s[2 * b] + x[i].s[2 * b + 1])),
                                  macc[i]);
      }
    }
    const __m512 d = Half16(unit), dmin = Half16(unit + 32);
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) acc[i] = _mm512_fnmadd_ps(dmin, macc[i], _mm512_fmadd_ps(d, sacc[i], acc[i]));
  }
}

template <int MI>
void PanelQ6K(const uint8_t* panel, int64_t nsb, const XRow* x, __m512 (&acc)[MI]) {
  constexpr int64_t cb = 512, ub = 32 + 16 * kP + 8 * cb;
  ATTIC_UNROLL
  for (int i = 0; i < MI; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* unit = panel + sb * ub;
    __m512 sacc[MI];
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) sacc[i] = _mm512_setzero_ps();
      for (int j = 0; j < 8; ++j) {
      const uint8_t* codes = unit + 32 + 16 * kP + j * cb;
      PrefetchAhead(codes, cb + (j == 0 ? 32 + 16 * kP : 0));
      __m512i code[8];
      LoadCodes<false>(codes, code);
      const __m512 sc0 = I8x16(unit + 32 + kP * (2 * j)), sc1 = I8x16(unit + 32 + kP * (2 * j + 1));
      const int64_t b = 8 * sb + j;
      ATTIC_UNROLL
      for (int i = 0; i < MI; ++i) {
        const int8_t* xq = x[i].q + 32 * b;
        const __m512i a0 = _mm512_sub_epi32(Dot<0, 4>(code, xq), _mm512_set1_epi32(32 * x[i].s[2 * b]));
        const __m512i a1 = _mm512_sub_epi32(Dot<4, 8>(code, xq), _mm512_set1_epi32(32 * x[i].s[2 * b + 1]));
        const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), sc0, _mm512_mul_ps(_mm512_cvtepi32_ps(a1), sc1));
        sacc[i] = _mm512_fmadd_ps(t, _mm512_set1_ps(x[i].dx[b]), sacc[i]);
      }
    }
    const __m512 d = Half16(unit);
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) acc[i] = _mm512_fmadd_ps(d, sacc[i], acc[i]);
  }
}

template <int MI>
void Panel(const TypeInfo& ti, DType t, const uint8_t* panel, int64_t k, const XRow* x, __m512 (&acc)[MI]) {
  switch (t) {
    case DType::kQ4_0: PanelPer32<MI, true, 8, false>(panel, k / 32, x, acc); return;
    case DType::kQ4_1: PanelPer32<MI, true, 0, true>(panel, k / 32, x, acc); return;
    case DType::kQ5_0: PanelPer32<MI, false, 16, false>(panel, k / 32, x, acc); return;
    case DType::kQ5_1: PanelPer32<MI, false, 0, true>(panel, k / 32, x, acc); return;
    case DType::kQ8_0: PanelPer32<MI, false, 128, false>(panel, k / 32, x, acc); return;
    case DType::kQ4_K: PanelQ4K<MI>(panel, k / 256, x, acc); return;
    case DType::kQ6_K: PanelQ6K<MI>(panel, k / 256, x, acc); return;
    default: (void)ti; return;
  }
}

template <int MI>
void Rows(const TypeInfo& ti, const WeightTensor& w, const uint8_t* xb, int64_t i0, const float* bias, float* y,
          int64_t n0, int64_t n1) {
  const int64_t k = w.cols(), n = w.rows(), pb = PanelBytes(ti, k);
  XRow x[MI];
  ATTIC_UNROLL
  for (int i = 0; i < MI; ++i) x[i] = XRow(xb, i0 + i, k);
  const uint8_t* packed = static_cast<const uint8_t*>(w.packed);
  for (int64_t r0 = n0; r0 < n1; r0 += kP) {
    __m512 acc[MI];
    Panel<MI>(ti, w.dtype, packed + (r0 / kP) * pb, k, x, acc);
    const int64_t valid = std::min<int64_t>(kP, n1 - r0);
    const __mmask16 mask = valid >= 16 ? __mmask16(0xffff) : __mmask16((1u << valid) - 1u);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + r0) : _mm512_setzero_ps();
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) _mm512_mask_storeu_ps(y + (i0 + i) * n + r0, mask, _mm512_add_ps(acc[i], bv));
  }
}

}  // namespace

bool CanPrepackQuant(const WeightTensor& w) { return GetCpuFeatures().avx512_vnni && qpack::CanPack(w); }

void GemvPackedQuant(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                     int64_t n1) {
  TypeInfo ti;
  ATTIC_CHECK(Info(w.dtype, &ti) && n0 % kP == 0);
  const uint8_t* xb = reinterpret_cast<const uint8_t*>(xp);
  int64_t i0 = 0;
  for (; i0 + 4 <= m; i0 += 4) Rows<4>(ti, w, xb, i0, bias, y, n0, n1);
  switch (m - i0) {
    case 3: Rows<3>(ti, w, xb, i0, bias, y, n0, n1); break;
    case 2: Rows<2>(ti, w, xb, i0, bias, y, n0, n1); break;
    case 1: Rows<1>(ti, w, xb, i0, bias, y, n0, n1); break;
    default: break;
  }
}

// QuantizeX (qdot.cc) with AVX-512: the same operations per element (max |x| / 127, x
// times its reciprocal rounded to nearest even), so the same bytes.
const float* QuantizeX(const float* x, int64_t m, int64_t k, AlignedBuffer* scratch) {
  const int64_t rb = QuantXRowBytes(k);
  scratch->Reserve(static_cast<size_t>(m * rb));
  uint8_t* base = scratch->data();
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * k;
    int8_t* xq = reinterpret_cast<int8_t*>(base + i * rb);
    float* dx = reinterpret_cast<float*>(base + i * rb + k);
    int32_t* s = reinterpret_cast<int32_t*>(base + i * rb + k + 4 * (k / 32));
    for (int64_t b = 0; b < k / 32; ++b) {
      const __m512 v0 = _mm512_loadu_ps(xr + 32 * b), v1 = _mm512_loadu_ps(xr + 32 * b + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float d = amax / 127.0f;
      const float id = d > 0.0f ? 1.0f / d : 0.0f;
      dx[b] = d;
      const __m512 idv = _mm512_set1_ps(id), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(v0, idv))));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(v1, idv))));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + 32 * b), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + 32 * b + 16), _mm512_cvtsepi32_epi8(q1));
      s[2 * b] = _mm512_reduce_add_epi32(q0);
      s[2 * b + 1] = _mm512_reduce_add_epi32(q1);
    }
  }
  return reinterpret_cast<const float*>(base);
}

}  // namespace attic::backend::cpu::vnni
