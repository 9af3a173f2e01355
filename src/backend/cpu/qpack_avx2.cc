// The packed block-quantized GEMV with AVX2 (qpack.h; the layout and the arithmetic are
// described in qpack.cc), for CPUs without AVX512-VNNI: a panel's 16 rows in two halves
// of 8, each 32-byte half of a code chunk holding 4 codes of each of 8 rows.
// vpmaddubsw multiplies the unsigned codes by x's signed codes and adds pairs into int16
// (at most 2 * 63 * 127 = 16002 for codes up to 63, so no saturation: q8_0, whose codes
// reach 255, is not packed here), vpmaddwd adds those pairs into the int32 lanes: the
// same exact sums as vpdpbusd.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "attic/core/status.h"
#include "backend/cpu/qdot.h"
#include "backend/cpu/qpack.h"

#define ATTIC_UNROLL _Pragma("GCC unroll 32")  // see simd_avx512.h

namespace attic::backend::cpu::avx2 {

namespace {

constexpr int64_t kP = kQuantPanelRows;
using qpack::PrefetchAhead;
using qpack::XRow;

inline __m256i Bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Code vector c (elements 4c..4c+3) of half h (rows 8h..8h+7) of a block's codes.
template <bool kNibbles>
inline __m256i Code(const uint8_t* codes, int c, int h) {
  if constexpr (kNibbles) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * (c % 4) + 32 * h));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    return c < 4 ? _mm256_and_si256(raw, m4) : _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * c + 32 * h));
  }
}

// a[i] = sum over c in [c0, c1) of the codes . x row i's codes 4c..4c+3, per row lane.
template <int MI, bool kNibbles, int c0, int c1>
inline void Dots(const uint8_t* codes, int h, const XRow* x, int64_t b, __m256i (&a)[MI]) {
  const __m256i ones = _mm256_set1_epi16(1);
  ATTIC_UNROLL
  for (int i = 0; i < MI; ++i) a[i] = _mm256_setzero_si256();
  // Two chunks' int16 pair sums added before vpmaddwd: each is at most 2 * 63 * 127 =
  // 16002 in magnitude, so their sum (32004) still fits.
  ATTIC_UNROLL
  for (int c = c0; c < c1; c += 2) {
    const __m256i code0 = Code<kNibbles>(codes, c, h), code1 = Code<kNibbles>(codes, c + 1, h);
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) {
      const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(code0, Bcast4(x[i].q + 32 * b + 4 * c)),
                                         _mm256_maddubs_epi16(code1, Bcast4(x[i].q + 32 * b + 4 * c + 4)));
      a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(p, ones));
    }
  }
}

inline __m256 Half8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline __m256 U8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline __m256 I8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

template <int MI, bool kNibbles, int kOffset, bool kMin>
void HalfPer32(const uint8_t* panel, int64_t nblk, int h, const XRow* x, __m256 (&acc)[MI]) {
  constexpr int64_t cb = kNibbles ? 256 : 512;
  constexpr int64_t ub = (kMin ? 64 : 32) + cb;
  ATTIC_UNROLL
  for (int i = 0; i < MI; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nblk; ++b) {
    const uint8_t* unit = panel + b * ub;
    if (h == 0) PrefetchAhead(unit, ub);
    const __m256 d = Half8(unit + 16 * h);
    __m256i a[MI];
    Dots<MI, kNibbles, 0, 8>(unit + (kMin ? 64 : 32), h, x, b, a);
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) {
      const int32_t s32 = x[i].s[2 * b] + x[i].s[2 * b + 1];
      if constexpr (kOffset != 0) a[i] = _mm256_sub_epi32(a[i], _mm256_set1_epi32(kOffset * s32));
      const float dx = x[i].dx[b];
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[i]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[i]);
      if constexpr (kMin)
        acc[i] = _mm256_fmadd_ps(Half8(unit + 32 + 16 * h), _mm256_set1_ps(dx * static_cast<float>(s32)), acc[i]);
    }
  }
}

template <int MI>
void HalfQ4K(const uint8_t* panel, int64_t nsb, int h, const XRow* x, __m256 (&acc)[MI]) {
  constexpr int64_t cb = 256, ub = 64 + 16 * kP + 8 * cb;
  ATTIC_UNROLL
  for (int i = 0; i < MI; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* unit = panel + sb * ub;
    __m256 sacc[MI], macc[MI];
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) sacc[i] = macc[i] = _mm256_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      const uint8_t* codes = unit + 64 + 16 * kP + j * cb;
      if (h == 0) PrefetchAhead(codes, cb + (j == 0 ? 64 + 16 * kP : 0));
      const __m256 sc = U8x8(unit + 64 + kP * j + 8 * h), mn = U8x8(unit + 64 + 8 * kP + kP * j + 8 * h);
      const int64_t b = 8 * sb + j;
      __m256i a[MI];
      Dots<MI, true, 0, 8>(codes, h, x, b, a);
      ATTIC_UNROLL
      for (int i = 0; i < MI; ++i) {
        const float dx = x[i].dx[b];
        sacc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[i]), _mm256_mul_ps(sc, _mm256_set1_ps(dx)), sacc[i]);
        macc[i] = _mm256_fmadd_ps(mn, _mm256_set1_ps(dx * static_cast<float>(x[i].s[2 * b] + x[i].s[2 * b + 1])),
                                  macc[i]);
      }
    }
    const __m256 d = Half8(unit + 16 * h), dmin = Half8(unit + 32 + 16 * h);
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) acc[i] = _mm256_fnmadd_ps(dmin, macc[i], _mm256_fmadd_ps(d, sacc[i], acc[i]));
  }
}

