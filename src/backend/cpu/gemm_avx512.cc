// AVX-512 GEMM for prefill: y[m, n] = x[m, k] W[n, k]^T (+ bias).
//
// Goto/BLIS structure. The output columns (weight rows) are cut into tasks of up to
// kMaxTaskPanels panels of kNR = 48 rows, claimed dynamically by the pool threads. A task
// packs its weight rows one k block at a time into k-major panels (one 64-byte load =
// 16 outputs' weights; 16x16 transposes in registers), then sweeps all x rows over them
// with a kMR x kNR = 8 x 48 register-blocked micro-kernel (24 accumulators hide the FMA
// latency). The weights are read from the mapped file exactly once per call; x is re-read
// from cache. Measured (2 threads, Zen 5): ~720-800 GFLOP/s bf16, ~380-450 f32 path, vs
// oneDNN 2.6 bf16 matmul ~650-790 and OpenBLAS sgemm ~205.
//
// Prepacked weights (PrepackBf16): a bf16 matrix packed once at load, panel after panel
// ([panel][ceil(k/2)][kNR] pairs, the k blocks of a panel consecutive), lets a call skip
// PackPanelBf16 -- at m ~ 32-64 that packing costs about as much as the products. Same
// panels, same micro-kernel, same order: bit-identical results.
// Prepacked f16 (PrepackF16): [panel][k][kNR] f16, the f32 path's panel layout kept in
// f16 (exact: every value is an f16), widened by the micro-kernel as it loads a panel
// row; the same values in the same order as packing per call: bit-identical too.
//
// Two micro-kernels:
//  - f32: weights (f32, f16, bf16 without AVX512-BF16, q8_0) widened to f32 while packing,
//    FMA with f32 x: true f32 math (within ~1e-6 relative of double).
//  - bf16 (bf16 weights on CPUs with AVX512-BF16): x rounded to bf16 once per call,
//    weights packed as k-pairs, vdpbf16ps (2x the FMA rate). Products are exact in f32
//    and accumulated in f32; the only extra error is x's bf16 rounding (<= 2^-9 relative
//    per element, so <= 2^-9 * sum|x*w| per output, ~1e-4 of it typically), the trade
//    llama.cpp makes for bf16 weights too.
#include <algorithm>
#include <cstring>
#include <vector>

#include "attic/backend/cpu_features.h"
#include "attic/tensor/buffer.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/qdot.h"
#include "backend/cpu/qpack.h"
#include "backend/cpu/simd_avx512.h"

namespace attic::backend::cpu::avx512 {

namespace {

constexpr int kMR = 8;         // x rows per micro-kernel
constexpr int kNV = 3;         // 16-lane output vectors per micro-kernel
constexpr int kNR = 16 * kNV;  // weight rows per packed panel
static_assert(kNR == kPackedPanelRows);

// Cache blocking (per task; tuned with bench/kernels_bench.cc on the model shapes). k is
// cut into equal blocks of at most kKc (so k = 576 is one block: +15-20% over 512 + 64);
// a task packs up to kMaxTaskPanels panels per k block (<= 8 x 48 x 768 x 4 = 1.2 MB)
// and sweeps x over them kMc rows at a time.
constexpr int64_t kKcF32 = 768;
constexpr int64_t kKcBf16 = 768;
constexpr int64_t kMaxTaskPanels = 8;
constexpr int64_t kMc = 128;
constexpr int64_t kPackPrefetchBytes = 512;  // per weight-row stream while packing

inline __mmask16 ColMask(int64_t n_valid, int v) {
  int64_t r = n_valid - 16 * v;
  return r <= 0 ? __mmask16(0) : TailMask16(r);
}

// Writes (first k block) or accumulates (later blocks) an MR x kNR tile.
template <int MR>
inline void StoreTile(__m512 (&acc)[MR][kNV], float* c, int64_t ldc, int64_t n_valid, bool first,
                      const float* bias) {
  __mmask16 mask[kNV];
  __m512 bv[kNV];
  ATTIC_UNROLL
  for (int v = 0; v < kNV; ++v) {
    mask[v] = ColMask(n_valid, v);
    bv[v] = first && bias ? _mm512_maskz_loadu_ps(mask[v], bias + 16 * v) : _mm512_setzero_ps();
  }
  ATTIC_UNROLL
  for (int i = 0; i < MR; ++i) {
    ATTIC_UNROLL
    for (int v = 0; v < kNV; ++v) {
      float* p = c + i * ldc + 16 * v;
      __m512 old = first ? bv[v] : _mm512_maskz_loadu_ps(mask[v], p);
      _mm512_mask_storeu_ps(p, mask[v], _mm512_add_ps(acc[i][v], old));
    }
  }
}

// ---- f32 path -------------------------------------------------------------------------

// c[MR, kNR] (+)= a[MR, kc] * panel; a rows have stride lda; panel is [kc][kNR] f32, or
// f16 (kF16Panel: a prepacked f16 weight's panel, widened as it is loaded: the same f32
// values, so the same bits).
template <int MR, bool kF16Panel>
void MicroF32(const float* a, int64_t lda, const void* b, int64_t kc, float* c, int64_t ldc, int64_t n_valid,
              bool first, const float* bias) {
  __m512 acc[MR][kNV];
  ATTIC_UNROLL
  for (int i = 0; i < MR; ++i)
    ATTIC_UNROLL
    for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < kc; ++kk) {
    __m512 bv[kNV];
    ATTIC_UNROLL
    for (int v = 0; v < kNV; ++v) {
      if constexpr (kF16Panel) {
        const uint16_t* bp = static_cast<const uint16_t*>(b) + kk * kNR;
        bv[v] = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(bp + 16 * v)));
      } else {
        bv[v] = _mm512_load_ps(static_cast<const float*>(b) + kk * kNR + 16 * v);
      }
    }
    ATTIC_UNROLL
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a[i * lda + kk]);
      ATTIC_UNROLL
      for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
    }
  }
  StoreTile<MR>(acc, c, ldc, n_valid, first, bias);
}

