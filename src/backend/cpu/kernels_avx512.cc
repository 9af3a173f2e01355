// AVX-512 kernels: conversions, GEMV (decode) and elementwise ops. GEMM is in
// gemm_avx512.cc.
//
// GEMV numerics: f32, f16 and q8_0 weights are widened to f32 exactly (f16 by vcvtph2ps,
// q8_0 by int8->f32 times the block scale) and multiplied with f32 activations by FMA:
// true f32 math. bf16 weights on CPUs with AVX512-BF16 use vdpbf16ps with the activations
// rounded to bf16 (as the bf16 GEMM does, and llama.cpp): in a 1B-shape decode step on
// Zen 5 (`kernels_bench --only ab`) the f32-FMA form, which widens the weights by a
// shift, ran 0-15% slower than the f16 GEMV over the same bytes, vdpbf16ps (half the
// activation bytes and instructions per weight) 5-15% faster. Without AVX512-BF16 bf16
// takes the exact f32-FMA form.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "attic/tensor/buffer.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/qdot.h"
#include "backend/cpu/qpack.h"
#include "backend/cpu/simd_avx512.h"

namespace attic::backend::cpu::avx512 {

namespace {

// GEMV. 4 weight rows are blocked together (DotRows4), so each x load feeds 4 FMAs, with
// a software prefetch one 4-row group ahead. Every m, one row (decode) included, takes
// this form, and a partial group repeats its last row: a row's result is then the same
// bits whatever m is and wherever the row sits in x, so a sequence's projections do not
// depend on what else shared its step (up to the GEMM crossover, gemv_max_m). On the
// development Xeon (AVX512-BF16) this was also the fastest m = 1 form measured: SmolLM2-
// 135M bf16 decode 59-62 against 48-51 tok/s for one row at a time with its own
// accumulators; f32 unchanged within noise.
//
// x is laid out once per call (GemvPrepare): rows padded to whole 32-element chunks with
// zeros, so only weight loads need masks. Each loader widens 32 weights to two f32
// vectors; bf16 splits a 64-byte load into its even elements (shift left 16) and odd
// elements (mask the low half) -- two cheap ALU ops, no shuffles -- against x permuted
// to match (each 32-chunk stored as its 16 even then its 16 odd elements).
// q8_0 GEMV: software prefetch this far ahead of the row being read.
constexpr int64_t kPrefetchBytes = 8192;

struct F32W {
  using T = float;
  static void Load32(const float* p, __m512* lo, __m512* hi) {
    *lo = _mm512_loadu_ps(p);
    *hi = _mm512_loadu_ps(p + 16);
  }
  static void Load32Mask(const float* p, __mmask32 m, __m512* lo, __m512* hi) {
    *lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m), p);
    *hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m >> 16), p + 16);
  }
};
struct F16W {
  using T = uint16_t;
  static void Load32(const uint16_t* p, __m512* lo, __m512* hi) {
    *lo = LoadF16(p);
    *hi = LoadF16(p + 16);
  }
  static void Load32Mask(const uint16_t* p, __mmask32 m, __m512* lo, __m512* hi) {
    *lo = LoadF16Part(p, static_cast<__mmask16>(m));
    *hi = LoadF16Part(p + 16, static_cast<__mmask16>(m >> 16));
  }
};
struct Bf16W {
  using T = uint16_t;
  static void Split(__m512i v, __m512* even, __m512* odd) {
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static void Load32(const uint16_t* p, __m512* lo, __m512* hi) { Split(_mm512_loadu_si512(p), lo, hi); }
  static void Load32Mask(const uint16_t* p, __mmask32 m, __m512* lo, __m512* hi) {
    Split(_mm512_maskz_loadu_epi16(m, p), lo, hi);
  }
};

// Rounds k up to whole 32-element chunks.
inline int64_t PadK(int64_t k) { return (k + 31) & ~int64_t{31}; }

// Lanes [0, r) of a 32-element chunk (r may be <= 0 or >= 32).
inline __mmask32 FirstLanes(int64_t r) {
  return r <= 0 ? __mmask32(0) : r >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << r) - 1u);
}

