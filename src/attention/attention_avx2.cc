// AVX2 attention kernels (compiled with -mavx2 -mfma -mf16c):
//
// - the vector-extension tile kernel with 8-float vectors (a*b+c contracts to FMA), for
//   prefill chunks and anything with more than a few rows per KV head;
// - DecodeKernel (<= 8 rows, head_dim % 8 == 0): row-major, vectorised over head_dim,
//   the AVX2 form of attention_avx512.cc's decode kernel. The tile kernel puts rows in
//   vector lanes, so a decode step (one query: `group` rows, 3 for SmolLM2) filled 3 of
//   8 lanes and loaded every K and V element as a broadcast scalar; here each K/V row is
//   loaded as whole vectors once per row of the tile, 8 dot products are reduced at once
//   by a horizontal-add tree, and 64 slots share one online-softmax step.
//   `attention_bench --only decode`, 2-core AMD EPYC (Zen 3), 2048 slots, ms per layer,
//   three alternating runs of each build (the machine busy with a compile): smollm2-135m
//   f32 0.40-0.54 -> 0.23-0.34, f16 0.25-0.42 -> 0.13-0.17; llama-1b f32 1.18-1.41 ->
//   0.63-0.70, f16 0.74-0.88 -> 0.36-0.43.
//
// AVX2 has 16 vector registers (AVX-512: 32), so the P V accumulation keeps at most 12
// accumulators live.
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "attention/attention_internal.h"
#include "attention/attention_vec_kernel.h"

