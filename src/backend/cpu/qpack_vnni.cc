// Block-quantized weights repacked for AVX512-VNNI (qdot.h, "Prepacked"): 16 rows
// interleaved, so that one vpdpbusd computes 4 products for each of 16 rows and the
// 16 lanes of an accumulator are 16 outputs (no horizontal sums, one sequential stream).
//
// Layout. Rows are cut into panels of kQuantPanelRows = 16 (the last one zero-padded);
// a panel holds its rows' blocks of 32 elements one after the other, each block as
//   codes: unsigned 8-bit codes u, 4 per row per 64-byte chunk: chunk c holds elements
//          4c..4c+3 of the 16 rows (row r at bytes 4r..4r+3). 4-bit types pack two
//          chunks in one: chunk c (c < 4) in the low nibbles, chunk c + 4 in the high.
// with the scales before the codes they apply to:
//   per-32 types (q4_0, q4_1, q5_0, q5_1, q8_0): [d: 16 f16][m: 16 f16, q4_1/q5_1][codes]
//     w = d (u - o) + m, o = 8 (q4_0), 16 (q5_0), 128 (q8_0), 0 otherwise;
//   q4_k, per 256: [d: 16 f16][dmin: 16 f16][sc: 8 x 16 u8][mn: 8 x 16 u8][8 x codes]
//     w = d sc_j u - dmin mn_j for the j-th 32 of the 256;
//   q6_k, per 256: [d: 16 f16][sc: 16 x 16 i8][8 x codes], w = d sc_g (u - 32) per 16.
// The scales are the file's own bits (f16, 6- or 8-bit integers), so the weights are
// exactly the format's; q4_0, q4_1, q8_0 take the file's bytes, q4_k 2.8% more (scales
// unpacked), q6_k 30% more and q5_0/q5_1 ~55% more (codes widened to bytes).
//
// The dot product per x row (x quantized by QuantizeX: per 32 a scale dx and int8 codes
// xq, with the codes' sums s per 16): for each block, the int32 sum of u * xq (exact),
// minus o times the sum of xq, converted to f32 (exact: |sum| < 2^24) and scaled:
//   y += dx (d (sum u xq - o s32) + m s32)               (per-32 types)
//   y += d sum_j dx_j sc_j (sum u xq) - dmin sum_j dx_j mn_j s32_j      (q4_k)
//   y += d sum_g dx sc_g (sum u xq - 32 s16_g)                         (q6_k)
// So the result equals the portable kernel's (qdot.cc) up to f32 rounding of the scale
// products and the accumulation order.

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

// The register arrays below (codes, accumulators) stay in registers only when their
// loops are fully unrolled.
#define ATTIC_UNROLL _Pragma("GCC unroll 32")  // see simd_avx512.h