// Alignment shift of w's rows in elements: weight files put tensors at arbitrary offsets
// (safetensors: whatever the JSON header length gives, e.g. 48 mod 64; GGUF: 32), and
// then every 64-byte load would straddle two cache lines (~15% of DRAM throughput). When
// all rows share one alignment (row bytes % 64 == 0), the GEMV walks each row from the
// 64-byte boundary `shift` elements before its start, with those lanes masked off, and x
// is shifted to match. 0 when the rows are aligned or cannot all be.
inline int64_t RowShift(const WeightTensor& w) {
  const int64_t esize = w.dtype == DType::kF32 ? 4 : DTypeIsBlock(w.dtype) ? 0 : 2;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(w.data);
  if (esize == 0 || addr % esize != 0 || (w.cols() * esize) % 64 != 0) return 0;
  return static_cast<int64_t>(addr % 64) / esize;
}

// A row pointer moved back `shift` elements (to its 64-byte boundary). Integer arithmetic:
// the result may point before the tensor; lanes there are always masked off.
template <class T>
inline const T* Back(const T* p, int64_t shift) {
  return reinterpret_cast<const T*>(reinterpret_cast<uintptr_t>(p) - static_cast<uintptr_t>(shift) * sizeof(T));
}

// xp[i, :] = [shift zeros, x[i, :], zeros] padded to PadK(k + shift); with even_odd, each
// 32-chunk is stored as its 16 even elements then its 16 odd elements.
void PrepareX(const float* x, int64_t m, int64_t k, int64_t shift, bool even_odd, float* xp) {
  const int64_t ld = PadK(k + shift);
  const __m512i even_idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_idx = _mm512_add_epi32(even_idx, _mm512_set1_epi32(1));
  for (int64_t i = 0; i < m; ++i) {
    float* dst = xp + i * ld;
    std::memset(dst, 0, static_cast<size_t>(ld) * 4);
    std::memcpy(dst + shift, x + i * k, static_cast<size_t>(k) * 4);
    if (!even_odd) continue;
    for (int64_t c = 0; c < ld; c += 32) {
      const __m512 a = _mm512_loadu_ps(dst + c), b = _mm512_loadu_ps(dst + c + 16);
      _mm512_storeu_ps(dst + c, _mm512_permutex2var_ps(a, even_idx, b));
      _mm512_storeu_ps(dst + c + 16, _mm512_permutex2var_ps(a, odd_idx, b));
    }
  }
}

// Horizontal sums of four vectors: {sum(a), sum(b), sum(c), sum(d)}.
inline __m128 Reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // a02 b02 a13 b13
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xee));  // a b c d per lane
  s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, 0x4e));
  s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, 0xb1));
  return _mm512_castps512_ps128(s);
}

// Zeroes the accumulators of an MB x 4 block kernel.
template <int MB>
inline void ZeroAcc(__m512 (&acc)[MB][4]) {
  ATTIC_UNROLL
  for (int i = 0; i < MB; ++i)
    ATTIC_UNROLL
    for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_setzero_ps();
}