template <int MI>
void HalfQ6K(const uint8_t* panel, int64_t nsb, int h, const XRow* x, __m256 (&acc)[MI]) {
  constexpr int64_t cb = 512, ub = 32 + 16 * kP + 8 * cb;
  ATTIC_UNROLL
  for (int i = 0; i < MI; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* unit = panel + sb * ub;
    __m256 sacc[MI];
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) sacc[i] = _mm256_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      const uint8_t* codes = unit + 32 + 16 * kP + j * cb;
      if (h == 0) PrefetchAhead(codes, cb + (j == 0 ? 32 + 16 * kP : 0));
      const __m256 sc0 = I8x8(unit + 32 + kP * (2 * j) + 8 * h), sc1 = I8x8(unit + 32 + kP * (2 * j + 1) + 8 * h);
      const int64_t b = 8 * sb + j;
      __m256i a0[MI], a1[MI];
      Dots<MI, false, 0, 4>(codes, h, x, b, a0);
      Dots<MI, false, 4, 8>(codes, h, x, b, a1);
      ATTIC_UNROLL
      for (int i = 0; i < MI; ++i) {
        const __m256i s0 = _mm256_sub_epi32(a0[i], _mm256_set1_epi32(32 * x[i].s[2 * b]));
        const __m256i s1 = _mm256_sub_epi32(a1[i], _mm256_set1_epi32(32 * x[i].s[2 * b + 1]));
        const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), sc0, _mm256_mul_ps(_mm256_cvtepi32_ps(s1), sc1));
        sacc[i] = _mm256_fmadd_ps(t, _mm256_set1_ps(x[i].dx[b]), sacc[i]);
      }
    }
    const __m256 d = Half8(unit + 16 * h);
    ATTIC_UNROLL
    for (int i = 0; i < MI; ++i) acc[i] = _mm256_fmadd_ps(d, sacc[i], acc[i]);
  }
}

template <int MI>
void Half(DType t, const uint8_t* panel, int64_t k, int h, const XRow* x, __m256 (&acc)[MI]) {
  switch (t) {
    case DType::kQ4_0: HalfPer32<MI, true, 8, false>(panel, k / 32, h, x, acc); return;
    case DType::kQ4_1: HalfPer32<MI, true, 0, true>(panel, k / 32, h, x, acc); return;
    case DType::kQ5_0: HalfPer32<MI, false, 16, false>(panel, k / 32, h, x, acc); return;
    case DType::kQ5_1: HalfPer32<MI, false, 0, true>(panel, k / 32, h, x, acc); return;
    case DType::kQ4_K: HalfQ4K<MI>(panel, k / 256, h, x, acc); return;
    case DType::kQ6_K: HalfQ6K<MI>(panel, k / 256, h, x, acc); return;
    default: ATTIC_CHECK(false && "type without an AVX2 packed kernel"); return;
  }
}

template <int MI>
void Rows(const WeightTensor& w, const uint8_t* xb, int64_t i0, const float* bias, float* y, int64_t n0,
          int64_t n1) {
  qpack::TypeInfo ti;
  ATTIC_CHECK(qpack::Info(w.dtype, &ti));
  const int64_t k = w.cols(), n = w.rows(), pb = qpack::PanelBytes(ti, k);
  XRow x[MI];
  for (int i = 0; i < MI; ++i) x[i] = XRow(xb, i0 + i, k);
  const uint8_t* packed = static_cast<const uint8_t*>(w.packed);
  for (int64_t r0 = n0; r0 < n1; r0 += kP) {
    for (int h = 0; h < 2; ++h) {
      const int64_t first = r0 + 8 * h, valid = std::min<int64_t>(8, n1 - first);
      if (valid <= 0) break;
      __m256 acc[MI];
      Half<MI>(w.dtype, packed + (r0 / kP) * pb, k, h, x, acc);
      for (int i = 0; i < MI; ++i) {
        alignas(32) float out[8];
        _mm256_store_ps(out, acc[i]);
        float* yr = y + (i0 + i) * n + first;
        for (int64_t l = 0; l < valid; ++l) yr[l] = bias ? out[l] + bias[first + l] : out[l];
      }
    }
  }
}

}  // namespace

bool CanPrepackQuant(const WeightTensor& w) { return w.dtype != DType::kQ8_0 && qpack::CanPack(w); }

void GemvPackedQuant(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                     int64_t n1) {
  ATTIC_CHECK(n0 % kP == 0);
  const uint8_t* xb = reinterpret_cast<const uint8_t*>(xp);
  int64_t i0 = 0;
  for (; i0 + 4 <= m; i0 += 4) Rows<4>(w, xb, i0, bias, y, n0, n1);
  switch (m - i0) {
    case 3: Rows<3>(w, xb, i0, bias, y, n0, n1); break;
    case 2: Rows<2>(w, xb, i0, bias, y, n0, n1); break;
    case 1: Rows<1>(w, xb, i0, bias, y, n0, n1); break;
    default: break;
  }
}

}  // namespace attic::backend::cpu::avx2
