// AVX2 GEMM for bf16 and f16 weights: y[m, n] = x[m, k] W[n, k]^T (+ bias), true f32 math.
//
// Why not OpenBLAS here: SgemmFallback widens each 128-row weight tile to f32 and hands
// it to sgemm, which packs it again, on every call; a `bench sessions` CA run spent 10%
// of its CPU in that widening, 10% in OpenBLAS's packing and 17% in its kernel (perf,
// AMD EPYC Zen 3). This GEMM reads bf16 panels packed once at load, and its kernel is as
// fast as OpenBLAS's on those shapes.
//
// Structure (the AVX-512 GEMM's, gemm_avx512.cc, narrowed to 8 lanes): output columns
// (weight rows) are cut into tasks of up to kMaxTaskPanels panels of kNR = 16 rows, claimed
// by the pool threads. A panel holds its 16 rows' 16-bit weights k-major ([k][16]): the
// micro-kernel widens 16 weights exactly in registers (bf16: zero-extend, shift, two
// instructions per 8; f16: vcvtph2ps, F16C) and does kMR x 16 FMAs per k with x
// broadcast from its rows (kMR = 6: 12 accumulators, all in registers). Each output is
// its own sum over k, in ascending order within k blocks of at most kKc (k cut into
// equal blocks, the blocks added in order): the same bits whatever m is and whichever
// rows share the call (row invariant, as the GEMV), and whether the panel was packed by
// this call or once at load (PrepackDense, backend::PrepackWeights). Within ~1e-6 relative of the float64 sum.
//
// Measured (`kernels_bench`, 135M shape, 2 threads, AMD EPYC Zen 3): m = 512, packed per
// call, 171 GFLOP/s against OpenBLAS-on-widened-tiles' 160; on prepacked weights it
// beats the AVX2 GEMV from m = 1 (w_up 81 vs 105 us), so prepacked weights take it for
// every m (kernel_table.cc).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "attic/tensor/buffer.h"
#include "backend/cpu/kernel_table.h"

#define ATTIC_UNROLL _Pragma("GCC unroll 32")  // see simd_avx512.h

namespace attic::backend::cpu::avx2 {

namespace {

constexpr int kMR = 6;   // x rows per micro-kernel
constexpr int kNR = 16;  // weight rows per panel (two 8-lane vectors)
// k blocks of at most kKc elements (k cut into equal blocks); a task packs up to
// kMaxTaskPanels panels per k block (<= 8 x 16 x 1024 x 2 B = 256 KB: L2) and sweeps x
// over them kMc rows at a time.
constexpr int64_t kKc = 1024;
constexpr int64_t kMaxTaskPanels = 8;
constexpr int64_t kMc = 96;

inline int64_t KBlock(int64_t k) {
  const int64_t blocks = (k + kKc - 1) / kKc;
  return (k + blocks - 1) / blocks;
}

// 8 weights of a panel row widened exactly: bf16 (zero-extend, shift) or f16 (vcvtph2ps).
template <bool kF16>
inline __m256 Widen8(const __m128i* p) {
  if constexpr (kF16) return _mm256_cvtph_ps(_mm_load_si128(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_load_si128(p)), 16));
}

// c[MR, nv] (+)= a[MR, kc] * panel (+ bias on the first block); a rows have stride lda;
// panel: [kc][kNR] bf16 or f16 (kF16), each widened exactly in registers.
template <int MR, bool kF16>
void Micro(const float* a, int64_t lda, const uint16_t* panel, int64_t kc, float* c, int64_t ldc, int64_t nv,
           bool first, const float* bias) {
  __m256 acc[MR][2];
  ATTIC_UNROLL
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m128i* bp = reinterpret_cast<const __m128i*>(panel + kk * kNR);
    const __m256 b0 = Widen8<kF16>(bp), b1 = Widen8<kF16>(bp + 1);
    ATTIC_UNROLL
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_broadcast_ss(a + i * lda + kk);
      acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
    }
  }
  if (nv == kNR) {
    __m256 bv0 = _mm256_setzero_ps(), bv1 = _mm256_setzero_ps();
    if (first && bias != nullptr) {
      bv0 = _mm256_loadu_ps(bias);
      bv1 = _mm256_loadu_ps(bias + 8);
    }
    ATTIC_UNROLL
    for (int i = 0; i < MR; ++i) {
      float* cp = c + i * ldc;
      const __m256 o0 = first ? bv0 : _mm256_loadu_ps(cp), o1 = first ? bv1 : _mm256_loadu_ps(cp + 8);
      _mm256_storeu_ps(cp, _mm256_add_ps(acc[i][0], o0));
      _mm256_storeu_ps(cp + 8, _mm256_add_ps(acc[i][1], o1));
    }
    return;
  }
  // A last panel narrower than kNR: through a tile (accumulators indexed by constants
  // only, so that they stay in registers in the loop above).
  alignas(32) float tile[MR][kNR];
  ATTIC_UNROLL
  for (int i = 0; i < MR; ++i) {
    _mm256_store_ps(tile[i], acc[i][0]);
    _mm256_store_ps(tile[i] + 8, acc[i][1]);
  }
  for (int i = 0; i < MR; ++i) {
    float* cp = c + i * ldc;
    for (int64_t j = 0; j < nv; ++j) cp[j] = tile[i][j] + (first ? (bias != nullptr ? bias[j] : 0.0f) : cp[j]);
  }
}