// out[i * 4 + r] = dot(w row r, xp row i) for 4 weight rows and MB x rows. Each x load
// feeds 4 FMAs: with several x rows the plain DotRow is bound by x loads, not DRAM.
template <class W, int MB>
inline void DotRows4(const typename W::T* const* rows, const float* xp, int64_t ldx, int64_t kv, int64_t shift,
                     int64_t pf_bytes, float* out) {
  __m512 acc[MB][4];
  ZeroAcc(acc);
  for (int64_t kk = 0; kk < kv; kk += 32) {
    __m512 wl[4], wh[4];
    if (kk + 32 <= kv && (kk > 0 || shift == 0)) {
      ATTIC_UNROLL
      for (int r = 0; r < 4; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + kk) + pf_bytes, _MM_HINT_T0);
        W::Load32(rows[r] + kk, &wl[r], &wh[r]);
      }
    } else {
      const __mmask32 mask = FirstLanes(kv - kk) & (kk == 0 ? ~FirstLanes(shift) : ~__mmask32(0));
      ATTIC_UNROLL
      for (int r = 0; r < 4; ++r) W::Load32Mask(rows[r] + kk, mask, &wl[r], &wh[r]);
    }
    ATTIC_UNROLL
    for (int i = 0; i < MB; ++i) {
      const __m512 xl = _mm512_loadu_ps(xp + i * ldx + kk), xh = _mm512_loadu_ps(xp + i * ldx + kk + 16);
      ATTIC_UNROLL
      for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_fmadd_ps(wh[r], xh, _mm512_fmadd_ps(wl[r], xl, acc[i][r]));
    }
  }
  ATTIC_UNROLL
  for (int i = 0; i < MB; ++i) _mm_storeu_ps(out + 4 * i, Reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
}

// Calls fn(std::integral_constant<int, MB>{}, i) for each block of MB <= 4 x rows
// [i, i + MB) of m: the kernels take the block height as a template parameter.
template <class Fn>
inline void ForXBlocks(int64_t m, Fn&& fn) {
  for (int64_t i = 0; i < m; i += 4) {
    switch (std::min<int64_t>(4, m - i)) {
      case 1: fn(std::integral_constant<int, 1>{}, i); break;
      case 2: fn(std::integral_constant<int, 2>{}, i); break;
      case 3: fn(std::integral_constant<int, 3>{}, i); break;
      default: fn(std::integral_constant<int, 4>{}, i); break;
    }
  }
}

// The blocked GEMV over weight rows [n0, n1) of w (elements T) and x prepared as X:
// groups of 4 weight rows (a partial group repeats its last row, results dropped) times
// blocks of up to 4 x rows. dot4(mb, rows, x, ldx, kv, shift, pf_bytes, out) is the
// form's DotRows4 for an mb-row block.
template <class T, class X, class Dot4>
void GemvBlocked(const X* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                 int64_t n1, Dot4 dot4) {
  const int64_t k = w.cols(), n = w.rows(), shift = RowShift(w), kv = k + shift, ldx = PadK(kv);
  const T* base = static_cast<const T*>(w.data);
  // Prefetch each row stream one 4-row group ahead (the groups are contiguous).
  const int64_t pf_bytes = 4 * k * static_cast<int64_t>(sizeof(T));
  float out[16];
  for (int64_t j = n0; j < n1; j += 4) {
    const int64_t nr = std::min<int64_t>(4, n1 - j);
    const T* rows[4];
    for (int r = 0; r < 4; ++r) rows[r] = Back(base + (j + std::min<int64_t>(r, nr - 1)) * k, shift);
    ForXBlocks(m, [&](auto mb, int64_t i) {
      dot4(mb, rows, xp + i * ldx, ldx, kv, shift, pf_bytes, out);
      for (int64_t ii = 0; ii < mb; ++ii)
        for (int64_t r = 0; r < nr; ++r) y[(i + ii) * n + j + r] = out[ii * 4 + r] + (bias ? bias[j + r] : 0.0f);
    });
  }
}

template <class W>
void GemvTyped(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
               int64_t n1) {
  GemvBlocked<typename W::T>(xp, m, w, bias, y, n0, n1, [](auto mb, auto... args) { DotRows4<W, mb>(args...); });
}

// bf16 GEMV with vdpbf16ps (CPUs with AVX512-BF16). x is prepared as bf16 (round to
// nearest even, as F32ToBf16), shifted and zero-padded like the f32 layout but in natural
// order: vdpbf16ps multiplies weight and x lanes pairwise, so the pairs need not start
// at even columns. Lanes outside a row are masked off (they may hold other rows or file
// bytes, and 0 * inf would be NaN). 4 rows are blocked for every m, as in the f32 form.
std::atomic<bool> g_bf16_dot_disabled{false};  // tests: force the f32-FMA form