using MicroF32Fn = void (*)(const float*, int64_t, const void*, int64_t, float*, int64_t, int64_t, bool, const float*);
template <bool kF16Panel>
constexpr MicroF32Fn kMicroF32[kMR + 1] = {nullptr,
                                           MicroF32<1, kF16Panel>,
                                           MicroF32<2, kF16Panel>,
                                           MicroF32<3, kF16Panel>,
                                           MicroF32<4, kF16Panel>,
                                           MicroF32<5, kF16Panel>,
                                           MicroF32<6, kF16Panel>,
                                           MicroF32<7, kF16Panel>,
                                           MicroF32<8, kF16Panel>};

// Loaders for packing: 16 consecutive weights of a row, starting at element kk (a
// multiple of 16), widened to f32; lanes outside `mask` are 0.
struct PackF32 {
  static int64_t Offset(int64_t kk) { return kk * 4; }  // byte offset of element kk
  static __m512 Load16(const uint8_t* row, int64_t kk, __mmask16 mask) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(row) + kk);
  }
};
struct PackF16 {
  static int64_t Offset(int64_t kk) { return kk * 2; }
  static __m512 Load16(const uint8_t* row, int64_t kk, __mmask16 mask) {
    return LoadF16Part(reinterpret_cast<const uint16_t*>(row) + kk, mask);
  }
};
struct PackBf16AsF32 {
  static int64_t Offset(int64_t kk) { return kk * 2; }
  static __m512 Load16(const uint8_t* row, int64_t kk, __mmask16 mask) {
    return LoadBf16Part(reinterpret_cast<const uint16_t*>(row) + kk, mask);
  }
};
struct PackQ8 {  // q8_0 blocks of 32: f16 scale + 32 int8; kk selects block and half
  static int64_t Offset(int64_t kk) { return kk / 32 * 34; }
  static __m512 Load16(const uint8_t* row, int64_t kk, __mmask16 mask) {
    const uint8_t* blk = row + (kk / 32) * 34;
    uint16_t d16;
    std::memcpy(&d16, blk, 2);
    const __m128i q = _mm_maskz_loadu_epi8(mask, blk + 2 + (kk & 16));
    return _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(d16)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
  }
};