using MicroFn = void (*)(const float*, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t, bool, const float*);
template <bool kF16>
constexpr MicroFn kMicro[kMR + 1] = {nullptr,          Micro<1, kF16>, Micro<2, kF16>, Micro<3, kF16>,
                                     Micro<4, kF16>, Micro<5, kF16>, Micro<6, kF16>};

// r[j] (8 16-bit values of row j) -> r[q] (element q of rows 0-7), in registers.
inline void Transpose8x8Epi16(__m128i (&r)[8]) {
  const __m128i a0 = _mm_unpacklo_epi16(r[0], r[1]), a1 = _mm_unpackhi_epi16(r[0], r[1]);
  const __m128i a2 = _mm_unpacklo_epi16(r[2], r[3]), a3 = _mm_unpackhi_epi16(r[2], r[3]);
  const __m128i a4 = _mm_unpacklo_epi16(r[4], r[5]), a5 = _mm_unpackhi_epi16(r[4], r[5]);
  const __m128i a6 = _mm_unpacklo_epi16(r[6], r[7]), a7 = _mm_unpackhi_epi16(r[6], r[7]);
  const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
  const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
  const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
  const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
  r[0] = _mm_unpacklo_epi64(b0, b4);
  r[1] = _mm_unpackhi_epi64(b0, b4);
  r[2] = _mm_unpacklo_epi64(b1, b5);
  r[3] = _mm_unpackhi_epi64(b1, b5);
  r[4] = _mm_unpacklo_epi64(b2, b6);
  r[5] = _mm_unpackhi_epi64(b2, b6);
  r[6] = _mm_unpacklo_epi64(b3, b7);
  r[7] = _mm_unpackhi_epi64(b3, b7);
}

// panel[kk * kNR + j] = W[n0 + j, k0 + kk] for kk < kc; zero for j >= nv. A full panel
// goes 8 k at a time through two 8 x 8 transposes; the rest element by element.
void PackPanel(const WeightTensor& w, int64_t n0, int64_t nv, int64_t k0, int64_t kc, uint16_t* panel) {
  const int64_t k = w.cols();
  const uint16_t* base = static_cast<const uint16_t*>(w.data);
  const uint16_t* rows[kNR];
  for (int64_t j = 0; j < kNR; ++j) rows[j] = base + (n0 + std::min(j, nv - 1)) * k + k0;
  int64_t kk = 0;
  if (nv == kNR) {
    for (; kk + 8 <= kc; kk += 8) {
      __m128i lo[8], hi[8];
      for (int j = 0; j < 8; ++j) {
        lo[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + kk));
        hi[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[8 + j] + kk));
      }
      Transpose8x8Epi16(lo);
      Transpose8x8Epi16(hi);
      for (int q = 0; q < 8; ++q) {
        __m128i* out = reinterpret_cast<__m128i*>(panel + (kk + q) * kNR);
        _mm_storeu_si128(out, lo[q]);
        _mm_storeu_si128(out + 1, hi[q]);
      }
    }
  }
  for (; kk < kc; ++kk) {
    uint16_t* out = panel + kk * kNR;
    for (int64_t j = 0; j < kNR; ++j) out[j] = j < nv ? rows[j][kk] : 0;
  }
}

// Whether w's prepacked copy is in this GEMM's layout.
bool PrepackedBy(const WeightTensor& w) { return w.packed != nullptr && w.packed_layout == kPackedLayout; }

struct GemmArgs {
  const float* x;
  int64_t m, n, k;
  const WeightTensor* w;
  const float* bias;
  float* y;
};