inline bool UseBf16Dot() {
  return !g_bf16_dot_disabled.load(std::memory_order_relaxed) && GetCpuFeatures().avx512_bf16;
}

void PrepareXBf16(const float* x, int64_t m, int64_t k, int64_t shift, uint16_t* xb) {
  const int64_t ld = PadK(k + shift);
  for (int64_t i = 0; i < m; ++i) {
    uint16_t* dst = xb + i * ld;
    std::memset(dst, 0, static_cast<size_t>(ld) * 2);
    F32ToBf16(x + i * k, dst + shift, k);
  }
}

// out[i * 4 + r] = dot(row r, xb row i) for 4 weight rows and MB x rows.
template <int MB>
inline void DotRows4Bf16Dot(const uint16_t* const* rows, const uint16_t* xb, int64_t ldx, int64_t kv, int64_t shift,
                            int64_t pf_bytes, float* out) {
  __m512 acc[MB][4];
  ZeroAcc(acc);
  auto accumulate = [&](const __m512i* wv, int64_t kk) __attribute__((always_inline)) {
    ATTIC_UNROLL
    for (int i = 0; i < MB; ++i) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + i * ldx + kk);  // one x load, 4 rows
      ATTIC_UNROLL
      for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], (__m512bh)wv[r], xv);
    }
  };
  auto masked = [&](int64_t kk, __mmask32 mask) __attribute__((always_inline)) {
    __m512i wv[4];
    ATTIC_UNROLL
    for (int r = 0; r < 4; ++r) wv[r] = _mm512_maskz_loadu_epi16(mask, rows[r] + kk);
    accumulate(wv, kk);
  };
  int64_t kk = 0;
  if (shift > 0) {  // head chunk: lanes before the row start masked off
    masked(0, FirstLanes(kv) & ~FirstLanes(shift));
    kk = 32;
  }
  for (; kk + 32 <= kv; kk += 32) {
    __m512i wv[4];
    ATTIC_UNROLL
    for (int r = 0; r < 4; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + kk) + pf_bytes, _MM_HINT_T0);
      wv[r] = _mm512_loadu_si512(rows[r] + kk);
    }
    accumulate(wv, kk);
  }
  if (kk < kv) masked(kk, FirstLanes(kv - kk));
  ATTIC_UNROLL
  for (int i = 0; i < MB; ++i) _mm_storeu_ps(out + 4 * i, Reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
}

void GemvBf16Dot(const uint16_t* xb, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                 int64_t n1) {
  GemvBlocked<uint16_t>(xb, m, w, bias, y, n0, n1, [](auto mb, auto... args) { DotRows4Bf16Dot<mb>(args...); });
}

// 32 int8 of a q8_0 block as two f32 vectors.
inline void LoadQ8(const uint8_t* q, __m512* lo, __m512* hi) {
  *lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
  *hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
}

inline float BlockScale(const uint8_t* blk) {
  uint16_t d16;
  std::memcpy(&d16, blk, 2);
  return _cvtsh_ss(d16);
}

void GemvQ8(const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
            int64_t n1) {
  const int64_t k = w.cols(), n = w.rows(), nb = k / 32;
  for (int64_t j = n0; j < n1; ++j) {
    const uint8_t* row = w.row(j);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * k;
      __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * 34;
        _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes, _MM_HINT_T0);
        __m512 q0, q1;
        LoadQ8(blk + 2, &q0, &q1);
        const __m512 d = _mm512_set1_ps(BlockScale(blk));
        acc0 = _mm512_fmadd_ps(_mm512_mul_ps(d, q0), _mm512_loadu_ps(xi + b * 32), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_mul_ps(d, q1), _mm512_loadu_ps(xi + b * 32 + 16), acc1);
      }
      y[i * n + j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + (bias ? bias[j] : 0.0f);
    }
  }
}

}  // namespace