// panel[kk * kNR + j] = f32(W[n0 + j, k0 + kk]) for j < n_valid, 0 for n_valid <= j < kNR:
// 16 rows x 16 k at a time, widened and transposed in registers. REQUIRES (q8_0): k0 a
// multiple of 32.
template <class L>
void PackPanelF32T(const WeightTensor& w, int64_t n0, int64_t n_valid, int64_t k0, int64_t kc, float* panel) {
  const int64_t k = w.cols();
  const size_t row_bytes = DTypeBytes(w.dtype, static_cast<size_t>(k));
  const uint8_t* base = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(n0) * row_bytes;
  for (int64_t jb = 0; jb < kNR; jb += 16) {
    const int64_t rows = std::clamp<int64_t>(n_valid - jb, 0, 16);
    const uint8_t* rp[16];
    for (int64_t jj = 0; jj < 16; ++jj)
      rp[jj] = base + static_cast<size_t>(jb + std::max<int64_t>(0, std::min(jj, rows - 1))) * row_bytes;
    for (int64_t kb = 0; kb < kc; kb += 16) {
      const int64_t kk = k0 + kb;
      const __mmask16 mask = TailMask16(k - kk);
      __m512i r[16];
      ATTIC_UNROLL
      for (int jj = 0; jj < 16; ++jj) {
        _mm_prefetch(reinterpret_cast<const char*>(rp[jj] + L::Offset(kk)) + kPackPrefetchBytes, _MM_HINT_T0);
        r[jj] = jj < rows ? _mm512_castps_si512(L::Load16(rp[jj], kk, mask)) : _mm512_setzero_si512();
      }
      Transpose16x16(r);
      const int64_t nq = std::min<int64_t>(16, kc - kb);
      for (int64_t q = 0; q < nq; ++q) _mm512_store_si512(panel + (kb + q) * kNR + jb, r[q]);
    }
  }
}

void PackPanelF32(const WeightTensor& w, int64_t n0, int64_t n_valid, int64_t k0, int64_t kc, float* panel) {
  switch (w.dtype) {
    case DType::kF32: PackPanelF32T<PackF32>(w, n0, n_valid, k0, kc, panel); return;
    case DType::kF16: PackPanelF32T<PackF16>(w, n0, n_valid, k0, kc, panel); return;
    case DType::kBF16: PackPanelF32T<PackBf16AsF32>(w, n0, n_valid, k0, kc, panel); return;
    case DType::kQ8_0: PackPanelF32T<PackQ8>(w, n0, n_valid, k0, kc, panel); return;
    default: ATTIC_CHECK(false && "block types take SgemmFallback"); return;
  }
}

// ---- bf16 path ------------------------------------------------------------------------

// c[MR, kNR] (+)= a[MR, 2*kp] * panel; a holds bf16 pairs (u32) with stride lda pairs;
// panel is [kp][kNR] bf16 pairs.
// Each step also prefetches pf + p * pf_step into L2 (the next panel's share of this
// pass, see GemmRange).
template <int MR>
void MicroBf16(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t kp, float* c, int64_t ldc, int64_t n_valid,
               bool first, const float* bias, const char* pf, int64_t pf_step) {
  __m512 acc[MR][kNV];
  ATTIC_UNROLL
  for (int i = 0; i < MR; ++i)
    ATTIC_UNROLL
    for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    _mm_prefetch(pf + p * pf_step, _MM_HINT_T1);
    const uint32_t* bp = b + p * kNR;
    __m512i bv[kNV];
    ATTIC_UNROLL
    for (int v = 0; v < kNV; ++v) bv[v] = _mm512_load_si512(bp + 16 * v);
    ATTIC_UNROLL
    for (int i = 0; i < MR; ++i) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(a[i * lda + p]));
      ATTIC_UNROLL
      for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)av, (__m512bh)bv[v]);
    }
  }
  StoreTile<MR>(acc, c, ldc, n_valid, first, bias);
}

using MicroBf16Fn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t, int64_t, bool,
                             const float*, const char*, int64_t);
constexpr MicroBf16Fn kMicroBf16[kMR + 1] = {nullptr,       MicroBf16<1>, MicroBf16<2>, MicroBf16<3>, MicroBf16<4>,
                                             MicroBf16<5>, MicroBf16<6>, MicroBf16<7>, MicroBf16<8>};