// Output columns [n_begin, n_end) for all m rows: per k block, the range's panels (packed
// here, or prepacked), then x swept over them kMc rows at a time.
void GemmRange(const GemmArgs& g, int64_t n_begin, int64_t n_end) {
  thread_local AlignedBuffer pack_buf;
  const int64_t kc_blk = KBlock(g.k);
  const int64_t n_panels = (n_end - n_begin + kNR - 1) / kNR;
  const uint16_t* prepacked = PrepackedBy(*g.w) ? static_cast<const uint16_t*>(g.w->packed) : nullptr;
  const MicroFn* micro = g.w->dtype == DType::kF16 ? kMicro<true> : kMicro<false>;
  if (prepacked == nullptr) pack_buf.Reserve(static_cast<size_t>(n_panels * kNR * kc_blk) * 2);
  for (int64_t k0 = 0; k0 < g.k; k0 += kc_blk) {
    const int64_t kc = std::min(kc_blk, g.k - k0);
    const bool first = k0 == 0;
    if (prepacked == nullptr) {
      for (int64_t p = 0; p < n_panels; ++p)
        PackPanel(*g.w, n_begin + p * kNR, std::min<int64_t>(kNR, n_end - n_begin - p * kNR), k0, kc,
                  pack_buf.as<uint16_t>() + p * kc * kNR);
    }
    auto panel = [&](int64_t p) -> const uint16_t* {
      if (prepacked != nullptr) return prepacked + ((n_begin / kNR + p) * g.k + k0) * kNR;
      return pack_buf.as<uint16_t>() + p * kc * kNR;
    };
    for (int64_t i0 = 0; i0 < g.m; i0 += kMc) {
      const int64_t i_end = std::min(g.m, i0 + kMc);
      for (int64_t p = 0; p < n_panels; ++p) {
        const int64_t jp = n_begin + p * kNR;
        const int64_t nv = std::min<int64_t>(kNR, n_end - jp);
        const float* bias = g.bias ? g.bias + jp : nullptr;
        const uint16_t* b = panel(p);
        for (int64_t i = i0; i < i_end; i += kMR) {
          const int mr = static_cast<int>(std::min<int64_t>(kMR, i_end - i));
          micro[mr](g.x + i * g.k + k0, g.k, b, kc, g.y + i * g.n + jp, g.n, nv, first, bias);
        }
      }
    }
  }
}

// Every output's columns, in tasks of up to kMaxTaskPanels panels (RunPanelTasks).
void RunGemm(ThreadPool& pool, const GemmArgs* gs, int n_gs) {
  RunPanelTasks(pool, n_gs, [&](int i) { return gs[i].n; }, kNR, kMaxTaskPanels,
                [&](const RowRange& r) { GemmRange(gs[r.out], r.begin, r.end); });
}

}  // namespace

bool CanPrepackDense(const WeightTensor& w) {
  return (w.dtype == DType::kBF16 || w.dtype == DType::kF16) && w.shape.size() == 2 && w.rows() > 0;
}

uint64_t PrepackedDenseBytes(const WeightTensor& w) {
  const int64_t panels = (w.rows() + kNR - 1) / kNR;
  return static_cast<uint64_t>(panels * w.cols() * kNR) * 2;
}

void PrepackDense(ThreadPool& pool, const WeightTensor& w, void* out) {
  const int64_t n = w.rows(), k = w.cols(), panels = (n + kNR - 1) / kNR;
  uint16_t* dst = static_cast<uint16_t*>(out);
  pool.ParallelFor(panels, [&](int64_t p, int) {
    PackPanel(w, p * kNR, std::min<int64_t>(kNR, n - p * kNR), 0, k, dst + p * k * kNR);
  });
}

void GemmMulti(ThreadPool& pool, const float* x, int64_t m, const LinearOutput* outs, int n_outs) {
  ATTIC_CHECK(n_outs >= 1 && n_outs <= kMaxGemmOuts);
  const WeightTensor& w0 = *outs[0].w;
  if (w0.dtype != DType::kBF16 && w0.dtype != DType::kF16) {  // f32, q8_0: OpenBLAS on widened tiles
    for (int i = 0; i < n_outs; ++i) SgemmFallback(Avx2Table(), pool, x, m, *outs[i].w, outs[i].bias, outs[i].y);
    return;
  }
  GemmArgs gs[kMaxGemmOuts];
  for (int i = 0; i < n_outs; ++i) {
    const WeightTensor& w = *outs[i].w;
    ATTIC_CHECK(w.dtype == w0.dtype && w.cols() == w0.cols());
    gs[i] = GemmArgs{x, m, w.rows(), w.cols(), &w, outs[i].bias, outs[i].y};
  }
  RunGemm(pool, gs, n_outs);
}

void Gemm(ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y) {
  const LinearOutput out{&w, bias, y};
  GemmMulti(pool, x, m, &out, 1);
}

}  // namespace attic::backend::cpu::avx2