namespace attic::backend::cpu::vnni {

namespace {

constexpr int64_t kP = kQuantPanelRows;

enum class Fmt { kPer32, kQ4K, kQ6K };

struct TypeInfo {
  Fmt fmt;
  bool nibbles;  // 4-bit codes, two per byte
  int offset;    // o
  bool has_min;  // per-32 m
};

bool Info(DType t, TypeInfo* info) {
  switch (t) {
    case DType::kQ4_0: *info = {Fmt::kPer32, true, 8, false}; return true;
    case DType::kQ4_1: *info = {Fmt::kPer32, true, 0, true}; return true;
    case DType::kQ5_0: *info = {Fmt::kPer32, false, 16, false}; return true;
    case DType::kQ5_1: *info = {Fmt::kPer32, false, 0, true}; return true;
    case DType::kQ8_0: *info = {Fmt::kPer32, false, 128, false}; return true;
    case DType::kQ4_K: *info = {Fmt::kQ4K, true, 0, false}; return true;
    case DType::kQ6_K: *info = {Fmt::kQ6K, false, 32, false}; return true;
    default: return false;
  }
}

int64_t CodeBytes(const TypeInfo& ti) { return ti.nibbles ? 4 * 64 : 8 * 64; }

// Bytes of one panel's unit: a block of 32 (per-32 types) or a superblock of 256.
int64_t UnitBytes(const TypeInfo& ti) {
  switch (ti.fmt) {
    case Fmt::kPer32: return (ti.has_min ? 64 : 32) + CodeBytes(ti);
    case Fmt::kQ4K: return 64 + 2 * 8 * kP + 8 * CodeBytes(ti);
    case Fmt::kQ6K: return 32 + 16 * kP + 8 * CodeBytes(ti);
  }
  return 0;
}

int64_t UnitElems(const TypeInfo& ti) { return ti.fmt == Fmt::kPer32 ? 32 : 256; }

int64_t PanelBytes(const TypeInfo& ti, int64_t k) { return k / UnitElems(ti) * UnitBytes(ti); }

uint16_t HalfBits(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// Writes the 32 codes u (of one row, elements 0..31 of a block) into a codes area.
void PutCodes(const TypeInfo& ti, const uint8_t* u, int r, uint8_t* codes) {
  for (int e = 0; e < 32; ++e) {
    const int c = e / 4, t = e % 4;
    if (ti.nibbles) {
      uint8_t& byte = codes[64 * (c % 4) + 4 * r + t];
      byte = static_cast<uint8_t>(c < 4 ? (byte & 0xF0) | u[e] : (byte & 0x0F) | (u[e] << 4));
    } else {
      codes[64 * c + 4 * r + t] = u[e];
    }
  }
}

// Packs rows [r0, r0 + rows) (rows <= kP) of w into one panel (zeroed beforehand).
void PackPanel(const TypeInfo& ti, const WeightTensor& w, int64_t r0, int64_t rows, uint8_t* panel) {
  const int64_t k = w.cols(), ue = UnitElems(ti), ub = UnitBytes(ti);
  const size_t bb = DTypeBlockBytes(w.dtype);
  DecodedBlock blk;
  uint8_t u[256];
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w.row(r0 + r);
    for (int64_t b = 0; b < k / ue; ++b) {
      const uint8_t* src = row + b * bb;
      uint8_t* unit = panel + b * ub;
      DecodeBlock(w.dtype, src, &blk);
      for (int64_t e = 0; e < ue; ++e) u[e] = static_cast<uint8_t>(blk.q[e] + ti.offset);
      switch (ti.fmt) {
        case Fmt::kPer32: {
          const uint16_t d = HalfBits(src);
          std::memcpy(unit + 2 * r, &d, 2);
          if (ti.has_min) {
            const uint16_t m = HalfBits(src + 2);
            std::memcpy(unit + 32 + 2 * r, &m, 2);
          }
          PutCodes(ti, u, static_cast<int>(r), unit + (ti.has_min ? 64 : 32));
          break;
        }
        case Fmt::kQ4K: {
          const uint16_t d = HalfBits(src), dmin = HalfBits(src + 2);
          std::memcpy(unit + 2 * r, &d, 2);
          std::memcpy(unit + 32 + 2 * r, &dmin, 2);
          for (int j = 0; j < 8; ++j) {
            uint8_t sc, mn;
            KQuantScaleMin(j, src + 4, &sc, &mn);
            unit[64 + kP * j + r] = sc;
            unit[64 + 8 * kP + kP * j + r] = mn;
            PutCodes(ti, u + 32 * j, static_cast<int>(r), unit + 64 + 16 * kP + j * CodeBytes(ti));
          }
          break;
        }
        case Fmt::kQ6K: {
          const uint16_t d = HalfBits(src + 208);
          std::memcpy(unit + 2 * r, &d, 2);
          for (int g = 0; g < 16; ++g) unit[32 + kP * g + r] = src[192 + g];
          for (int j = 0; j < 8; ++j) PutCodes(ti, u + 32 * j, static_cast<int>(r), unit + 32 + 16 * kP + j * CodeBytes(ti));
          break;
        }
      }
    }
  }
}

// x row i of a QuantizeX layout: codes, scales per 32, sums per 16.
struct XRow {
  const int8_t* q;
  const float* dx;
  const int32_t* s;
};

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
    _mm_prefetch(reinterpret_cast<const char*>(unit + 4 * ub), _MM_HINT_T0);
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
      _mm_prefetch(reinterpret_cast<const char*>(codes + 4 * cb), _MM_HINT_T0);
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
      _mm_prefetch(reinterpret_cast<const char*>(codes + 2 * cb), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(codes + 2 * cb + 256), _MM_HINT_T0);
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
  const int64_t k = w.cols(), n = w.rows(), rb = QuantXRowBytes(k), pb = PanelBytes(ti, k);
  XRow x[MI];
  ATTIC_UNROLL
  for (int i = 0; i < MI; ++i) {
    const uint8_t* r = xb + (i0 + i) * rb;
    x[i] = {reinterpret_cast<const int8_t*>(r), reinterpret_cast<const float*>(r + k),
            reinterpret_cast<const int32_t*>(r + k + 4 * (k / 32))};
  }
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

bool CanPrepackQuant(const WeightTensor& w) {
  TypeInfo ti;
  return GetCpuFeatures().avx512_vnni && w.shape.size() == 2 && w.rows() > 0 && Info(w.dtype, &ti) &&
         w.cols() % UnitElems(ti) == 0;
}

uint64_t PrepackedQuantBytes(const WeightTensor& w) {
  TypeInfo ti;
  if (!Info(w.dtype, &ti)) return 0;
  return static_cast<uint64_t>((w.rows() + kP - 1) / kP * PanelBytes(ti, w.cols()));
}

void PrepackQuant(ThreadPool& pool, const WeightTensor& w, void* out) {
  TypeInfo ti;
  ATTIC_CHECK(Info(w.dtype, &ti));
  const int64_t n = w.rows(), panels = (n + kP - 1) / kP, pb = PanelBytes(ti, w.cols());
  uint8_t* dst = static_cast<uint8_t*>(out);
  pool.ParallelFor(panels, [&](int64_t p, int) {
    std::memset(dst + p * pb, 0, static_cast<size_t>(pb));
    PackPanel(ti, w, p * kP, std::min<int64_t>(kP, n - p * kP), dst + p * pb);
  });
}

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