// panel[p * kNR + j] = (W[n0 + j, k0 + 2p], W[n0 + j, k0 + 2p + 1]) as a u32, zero past k
// and for j >= n_valid; 16 rows x 16 pairs at a time, transposed in registers. k0 is even.
void PackPanelBf16(const WeightTensor& w, int64_t n0, int64_t n_valid, int64_t k0, int64_t kp, uint32_t* panel) {
  const int64_t k = w.cols();
  const uint16_t* base = static_cast<const uint16_t*>(w.data) + n0 * k + k0;
  for (int64_t jb = 0; jb < kNR; jb += 16) {
    const int64_t rows = std::clamp<int64_t>(n_valid - jb, 0, 16);
    const uint16_t* rp[16];
    for (int64_t jj = 0; jj < 16; ++jj) rp[jj] = base + (jb + std::max<int64_t>(0, std::min(jj, rows - 1))) * k;
    for (int64_t p0 = 0; p0 < kp; p0 += 16) {
      const int64_t elems = k - k0 - 2 * p0;  // > 0
      const __mmask32 mask = elems >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << elems) - 1u);
      __m512i r[16];
      ATTIC_UNROLL
      for (int jj = 0; jj < 16; ++jj) {
        // 16 row streams: prefetch ahead so the loads below hit L1 (latency-bound otherwise).
        _mm_prefetch(reinterpret_cast<const char*>(rp[jj] + 2 * p0) + kPackPrefetchBytes, _MM_HINT_T0);
        r[jj] = jj < rows ? _mm512_maskz_loadu_epi16(mask, rp[jj] + 2 * p0) : _mm512_setzero_si512();
      }
      Transpose16x16(r);
      const int64_t nq = std::min<int64_t>(16, kp - p0);
      for (int64_t q = 0; q < nq; ++q) _mm512_store_si512(panel + (p0 + q) * kNR + jb, r[q]);
    }
  }
}

// ---- driver ---------------------------------------------------------------------------

// k block size: k cut into equal blocks of at most kc_max, rounded up to 32 (q8_0 blocks,
// bf16 pairs), so no block is a short remainder.
inline int64_t KBlock(int64_t k, int64_t kc_max) {
  const int64_t blocks = (k + kc_max - 1) / kc_max;
  return ((k + blocks - 1) / blocks + 31) & ~int64_t{31};
}

struct GemmArgs {
  const float* x;
  const uint32_t* xb;  // bf16 pairs of x, [m][lda_pairs] (bf16 path)
  int64_t lda_pairs;
  int64_t m, n, k;
  const WeightTensor* w;
  const float* bias;
  float* y;
};