void F16ToF32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, LoadF16(src + i));
  if (i < n) _mm512_mask_storeu_ps(dst + i, TailMask16(n - i), LoadF16Part(src + i, TailMask16(n - i)));
}

void Bf16ToF32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, LoadBf16(src + i));
  if (i < n) _mm512_mask_storeu_ps(dst + i, TailMask16(n - i), LoadBf16Part(src + i, TailMask16(n - i)));
}

void F32ToBf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), F32ToBf16x16(_mm512_loadu_ps(src + i)));
  if (i < n) {
    const __mmask16 m = TailMask16(n - i);
    _mm256_mask_storeu_epi16(dst + i, m, F32ToBf16x16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

void F32ToF16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  if (i < n) {
    const __mmask16 m = TailMask16(n - i);
    _mm256_mask_storeu_epi16(dst + i, m,
                             _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

void RowToF32(DType dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::kF16: F16ToF32(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::kBF16: Bf16ToF32(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::kQ8_0: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (int64_t b = 0; b < n / 32; ++b, s += 34) {
        const __m512 d = _mm512_set1_ps(BlockScale(s));
        __m512 q0, q1;
        LoadQ8(s + 2, &q0, &q1);
        _mm512_storeu_ps(dst + b * 32, _mm512_mul_ps(d, q0));
        _mm512_storeu_ps(dst + b * 32 + 16, _mm512_mul_ps(d, q1));
      }
      return;
    }
    default: attic::ConvertToF32(dtype, src, dst, static_cast<size_t>(n)); return;
  }
}

// q8_0 uses x as is; the other dtypes a padded copy shifted to the rows' alignment
// (bf16: as bf16 for vdpbf16ps, or f32 even/odd permuted without AVX512-BF16; the
// returned pointer is then only meaningful to Gemv).
namespace {

const float* PrepareImpl(const WeightTensor& w, const float* x, int64_t m, AlignedBuffer* scratch, bool dot) {
  if (qpack::IsPacked(w, Isa::kAvx512)) return vnni::QuantizeX(x, m, w.cols(), scratch);
  if (w.dtype == DType::kQ8_0) return x;
  if (UsesQuantDot(w.dtype))
    return GetCpuFeatures().avx512_vnni ? vnni::QuantizeX(x, m, w.cols(), scratch) : QuantizeX(x, m, w.cols(), scratch);
  const bool packed = IsPrepackedDense(w);  // panels: x unshifted, in natural order
  const int64_t k = w.cols(), shift = packed ? 0 : RowShift(w);
  if (w.dtype == DType::kBF16 && dot) {
    scratch->Reserve(static_cast<size_t>(m * PadK(k + shift)) * 2);
    PrepareXBf16(x, m, k, shift, scratch->as<uint16_t>());
    return scratch->as<float>();
  }
  scratch->Reserve(static_cast<size_t>(m * PadK(k + shift)) * 4);
  PrepareX(x, m, k, shift, w.dtype == DType::kBF16 && !packed, scratch->as<float>());
  return scratch->as<float>();
}

void GemvImpl(const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
              int64_t n1, bool dot) {
  if (qpack::IsPacked(w, Isa::kAvx512)) {
    vnni::GemvPackedQuant(x, m, w, bias, y, n0, n1);
    return;
  }
  switch (w.dtype) {
    case DType::kF32: GemvTyped<F32W>(x, m, w, bias, y, n0, n1); return;
    case DType::kBF16:
      if (IsPrepackedBf16(w)) {
        GemvPackedBf16(x, m, w, bias, y, n0, n1, dot);
      } else if (dot) {
        GemvBf16Dot(reinterpret_cast<const uint16_t*>(x), m, w, bias, y, n0, n1);
      } else {
        GemvTyped<Bf16W>(x, m, w, bias, y, n0, n1);
      }
      return;
    case DType::kF16:
      if (IsPrepackedF16(w)) {
        GemvPackedF16(x, m, w, bias, y, n0, n1);
      } else {
        GemvTyped<F16W>(x, m, w, bias, y, n0, n1);
      }
      return;
    case DType::kQ8_0: GemvQ8(x, m, w, bias, y, n0, n1); return;
    default:
      if (GetCpuFeatures().avx512_vnni) {
        vnni::GemvQuant(x, m, w, bias, y, n0, n1);
      } else {
        avx2::GemvQuant(x, m, w, bias, y, n0, n1);
      }
      return;
  }
}

}  // namespace

const float* GemvPrepare(const WeightTensor& w, const float* x, int64_t m, AlignedBuffer* scratch) {
  return PrepareImpl(w, x, m, scratch, UseBf16Dot());
}

const float* GemvPrepareFma(const WeightTensor& w, const float* x, int64_t m, AlignedBuffer* scratch) {
  return PrepareImpl(w, x, m, scratch, false);
}

// -1: block-quantized weights' x (8-bit blocks, QuantizeX; also a prepacked q8_0's);
// -2: a prepacked bf16 or f16 weight's x (no shift, natural order). Neither is shared
// with a row-major weight.
int64_t GemvLayout(const WeightTensor& w) {
  if (UsesQuantDot(w.dtype) || qpack::IsPacked(w, Isa::kAvx512)) return -1;
  return IsPrepackedDense(w) ? -2 : RowShift(w);
}

void SetBf16GemvDotDisabledForTesting(bool disabled) { g_bf16_dot_disabled.store(disabled); }
bool Bf16GemvUsesDot() { return UseBf16Dot(); }

void Gemv(const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0, int64_t n1) {
  GemvImpl(x, m, w, bias, y, n0, n1, UseBf16Dot());
}

void GemvFma(const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
             int64_t n1) {
  GemvImpl(x, m, w, bias, y, n0, n1, false);
}

void RmsNormRow(const float* x, const float* weight, int64_t n, float eps, float* out) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
    a0 = _mm512_fmadd_ps(v0, v0, a0);
    a1 = _mm512_fmadd_ps(v1, v1, a1);
  }
  for (; i < n; i += 16) {
    __m512 v = _mm512_maskz_loadu_ps(TailMask16(n - i), x + i);
    a0 = _mm512_fmadd_ps(v, v, a0);
  }
  const double ss = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  const __m512 s = _mm512_set1_ps(static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps)));
  for (i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), s), _mm512_loadu_ps(weight + i)));
  if (i < n) {
    const __mmask16 m = TailMask16(n - i);
    _mm512_mask_storeu_ps(out + i, m,
                          _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s), _mm512_maskz_loadu_ps(m, weight + i)));
  }
}

namespace {
inline __m512 SiluMul16(__m512 g, __m512 u) {
  __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}
}  // namespace

void SiluMul(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(gate + i, SiluMul16(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  if (i < n) {
    const __mmask16 m = TailMask16(n - i);
    _mm512_mask_storeu_ps(gate + i, m, SiluMul16(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void Add(float* x, const float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = TailMask16(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  __m512 mv = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
  if (i < n) mv = _mm512_mask_max_ps(mv, TailMask16(n - i), mv, _mm512_maskz_loadu_ps(TailMask16(n - i), x + i));
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 sv = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    __m512 e = Exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), mx));
    _mm512_storeu_ps(x + i, e);
    sv = _mm512_add_ps(sv, e);
  }
  if (i < n) {
    const __mmask16 m = TailMask16(n - i);
    __m512 e = _mm512_maskz_mov_ps(m, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mx)));
    _mm512_mask_storeu_ps(x + i, m, e);
    sv = _mm512_add_ps(sv, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sv));
  for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  if (i < n) {
    const __mmask16 m = TailMask16(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
  }
}

}  // namespace attic::backend::cpu::avx512