namespace attic::attention::internal {
namespace {

constexpr int kDecodeRows = 8;
constexpr int kGroup = 8;               // slots per score vector
constexpr int kGroups = 8;              // score vectors per online-softmax step
constexpr int kDecodeChunk = kGroup * kGroups;

// 2^x for x <= 0 (the Cephes exp2f polynomial on [-0.5, 0.5], as VecTile's); 0 below
// -126 (including -inf, the mask value).
inline __m256 Exp2(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-126.0f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

// r[j] = horizontal sum of x[j], j < 8.
inline __m256 Reduce8(const __m256 (&x)[8]) {
  const __m256 t0 = _mm256_hadd_ps(x[0], x[1]), t1 = _mm256_hadd_ps(x[2], x[3]);
  const __m256 t2 = _mm256_hadd_ps(x[4], x[5]), t3 = _mm256_hadd_ps(x[6], x[7]);
  // u0: x[0..3]'s sums over lanes 0-3 in the low half, over lanes 4-7 in the high half.
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Horizontal max, broadcast to every lane.
inline __m256 BroadcastMax(__m256 x) {
  x = _mm256_max_ps(x, _mm256_permute2f128_ps(x, x, 0x01));
  x = _mm256_max_ps(x, _mm256_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm256_max_ps(x, _mm256_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));
}

inline float HorizontalSum(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Scores of slots first..first+7 at or past `lim` (not visible to the query row) set to
// -inf: the causal mask of a decode step's last piece.
[[gnu::always_inline]] inline __m256 MaskScores(__m256 s, int first, int lim, __m256i iota, __m256 neg_inf) {
  const __m256i ids = _mm256_add_epi32(_mm256_set1_epi32(first), iota);
  return _mm256_blendv_ps(neg_inf, s, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(lim), ids)));
}

// One online-softmax step of a query row over kDecodeChunk slots' scores s (log2 units),
// whatever type the keys were read from: the running max m moves to the step's, alpha is
// the factor the row's earlier sum and output are rescaled by, lsum takes the step's
// weights, which go to pbuf [kDecodeChunk] for the P V product.
[[gnu::always_inline]] inline void SoftmaxStep(const __m256 (&s)[kGroups], __m256& m, __m256& alpha, __m256& lsum, float* pbuf) {
  __m256 mx = m;
#pragma GCC unroll 8
  for (int gi = 0; gi < kGroups; ++gi) mx = _mm256_max_ps(mx, s[gi]);
  mx = BroadcastMax(mx);
  alpha = Exp2(_mm256_sub_ps(m, mx));
  m = mx;
  __m256 sum = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int gi = 0; gi < kGroups; ++gi) {
    const __m256 e = Exp2(_mm256_sub_ps(s[gi], mx));
    sum = _mm256_add_ps(sum, e);
    _mm256_store_ps(pbuf + gi * kGroup, e);
  }
  lsum = _mm256_fmadd_ps(lsum, alpha, sum);
}

// 8 K/V elements widened to f32: f32 rows as they are, f16 rows converted in the load.
inline __m256 LoadKv(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 LoadKv(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// P V for R rows over one 64-slot step, for VB vectors of head_dim starting at float
// `col`: ot[r][col..] = ot[r][col..] * alpha[r] + sum_j p[r][j] * V_j[col..]. JS x R x VB
// accumulators: at least 8 (FMA latency x 2 pipes), at most 12 (16 registers).
constexpr int DecodeVb(int rows, int dv) {
  int vb = dv;
  while (vb > 1 && vb * rows > 8) vb /= 2;
  return vb;
}
constexpr int DecodeJs(int rows, int vb) {  // a power of two, so it divides kGroup
  int js = 1;
  while (rows * vb * js < 8 && js < kGroup) js *= 2;
  return js;
}

// `between(gi)` runs before each group of slots (the step's spread prefetch).
template <int R, int VB, int JS, int kD, class T, class Between>
inline void AccumulateRows(float* ot, const float* p /*[R][kDecodeChunk]*/, const T* const* vr /*[kDecodeChunk]*/,
                           const __m256* alpha, int col, int d_runtime, const Between& between) {
  const int d = kD ? kD : d_runtime;
  __m256 acc[JS][R][VB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < VB; ++v) {
      acc[0][r][v] = _mm256_mul_ps(_mm256_load_ps(ot + r * d + 8 * v), alpha[r]);
#pragma GCC unroll 8
      for (int js = 1; js < JS; ++js) acc[js][r][v] = _mm256_setzero_ps();
    }
  }
  for (int gi = 0; gi < kGroups; ++gi) {
    between(gi);
    const T* const* vg = vr + gi * kGroup;
    const float* pg = p + gi * kGroup;
#pragma GCC unroll 8
    for (int j = 0; j < kGroup; j += JS) {
#pragma GCC unroll 8
      for (int js = 0; js < JS; ++js) {
        __m256 vv[VB];
        const T* row = vg[j + js] + col;
#pragma GCC unroll 8
        for (int v = 0; v < VB; ++v) vv[v] = LoadKv(row + 8 * v);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256 pr = _mm256_broadcast_ss(pg + r * kDecodeChunk + j + js);
#pragma GCC unroll 8
          for (int v = 0; v < VB; ++v) acc[js][r][v] = _mm256_fmadd_ps(pr, vv[v], acc[js][r][v]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < VB; ++v) {
      __m256 t = acc[0][r][v];
#pragma GCC unroll 8
      for (int js = 1; js < JS; ++js) t = _mm256_add_ps(t, acc[js][r][v]);
      _mm256_store_ps(ot + r * d + 8 * v, t);
    }
  }
}

// Row-major kernel for R rows (<= 8); kD = head_dim, or 0 for any multiple of 8. Each
// step takes 64 slots as 8 groups of 8, every K and V row read where it lies in the pool
// through a pointer per row (DecodeRows; a zero row past the last visible slot): an
// index list's scattered rows are not copied first. T: the KV element type (float, or
// uint16_t for f16, widened as it is loaded). q8_0 rows: DecodeKernelQ8T below.
template <int R, int kD, class T>
void DecodeKernelT(const AttendParams& p, const TileJob& job, float* o, float* m_out, float* l_out) {
  const int d = kD ? kD : p.shape.head_dim;
  const int dv = d / 8;
  float* qs = ThreadScratch(0, static_cast<size_t>(R) * d);
  float* ot = ThreadScratch(1, static_cast<size_t>(R) * d);
  constexpr bool f16 = sizeof(T) == 2;
  T* zero = reinterpret_cast<T*>(ThreadScratch(2, static_cast<size_t>(d)));
  std::fill(zero, zero + d, T{0});
  const T* k_pool = f16 ? reinterpret_cast<const T*>(p.kv.k_f16) : reinterpret_cast<const T*>(p.kv.k_pool);
  const T* v_pool = f16 ? reinterpret_cast<const T*>(p.kv.v_f16) : reinterpret_cast<const T*>(p.kv.v_pool);
  std::fill(ot, ot + static_cast<size_t>(R) * d, 0.0f);

  int32_t lim[R], min_lim, max_lim;
  LoadDecodeRows(p, job, R, qs, lim, &min_lim, &max_lim);
  __m256 m[R], lsum[R];
  for (int r = 0; r < R; ++r) {
    m[r] = _mm256_set1_ps(-FLT_MAX);
    lsum[r] = _mm256_setzero_ps();
  }

  const SlotMap map(p.kv, job.kv_head, d);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  alignas(32) float pbuf[R][kDecodeChunk];
  __m256 alpha[R];
  // The first step's rows now (the job before on this thread may have fetched them);
  // the next step's in (R + 1) x kGroups parts, one after each group of scores and of P V.
  PrefetchKvRows(p.kv, map, p.indices, job.slot_begin, std::min(max_lim, job.slot_begin + kDecodeChunk), d);
  StepPrefetch prefetch(p, job, map, max_lim, kDecodeChunk);
  constexpr int kParts = (R + 1) * kGroups;
  for (int c = job.slot_begin; c < max_lim; c += kDecodeChunk) {
    prefetch.Begin(c);
    const T* kr[kDecodeChunk];
    const T* vr[kDecodeChunk];
    DecodeRows<kGroup, kGroups>(p, map, c, max_lim, k_pool, v_pool, zero, kr, vr);
    const bool masked = c + kDecodeChunk > min_lim;
    for (int r = 0; r < R; ++r) {
      __m256 s[kGroups];
      for (int gi = 0; gi < kGroups; ++gi) {
        const T* const* k = kr + gi * kGroup;
        __m256 acc[kGroup];
#pragma GCC unroll 8
        for (int j = 0; j < kGroup; ++j) acc[j] = _mm256_setzero_ps();
        if constexpr (kD > 0) {
#pragma GCC unroll 16
          for (int v = 0; v < kD / 8; ++v) {
            const __m256 qv = _mm256_load_ps(qs + r * d + 8 * v);
#pragma GCC unroll 8
            for (int j = 0; j < kGroup; ++j) acc[j] = _mm256_fmadd_ps(qv, LoadKv(k[j] + 8 * v), acc[j]);
          }
        } else {
          for (int v = 0; v < dv; ++v) {
            const __m256 qv = _mm256_load_ps(qs + r * d + 8 * v);
#pragma GCC unroll 8
            for (int j = 0; j < kGroup; ++j) acc[j] = _mm256_fmadd_ps(qv, LoadKv(k[j] + 8 * v), acc[j]);
          }
        }
        s[gi] = Reduce8(acc);
        if (masked) s[gi] = MaskScores(s[gi], c + gi * kGroup, lim[r], iota, neg_inf);
        prefetch.Part(r * kGroups + gi, kParts);
      }
      SoftmaxStep(s, m[r], alpha[r], lsum[r], pbuf[r]);
    }
    // P V: the last kGroups parts, in the first pass over head_dim.
    for (int v0 = 0; v0 < dv;) {
      auto between = [&](int gi) {
        if (v0 == 0) prefetch.Part(R * kGroups + gi, kParts);
      };
      if constexpr (kD > 0) {
        constexpr int VB = DecodeVb(R, kD / 8);
        AccumulateRows<R, VB, DecodeJs(R, VB), kD, T>(ot + 8 * v0, pbuf[0], vr, alpha, 8 * v0, 0, between);
        v0 += VB;
      } else {
        AccumulateRows<R, 1, DecodeJs(R, 1), 0, T>(ot + 8 * v0, pbuf[0], vr, alpha, 8 * v0, d, between);
        ++v0;
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    std::copy_n(ot + r * d, d, o + static_cast<int64_t>(r) * d);
    m_out[r] = _mm256_cvtss_f32(m[r]);
    l_out[r] = HorizontalSum(lsum[r]);
  }
}

// ---------------------------------------------------------------------------------------
// q8_0 decode: the int8 rows read where they lie and widened to f32 in registers. Scores:
// each 32-value group's (the row's, below 32) partial dot product times its K scale. P V:
// the softmax weights multiplied by each slot's V group scale once per step (pq), so the
// loop is one convert and R FMAs per 8 values, as for f16.

// sc[g * kDecodeChunk + i] = scale g (as f32) of the q8_0 row of virtual slot c + i in
// `pool`, 0 past max_lim.
inline void StepScalesQ8(const AttendParams& p, const SlotMap& map, int c, int max_lim, const int8_t* pool, int ng,
                         float* sc) {
  const int n = std::clamp(max_lim - c, 0, kDecodeChunk);
  const int bs = map.block_size();
  for (int i = 0; i < n;) {
    const int32_t slot = p.indices ? p.indices[c + i] : c + i;
    const uint16_t* s = Q8Scales(pool, map.Q8ScaleOffset(slot));
    if (ng == 2 && p.indices == nullptr && i + 4 <= n && slot % bs + 4 <= bs) {
      // 4 rows' scales in one block: [r0 g0, r0 g1, r1 g0, ...] -> group-major.
      const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
      const __m256 t = _mm256_permutevar8x32_ps(x, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
      _mm_storeu_ps(sc + i, _mm256_castps256_ps128(t));
      _mm_storeu_ps(sc + kDecodeChunk + i, _mm256_extractf128_ps(t, 1));
      i += 4;
      continue;
    }
    for (int g = 0; g < ng; ++g) sc[g * kDecodeChunk + i] = _cvtsh_ss(s[g]);
    ++i;
  }
  for (int g = 0; g < ng; ++g) std::fill(sc + g * kDecodeChunk + n, sc + (g + 1) * kDecodeChunk, 0.0f);
}

inline __m256 LoadQ8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// AccumulateRows for q8_0 rows: pq [ng][R][kDecodeChunk] holds each row's weights times
// the V group scale of each slot. kQ4: q4_0 rows, each value read as its 4-bit code minus
// 8 (kv_q4.h; 32-value groups: values [32 g, 32 g + 16) are the low nibbles of bytes
// [16 g, 16 g + 16), the next 16 values their high nibbles).
template <int R, int VB, int JS, int kD, bool kQ4 = false>
inline void AccumulateRowsQ8(float* ot, const float* pq, const int8_t* const* vr, const __m256* alpha, int col,
                             int d_runtime = 0) {
  const int d = kD ? kD : d_runtime;
  const int group = KvQ8Group(d);
  const __m256i low = _mm256_set1_epi32(0xF), eight = _mm256_set1_epi32(8);
  const float* pv[VB];
#pragma GCC unroll 8
  for (int v = 0; v < VB; ++v) pv[v] = pq + (col + 8 * v) / group * (R * kDecodeChunk);
  __m256 acc[JS][R][VB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < VB; ++v) {
      acc[0][r][v] = _mm256_mul_ps(_mm256_load_ps(ot + r * d + 8 * v), alpha[r]);
#pragma GCC unroll 8
      for (int js = 1; js < JS; ++js) acc[js][r][v] = _mm256_setzero_ps();
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < kDecodeChunk; j += JS) {
#pragma GCC unroll 8
    for (int js = 0; js < JS; ++js) {
      __m256 vv[VB];
#pragma GCC unroll 8
      for (int v = 0; v < VB; ++v) {
        const int at = col + 8 * v;
        if constexpr (kQ4) {  // values [at, at + 8): bytes at / 32 * 16 + at % 16 on
          const uint8_t* row = reinterpret_cast<const uint8_t*>(vr[j + js]);  // the codes' bytes
          const __m256i b = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + at / 32 * 16 + at % 16)));
          const __m256i code = (at / 16) % 2 == 0 ? _mm256_and_si256(b, low) : _mm256_srli_epi32(b, 4);
          vv[v] = _mm256_cvtepi32_ps(_mm256_sub_epi32(code, eight));
        } else {
          vv[v] = LoadQ8(vr[j + js] + at);
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
        for (int v = 0; v < VB; ++v) {
          acc[js][r][v] = _mm256_fmadd_ps(_mm256_broadcast_ss(pv[v] + r * kDecodeChunk + j + js), vv[v], acc[js][r][v]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < VB; ++v) {
      __m256 t = acc[0][r][v];
#pragma GCC unroll 8
      for (int js = 1; js < JS; ++js) t = _mm256_add_ps(t, acc[js][r][v]);
      _mm256_store_ps(ot + r * d + 8 * v, t);
    }
  }
}

// DecodeKernelT's form for q8_0 rows (R <= 8 rows; kD = head_dim, or 0 for any supported
// multiple of 16). kV4: V in q4_0 (head_dim a multiple of 32), its rows and scales found
// by V's own SlotMap.
template <int R, int kD, bool kV4>
void DecodeKernelQ8T(const AttendParams& p, const TileJob& job, float* o, float* m_out, float* l_out) {
  const int d = kD ? kD : p.shape.head_dim;
  const int group = KvQ8Group(d), ng = d / group;
  float* qs = ThreadScratch(0, static_cast<size_t>(R) * d);
  float* ot = ThreadScratch(1, static_cast<size_t>(R) * d);
  const size_t zero_floats = (static_cast<size_t>(d) + 31) / 32 * 8;
  float* scratch = ThreadScratch(2, zero_floats + static_cast<size_t>(ng) * (2 + R) * kDecodeChunk);
  int8_t* zero = reinterpret_cast<int8_t*>(scratch);
  float* ksc = scratch + zero_floats;                                 // [ng][kDecodeChunk]
  float* vsc = ksc + static_cast<size_t>(ng) * kDecodeChunk;          // [ng][kDecodeChunk]
  float* pq = vsc + static_cast<size_t>(ng) * kDecodeChunk;           // [ng][R][kDecodeChunk]
  std::fill(zero, zero + d, int8_t{0});
  std::fill(ot, ot + static_cast<size_t>(R) * d, 0.0f);

  int32_t lim[R], min_lim, max_lim;
  LoadDecodeRows(p, job, R, qs, lim, &min_lim, &max_lim);
  __m256 m[R], lsum[R];
  for (int r = 0; r < R; ++r) {
    m[r] = _mm256_set1_ps(-FLT_MAX);
    lsum[r] = _mm256_setzero_ps();
  }

  const SlotMap map(p.kv, job.kv_head, d);
  const SlotMap vmap = kV4 ? SlotMap::ForV(p.kv, job.kv_head, d) : map;
  const int8_t* v_pool = kV4 ? reinterpret_cast<const int8_t*>(p.kv.v_q4) : p.kv.v_q8;
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  alignas(32) float pbuf[R][kDecodeChunk];
  __m256 alpha[R];
  PrefetchKvRows(p.kv, map, p.indices, job.slot_begin, std::min(max_lim, job.slot_begin + kDecodeChunk), d);
  for (int c = job.slot_begin; c < max_lim; c += kDecodeChunk) {
    PrefetchKvRows(p.kv, map, p.indices, c + kDecodeChunk, std::min(max_lim, c + 2 * kDecodeChunk), d);
    const int8_t* kr[kDecodeChunk];
    const int8_t* vr[kDecodeChunk];
    if constexpr (kV4) {
      TensorRows<kGroup, kGroups>(p, map, c, max_lim, p.kv.k_q8, d, zero, kr);
      TensorRows<kGroup, kGroups>(p, vmap, c, max_lim, v_pool, d / 2, zero, vr);
    } else {
      DecodeRows<kGroup, kGroups>(p, map, c, max_lim, p.kv.k_q8, p.kv.v_q8, zero, kr, vr);
    }
    StepScalesQ8(p, map, c, max_lim, p.kv.k_q8, ng, ksc);
    const bool masked = c + kDecodeChunk > min_lim;
    for (int r = 0; r < R; ++r) {
      __m256 s[kGroups];
      for (int gi = 0; gi < kGroups; ++gi) {
        const int8_t* const* k = kr + gi * kGroup;
        __m256 acc[kGroup];
#pragma GCC unroll 8
        for (int j = 0; j < kGroup; ++j) acc[j] = _mm256_setzero_ps();
        for (int g = 0; g < ng; ++g) {
          const float* kscale = ksc + g * kDecodeChunk + gi * kGroup;
#pragma GCC unroll 8
          for (int j = 0; j < kGroup; ++j) {
            __m256 t = _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int i = g * group; i < (g + 1) * group; i += 8) {
              t = _mm256_fmadd_ps(_mm256_load_ps(qs + r * d + i), LoadQ8(k[j] + i), t);
            }
            acc[j] = _mm256_fmadd_ps(t, _mm256_broadcast_ss(kscale + j), acc[j]);
          }
        }
        s[gi] = Reduce8(acc);
        if (masked) s[gi] = MaskScores(s[gi], c + gi * kGroup, lim[r], iota, neg_inf);
      }
      SoftmaxStep(s, m[r], alpha[r], lsum[r], pbuf[r]);
    }
    StepScalesQ8(p, vmap, c, max_lim, v_pool, ng, vsc);
    for (int g = 0; g < ng; ++g) {
      for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
        for (int i = 0; i < kDecodeChunk; i += 8) {
          _mm256_store_ps(pq + (g * R + r) * kDecodeChunk + i,
                          _mm256_mul_ps(_mm256_load_ps(pbuf[r] + i), _mm256_load_ps(vsc + g * kDecodeChunk + i)));
        }
      }
    }
    if constexpr (kD > 0) {
      constexpr int VB = DecodeVb(R, kD / 8);
      for (int v0 = 0; v0 < kD / 8; v0 += VB)
        AccumulateRowsQ8<R, VB, DecodeJs(R, VB), kD, kV4>(ot + 8 * v0, pq, vr, alpha, 8 * v0);
    } else {
      for (int v0 = 0; v0 < d / 8; ++v0)
        AccumulateRowsQ8<R, 1, DecodeJs(R, 1), 0, kV4>(ot + 8 * v0, pq, vr, alpha, 8 * v0, d);
    }
  }
  for (int r = 0; r < R; ++r) {
    std::copy_n(ot + r * d, d, o + static_cast<int64_t>(r) * d);
    m_out[r] = _mm256_cvtss_f32(m[r]);
    l_out[r] = HorizontalSum(lsum[r]);
  }
}

template <int kD, bool kV4>
void DecodeKernelQ8D(const AttendParams& p, const TileJob& job, float* o, float* m, float* l) {
  switch (job.n_rows) {
    case 1: return DecodeKernelQ8T<1, kD, kV4>(p, job, o, m, l);
    case 2: return DecodeKernelQ8T<2, kD, kV4>(p, job, o, m, l);
    case 3: return DecodeKernelQ8T<3, kD, kV4>(p, job, o, m, l);
    case 4: return DecodeKernelQ8T<4, kD, kV4>(p, job, o, m, l);
    case 5: return DecodeKernelQ8T<5, kD, kV4>(p, job, o, m, l);
    case 6: return DecodeKernelQ8T<6, kD, kV4>(p, job, o, m, l);
    case 7: return DecodeKernelQ8T<7, kD, kV4>(p, job, o, m, l);
    default: return DecodeKernelQ8T<8, kD, kV4>(p, job, o, m, l);
  }
}

// K in q8_0 with V in q8_0, or (kV4) in q4_0.
template <bool kV4>
void DecodeKernelQ8(const AttendParams& p, const TileJob& job, float* o, float* m, float* l) {
  switch (p.shape.head_dim) {
    case 64: return DecodeKernelQ8D<64, kV4>(p, job, o, m, l);
    case 128: return DecodeKernelQ8D<128, kV4>(p, job, o, m, l);
    default: return DecodeKernelQ8D<0, kV4>(p, job, o, m, l);
  }
}

template <int kD, class T>
void DecodeKernelD(const AttendParams& p, const TileJob& job, float* o, float* m, float* l) {
  switch (job.n_rows) {
    case 1: return DecodeKernelT<1, kD, T>(p, job, o, m, l);
    case 2: return DecodeKernelT<2, kD, T>(p, job, o, m, l);
    case 3: return DecodeKernelT<3, kD, T>(p, job, o, m, l);
    case 4: return DecodeKernelT<4, kD, T>(p, job, o, m, l);
    case 5: return DecodeKernelT<5, kD, T>(p, job, o, m, l);
    case 6: return DecodeKernelT<6, kD, T>(p, job, o, m, l);
    case 7: return DecodeKernelT<7, kD, T>(p, job, o, m, l);
    default: return DecodeKernelT<8, kD, T>(p, job, o, m, l);
  }
}

template <class T>
void DecodeKernelE(const AttendParams& p, const TileJob& job, float* o, float* m, float* l) {
  switch (p.shape.head_dim) {
    case 64: return DecodeKernelD<64, T>(p, job, o, m, l);
    case 128: return DecodeKernelD<128, T>(p, job, o, m, l);
    default: return DecodeKernelD<0, T>(p, job, o, m, l);
  }
}

void DecodeKernel(const AttendParams& p, const TileJob& job, float* o, float* m, float* l) {
  if (p.kv.k_q8 != nullptr) {
    return p.kv.v_q4 != nullptr ? DecodeKernelQ8</*kV4=*/true>(p, job, o, m, l)
                                : DecodeKernelQ8</*kV4=*/false>(p, job, o, m, l);
  }
  if (p.kv.k_f16 != nullptr) return DecodeKernelE<uint16_t>(p, job, o, m, l);
  return DecodeKernelE<float>(p, job, o, m, l);
}

}  // namespace

KernelSet Avx2Kernels() {
  KernelSet ks;
  ks.tile = VecTile<8>;
  ks.tile_rows = kVecRows;
  ks.few = DecodeKernel;
  ks.few_rows_max = kDecodeRows;
  // Any multiple of 8 would do; 16, as on AVX-512, keeps a model with head_dim 8
  // (stories260K, the reuse tests' model) on the tile kernel for every row, so that
  // recomputing a decoded row inside a chunk gives its bits (docs/engine.md).
  ks.few_head_dim_multiple = 16;
  ks.few_k8_v4 = true;
  return ks;
}

}  // namespace attic::attention::internal