// Computes output columns [n_begin, n_end) for all m rows: for each k block, packs the
// weight rows of the range into panels, then sweeps x over them kMc rows at a time.
// Panel p's k block starting at pair k0 / 2: in the call's pack buffer, or in the
// prepacked matrix (n_begin is a multiple of kNR).
template <bool kBf16>
void GemmRange(const GemmArgs& g, int64_t n_begin, int64_t n_end) {
  thread_local AlignedBuffer pack_buf;
  const int64_t kc_blk = KBlock(g.k, kBf16 ? kKcBf16 : kKcF32);
  const int64_t n_panels = (n_end - n_begin + kNR - 1) / kNR;
  const uint32_t* prepacked = kBf16 ? static_cast<const uint32_t*>(g.w->packed) : nullptr;
  const int64_t pairs = (g.k + 1) / 2;  // of a prepacked panel
  // A prepacked f16 weight (f32 path): panel p's k block at k0 is [kc][kNR] f16 at
  // ((n_begin / kNR + p) * k + k0) * kNR.
  const uint16_t* prepacked_f16 = !kBf16 && IsPrepackedF16(*g.w) ? static_cast<const uint16_t*>(g.w->packed) : nullptr;
  if (prepacked == nullptr && prepacked_f16 == nullptr)
    pack_buf.Reserve(static_cast<size_t>(n_panels * kNR * kc_blk) * 4);
  for (int64_t k0 = 0; k0 < g.k; k0 += kc_blk) {
    const int64_t kc = std::min(kc_blk, g.k - k0);
    const int64_t kp = (kc + 1) / 2;
    const int64_t panel_elems = (kBf16 ? kp : kc) * kNR;
    const bool first = k0 == 0;
    if (prepacked == nullptr && prepacked_f16 == nullptr) {
      for (int64_t p = 0; p < n_panels; ++p) {
        const int64_t nv = std::min<int64_t>(kNR, n_end - n_begin - p * kNR);
        if constexpr (kBf16) {
          PackPanelBf16(*g.w, n_begin + p * kNR, nv, k0, kp, pack_buf.as<uint32_t>() + p * panel_elems);
        } else {
          PackPanelF32(*g.w, n_begin + p * kNR, nv, k0, kc, pack_buf.as<float>() + p * panel_elems);
        }
      }
    }
    auto bf16_panel = [&](int64_t p) {
      if (prepacked != nullptr) return prepacked + ((n_begin / kNR + p) * pairs + k0 / 2) * kNR;
      return static_cast<const uint32_t*>(pack_buf.as<uint32_t>() + p * panel_elems);
    };
    // A prepacked panel is read from memory by the first x-row pass and from cache by
    // the others: at small m (few passes per panel) the passes stall on that stream. So
    // the passes over panel p prefetch panel p + 1 into L2, each pass its share (a
    // 30-row step of the 135M shape: 16.4 -> 15.4 ms, store_overlap_bench --history 24
    // --new 30). Many passes hide the stream by themselves.
    constexpr int64_t kMaxPrefetchPasses = 8;
    const int64_t panel_bytes = kp * kNR * 4;
    for (int64_t i0 = 0; i0 < g.m; i0 += kMc) {
      const int64_t i_end = std::min(g.m, i0 + kMc);
      const int64_t passes = (i_end - i0 + kMR - 1) / kMR;
      const int64_t pf_step = std::max<int64_t>(1, kNR * 4 / passes);
      for (int64_t p = 0; p < n_panels; ++p) {
        const int64_t jp = n_begin + p * kNR;
        const int64_t nv = std::min<int64_t>(kNR, n_end - jp);
        const float* bias = g.bias ? g.bias + jp : nullptr;
        const bool pf_next = prepacked != nullptr && p + 1 < n_panels && passes <= kMaxPrefetchPasses;
        for (int64_t i = i0; i < i_end; i += kMR) {
          const int mr = static_cast<int>(std::min<int64_t>(kMR, i_end - i));
          float* c = g.y + i * g.n + jp;
          if constexpr (kBf16) {
            const uint32_t* panel = bf16_panel(p);
            const char* pf = reinterpret_cast<const char*>(panel);  // cached already: a no-op
            int64_t step = 0;
            if (pf_next) {
              pf = reinterpret_cast<const char*>(bf16_panel(p + 1)) + (i - i0) / kMR * (panel_bytes / passes);
              step = pf_step;
            }
            kMicroBf16[mr](g.xb + i * g.lda_pairs + k0 / 2, g.lda_pairs, panel, kp, c, g.n, nv, first, bias, pf, step);
          } else if (prepacked_f16 != nullptr) {
            kMicroF32<true>[mr](g.x + i * g.k + k0, g.k, prepacked_f16 + ((n_begin / kNR + p) * g.k + k0) * kNR, kc, c,
                                g.n, nv, first, bias);
          } else {
            kMicroF32<false>[mr](g.x + i * g.k + k0, g.k, pack_buf.as<float>() + p * panel_elems, kc, c, g.n, nv, first,
                                 bias);
          }
        }
      }
    }
  }
}

// Every output's columns, in tasks of up to kMaxTaskPanels panels (RunPanelTasks).
template <bool kBf16>
void RunGemm(ThreadPool& pool, const GemmArgs* gs, int n_gs) {
  RunPanelTasks(pool, n_gs, [&](int i) { return gs[i].n; }, kNR, kMaxTaskPanels,
                [&](const RowRange& r) { GemmRange<kBf16>(gs[r.out], r.begin, r.end); });
}


// ---- GEMV over prepacked panels --------------------------------------------------------
// A decode step's GEMV (m = 1) is bound by how fast each thread streams weights. The
// row-major GEMV reads 4 rows at a time, 4 streams a row apart, which the prefetchers
// follow well below a single sequential stream's rate (Zen 5, 2 threads, a 256 MiB read:
// 35-40 GB/s against 45-54). A prepacked panel is one stream, kNR rows' weights side by
// side for each k (bf16: [pairs][kNR] u32 k-pairs; f16: [k][kNR]), so the GEMV walks each
// panel front to back and keeps kNR rows' sums in lanes (no horizontal reduction).
//   kDot:  bf16; x as bf16 pairs ([m][ldx] u32, PrepareXBf16's layout), vdpbf16ps (x
//          rounded to bf16: the row-major dot form's arithmetic, in another order).
//   kFma:  bf16; x as f32 ([m][ldx] floats, zero past k), weights widened exactly, two
//          FMAs per pair: true f32 math.
//   kF16:  f16; x as for kFma, each k's kNR weights widened exactly (vcvtph2ps), one FMA:
//          true f32 math.
// Two accumulator sets (even / odd steps) halve the dependency chains; a row's sum is
// (even steps) + (odd steps) for every m, so its bits do not depend on the other rows.
enum class PackedForm { kDot, kFma, kF16 };

template <PackedForm kForm, int MB>
inline void PackedGemvPanel(const void* panel, int64_t steps, const void* xv, int64_t ldx, float* out) {
  __m512 acc[2][MB][kNV];
  ATTIC_UNROLL
  for (int s = 0; s < 2; ++s)
    ATTIC_UNROLL
    for (int i = 0; i < MB; ++i)
      ATTIC_UNROLL
      for (int v = 0; v < kNV; ++v) acc[s][i][v] = _mm512_setzero_ps();
  auto step = [&](int s, int64_t q) __attribute__((always_inline)) {
    if constexpr (kForm == PackedForm::kF16) {
      const uint16_t* wp = static_cast<const uint16_t*>(panel) + q * kNR;
      const float* x = static_cast<const float*>(xv);
      __m512 w[kNV];
      ATTIC_UNROLL
      for (int v = 0; v < kNV; ++v)
        w[v] = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(wp + 16 * v)));
      ATTIC_UNROLL
      for (int i = 0; i < MB; ++i) {
        const __m512 xq = _mm512_set1_ps(x[i * ldx + q]);
        ATTIC_UNROLL
        for (int v = 0; v < kNV; ++v) acc[s][i][v] = _mm512_fmadd_ps(w[v], xq, acc[s][i][v]);
      }
      return;
    }
    __m512i w[kNV];
    ATTIC_UNROLL
    for (int v = 0; v < kNV; ++v) w[v] = _mm512_load_si512(static_cast<const uint32_t*>(panel) + q * kNR + 16 * v);
    if constexpr (kForm == PackedForm::kDot) {
      const uint32_t* x = static_cast<const uint32_t*>(xv);
      ATTIC_UNROLL
      for (int i = 0; i < MB; ++i) {
        const __m512i xq = _mm512_set1_epi32(static_cast<int>(x[i * ldx + q]));
        ATTIC_UNROLL
        for (int v = 0; v < kNV; ++v) acc[s][i][v] = _mm512_dpbf16_ps(acc[s][i][v], (__m512bh)xq, (__m512bh)w[v]);
      }
    } else {
      const float* x = static_cast<const float*>(xv);
      __m512 even[kNV], odd[kNV];
      ATTIC_UNROLL
      for (int v = 0; v < kNV; ++v) {
        even[v] = _mm512_castsi512_ps(_mm512_slli_epi32(w[v], 16));
        odd[v] = _mm512_castsi512_ps(_mm512_and_si512(w[v], _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
      }
      ATTIC_UNROLL
      for (int i = 0; i < MB; ++i) {
        const __m512 x0 = _mm512_set1_ps(x[i * ldx + 2 * q]), x1 = _mm512_set1_ps(x[i * ldx + 2 * q + 1]);
        ATTIC_UNROLL
        for (int v = 0; v < kNV; ++v)
          acc[s][i][v] = _mm512_fmadd_ps(odd[v], x1, _mm512_fmadd_ps(even[v], x0, acc[s][i][v]));
      }
    }
  };
  int64_t q = 0;
  for (; q + 2 <= steps; q += 2) {
    step(0, q);
    step(1, q + 1);
  }
  if (q < steps) step(0, q);
  ATTIC_UNROLL
  for (int i = 0; i < MB; ++i)
    ATTIC_UNROLL
    for (int v = 0; v < kNV; ++v) _mm512_store_ps(out + i * kNR + 16 * v, _mm512_add_ps(acc[0][i][v], acc[1][i][v]));
}

template <PackedForm kForm>
void GemvPackedT(const void* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                 int64_t n1) {
  ATTIC_CHECK(n0 % kNR == 0);
  constexpr bool kDot = kForm == PackedForm::kDot;
  const int64_t n = w.rows(), k = w.cols();
  const int64_t steps = kForm == PackedForm::kF16 ? k : (k + 1) / 2;  // k or k-pairs a panel row
  const int64_t panel_bytes = steps * kNR * (kForm == PackedForm::kF16 ? 2 : 4);
  const int64_t ld = (k + 31) & ~int64_t{31};  // x's row stride in elements (bf16 or f32)
  const int64_t ldx = kDot ? ld / 2 : ld;       // ... in the kernel's units (u32 pairs or floats)
  const char* packed = static_cast<const char*>(w.packed);
  alignas(64) float out[4 * kNR];
  for (int64_t j0 = n0; j0 < n1; j0 += kNR) {
    const char* panel = packed + (j0 / kNR) * panel_bytes;
    const int64_t nv = std::min<int64_t>(kNR, n1 - j0);
    for (int64_t i = 0; i < m; i += 4) {
      const int64_t mb = std::min<int64_t>(4, m - i);
      const void* xi = kDot ? static_cast<const void*>(static_cast<const uint32_t*>(xp) + i * ldx)
                            : static_cast<const void*>(static_cast<const float*>(xp) + i * ldx);
      switch (mb) {
        case 1: PackedGemvPanel<kForm, 1>(panel, steps, xi, ldx, out); break;
        case 2: PackedGemvPanel<kForm, 2>(panel, steps, xi, ldx, out); break;
        case 3: PackedGemvPanel<kForm, 3>(panel, steps, xi, ldx, out); break;
        default: PackedGemvPanel<kForm, 4>(panel, steps, xi, ldx, out); break;
      }
      for (int64_t ii = 0; ii < mb; ++ii)
        for (int64_t r = 0; r < nv; ++r) y[(i + ii) * n + j0 + r] = out[ii * kNR + r] + (bias ? bias[j0 + r] : 0.0f);
    }
  }
}

}  // namespace

bool CanPrepackBf16(const WeightTensor& w) {
  return w.dtype == DType::kBF16 && w.shape.size() == 2 && w.rows() > 0 && GetCpuFeatures().avx512_bf16;
}

uint64_t PrepackedBf16Bytes(const WeightTensor& w) {
  const int64_t panels = (w.rows() + kNR - 1) / kNR;
  return static_cast<uint64_t>(panels * ((w.cols() + 1) / 2) * kNR) * 4;
}

void PrepackBf16(ThreadPool& pool, const WeightTensor& w, void* out) {
  const int64_t n = w.rows(), pairs = (w.cols() + 1) / 2, panels = (n + kNR - 1) / kNR;
  uint32_t* dst = static_cast<uint32_t*>(out);
  pool.ParallelFor(panels, [&](int64_t p, int) {
    PackPanelBf16(w, p * kNR, std::min<int64_t>(kNR, n - p * kNR), 0, pairs, dst + p * pairs * kNR);
  });
}

bool IsPrepackedBf16(const WeightTensor& w) {
  return w.dtype == DType::kBF16 && w.packed != nullptr && w.packed_layout == static_cast<int>(Isa::kAvx512);
}

void GemvPackedBf16(const void* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                    int64_t n1, bool dot) {
  if (dot) {
    GemvPackedT<PackedForm::kDot>(xp, m, w, bias, y, n0, n1);
  } else {
    GemvPackedT<PackedForm::kFma>(xp, m, w, bias, y, n0, n1);
  }
}

bool CanPrepackF16(const WeightTensor& w) { return w.dtype == DType::kF16 && w.shape.size() == 2 && w.rows() > 0; }

uint64_t PrepackedF16Bytes(const WeightTensor& w) {
  const int64_t panels = (w.rows() + kNR - 1) / kNR;
  return static_cast<uint64_t>(panels * w.cols() * kNR) * 2;
}

void PrepackF16(ThreadPool& pool, const WeightTensor& w, void* out) {
  const int64_t n = w.rows(), k = w.cols(), panels = (n + kNR - 1) / kNR;
  uint16_t* dst = static_cast<uint16_t*>(out);
  pool.ParallelFor(panels, [&](int64_t p, int) {
    // The f32 path's panel (what a call would pack), one k block at a time, narrowed back
    // to f16: exact, every value came from an f16. The scratch is one block (<= 144 KiB).
    // (Allocated by the threads that pack, not in every thread's static TLS.)
    thread_local AlignedBuffer scratch;
    scratch.Reserve(static_cast<size_t>(kKcF32 * kNR) * 4);
    float* f32 = scratch.as<float>();
    const int64_t nv = std::min<int64_t>(kNR, n - p * kNR);
    for (int64_t k0 = 0; k0 < k; k0 += kKcF32) {
      const int64_t kc = std::min(kKcF32, k - k0);
      PackPanelF32T<PackF16>(w, p * kNR, nv, k0, kc, f32);
      F32ToF16(f32, dst + (p * k + k0) * kNR, kc * kNR);
    }
  });
}

bool IsPrepackedF16(const WeightTensor& w) {
  return w.dtype == DType::kF16 && w.packed != nullptr && w.packed_layout == static_cast<int>(Isa::kAvx512);
}

void GemvPackedF16(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                   int64_t n1) {
  GemvPackedT<PackedForm::kF16>(xp, m, w, bias, y, n0, n1);
}

bool CanPrepackDense(const WeightTensor& w) { return CanPrepackBf16(w) || CanPrepackF16(w); }

bool IsPrepackedDense(const WeightTensor& w) { return IsPrepackedBf16(w) || IsPrepackedF16(w); }

uint64_t PrepackedDenseBytes(const WeightTensor& w) {
  return w.dtype == DType::kF16 ? PrepackedF16Bytes(w) : PrepackedBf16Bytes(w);
}

void PrepackDense(ThreadPool& pool, const WeightTensor& w, void* out) {
  if (w.dtype == DType::kF16) {
    PrepackF16(pool, w, out);
  } else {
    PrepackBf16(pool, w, out);
  }
}

void GemmMulti(ThreadPool& pool, const float* x, int64_t m, const LinearOutput* outs, int n_outs) {
  ATTIC_CHECK(n_outs >= 1 && n_outs <= kMaxGemmOuts);
  const WeightTensor& w0 = *outs[0].w;
  if (UsesQuantDot(w0.dtype)) {  // block-quantized weights: tiles widened per call, OpenBLAS
    for (int i = 0; i < n_outs; ++i) SgemmFallback(Avx512Table(), pool, x, m, *outs[i].w, outs[i].bias, outs[i].y);
    return;
  }
  const bool bf16 = w0.dtype == DType::kBF16 && GetCpuFeatures().avx512_bf16;
  GemmArgs gs[kMaxGemmOuts];
  for (int i = 0; i < n_outs; ++i) {
    const WeightTensor& w = *outs[i].w;
    ATTIC_CHECK(w.dtype == w0.dtype && w.cols() == w0.cols());
    // The f32 path reads a prepacked f16 weight's panels; it packs q8_0 from the data.
    ATTIC_CHECK(bf16 || w.packed == nullptr || qpack::IsPacked(w, Isa::kAvx512) || IsPrepackedF16(w));
    gs[i] = GemmArgs{x, nullptr, 0, m, w.rows(), w.cols(), &w, outs[i].bias, outs[i].y};
  }
  if (!bf16) {
    RunGemm<false>(pool, gs, n_outs);
    return;
  }
  // x rounded to bf16 pairs once for every output; on the calling thread when it is
  // small (a short chunk's rows): a pool dispatch would cost more than the conversion.
  thread_local AlignedBuffer xb_buf;
  const int64_t k = w0.cols(), lda_pairs = (k + 1) / 2;
  xb_buf.Reserve(static_cast<size_t>(m * lda_pairs) * 4);
  uint32_t* xb = xb_buf.as<uint32_t>();
  auto convert = [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      uint16_t* row = reinterpret_cast<uint16_t*>(xb + i * lda_pairs);
      F32ToBf16(x + i * k, row, k);
      if (k & 1) row[k] = 0;
    }
  };
  constexpr int64_t kInlineConvertElems = 1 << 16;
  if (m * k <= kInlineConvertElems) {
    convert(0, m, 0);
  } else {
    pool.ParallelRange(m, 1, convert);
  }
  for (int i = 0; i < n_outs; ++i) {
    gs[i].xb = xb;
    gs[i].lda_pairs = lda_pairs;
  }
  RunGemm<true>(pool, gs, n_outs);
}

void Gemm(ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y) {
  const LinearOutput out{&w, bias, y};
  GemmMulti(pool, x, m, &out, 1);
}

}  // namespace attic::backend::cpu::avx512
