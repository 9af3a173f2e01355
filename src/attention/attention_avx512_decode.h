// The AVX-512 decode kernels' shared pieces, and the q8_0 decode kernel: included by
// attention_avx512.cc and by attention_decode_q8_vnni.cc (the kernel's VNNI form, compiled
// with -mavx512vnni). Everything here has internal linkage (an unnamed namespace), so the
// two files' copies, compiled for different ISAs, never merge at link time.
#pragma once

// GCC 12 reports false -Wmaybe-uninitialized inside its own AVX-512 intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "attention/attention_internal.h"

namespace attic::attention::internal {
namespace {  // NOLINT(build/namespaces): per-ISA copies, see above

// 2^x for x <= 0 (Cephes exp2f polynomial on [-0.5, 0.5], relative error ~2e-7);
// exactly 0 for x < -149 (including -inf, the mask value).
inline __m512 Exp2(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-149.0f), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-149.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

// In-block folds of two vectors (4 floats per 128-bit block, both sums per block):
// FoldPs: [x0+x2, y0+y2, x1+x3, y1+y3]; FoldPd: [x0+x2, x1+x3, y0+y2, y1+y3].
inline __m512 FoldPs(__m512 x, __m512 y) { return _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y)); }
inline __m512 FoldPd(__m512 x, __m512 y) {
  const __m512d a = _mm512_castps_pd(x), b = _mm512_castps_pd(y);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}
// Cross-block fold: blocks [x0+x1, x2+x3, y0+y1, y2+y3].
inline __m512 Fold128(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Returns r with r[j] = horizontal sum of x[j], j < 16. In-block folds first (cheap
// shuffles, most of the tree): after FoldPs and FoldPd, lane e of every block of c[k]
// holds a partial sum of x[4k + e]; two cross-block folds then add the blocks, leaving
// x[4k + e]'s total in lane 4k + e.
inline __m512 Reduce16(const __m512 (&x)[16]) {
  const __m512 b0 = FoldPs(x[0], x[1]), b1 = FoldPs(x[2], x[3]), b2 = FoldPs(x[4], x[5]), b3 = FoldPs(x[6], x[7]);
  const __m512 b4 = FoldPs(x[8], x[9]), b5 = FoldPs(x[10], x[11]), b6 = FoldPs(x[12], x[13]), b7 = FoldPs(x[14], x[15]);
  const __m512 c0 = FoldPd(b0, b1), c1 = FoldPd(b2, b3), c2 = FoldPd(b4, b5), c3 = FoldPd(b6, b7);
  return Fold128(Fold128(c0, c1), Fold128(c2, c3));
}

// Horizontal max, broadcast to every lane.
inline __m512 BroadcastMax(__m512 x) {
  x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
  x = _mm512_max_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_max_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));
}

constexpr int kDecodeRows = 8;
constexpr int kGroup = 16;              // slots per score vector
constexpr int kGroups = 4;              // score vectors per online-softmax step
constexpr int kDecodeChunk = kGroup * kGroups;

// Scores of slots first..first+15 at or past `lim` (not visible to the query row) set to
// -inf: the causal mask of a decode step's last piece.
[[gnu::always_inline]] inline __m512 MaskScores(__m512 s, int first, int lim, __m512i iota, __m512 neg_inf) {
  const __m512i ids = _mm512_add_epi32(_mm512_set1_epi32(first), iota);
  return _mm512_mask_mov_ps(neg_inf, _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(lim), ids), s);
}

// One online-softmax step of a query row over kDecodeChunk slots' scores s (log2 units),
// whatever type the keys were read from (f32, f16, q8_0): the running max m moves to the
// step's, alpha is the factor the row's earlier sum and output are rescaled by, lsum
// takes the step's weights, which go to pbuf [kDecodeChunk] for the P V product.
[[gnu::always_inline]] inline void SoftmaxStep(const __m512 (&s)[kGroups], __m512& m, __m512& alpha, __m512& lsum, float* pbuf) {
  static_assert(kGroups == 4);
  const __m512 mx = BroadcastMax(_mm512_max_ps(_mm512_max_ps(m, s[0]), _mm512_max_ps(_mm512_max_ps(s[1], s[2]), s[3])));
  alpha = Exp2(_mm512_sub_ps(m, mx));
  m = mx;
  __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int gi = 0; gi < kGroups; ++gi) {
    const __m512 e = Exp2(_mm512_sub_ps(s[gi], mx));
    sum = _mm512_add_ps(sum, e);
    _mm512_store_ps(pbuf + gi * kGroup, e);
  }
  lsum = _mm512_fmadd_ps(lsum, alpha, sum);
}

// P V for R rows over one 64-slot step, for VB vectors of head_dim starting at float
// `col`: ot[r][col..] = ot[r][col..] * alpha[r] + sum_j p[r][j] * V_j[col..]. JS x R x VB
// independent accumulators (>= 8) keep both FMA pipes busy despite the 4-cycle latency.
constexpr int DecodeVb(int rows, int dv) {
  int vb = dv;
  while (vb > 1 && vb * rows > 24) vb /= 2;
  return vb;
}
constexpr int DecodeJs(int rows, int vb) {  // a power of two, so it divides kGroup
  int js = 1;
  while (rows * vb * js < 8) js *= 2;
  return js;
}

// ---------------------------------------------------------------------------------------
// q8_0 decode kernel: reads the int8 rows where they lie, no dequantized copy.
//
// Scores. kVnni (design b, as llama.cpp's vec_dot_q8_0_q8_0): each row's query (log2
// units) is quantized per q8_0 group to int8 (dq = max|q| / 127, qq = round(q / dq)), and
// K . q is summed exactly in int32 by vpdpbusd: the K bytes are flipped to unsigned
// (k + 128, one xor) and the accumulators start at -128 * (the lane's sum of qq), so each
// lane holds sum k * qq over its 4 bytes. A 64-byte piece of a row is two 32-value groups
// (lanes 0-7 and 8-15). The reduction tree over 16 slots stops one level early
// (Reduce16Halves), where each 4-lane block still holds one slot quad's sum over one
// group; those int32 sums are converted and multiplied by dk * dq in place, and the last
// fold adds the groups. With head_dim 64 or 128 the same sums come from QuadScores, which
// shares each step's K bytes among the query rows instead. Without kVnni (design a): the
// int8 K rows are widened to f32 in registers and each 32-value group's partial dot
// product is multiplied by its scale.
// V (both): widened to f32 in registers; the softmax weight of slot j is multiplied by
// V_j's group scale once per step (pq below), so the P V loop is one convert and R FMAs
// per 16 values, the same as f16.
// `attention_bench --only decode` (docs/engine.md, "q8_0 decode") measures both.

inline __m512i FoldEpi32(__m512i x, __m512i y) {
  return _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y));
}
inline __m512i FoldEpi64(__m512i x, __m512i y) {
  return _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y));
}
inline __m512i Fold128Epi32(__m512i x, __m512i y) {
  return _mm512_add_epi32(_mm512_shuffle_i32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}
// Reduce16 without its last fold: block b of *e holds slots 0-3 (b = 0, 1) or 4-7 (b = 2,
// 3), summed over lanes 0-7 (b even) or 8-15 (b odd) of x[slot]; *f the same for slots
// 8-15. Fold128(*e, *f) would be Reduce16(x).
inline void Reduce16Halves(const __m512i (&x)[16], __m512i* e, __m512i* f) {
  const __m512i b0 = FoldEpi32(x[0], x[1]), b1 = FoldEpi32(x[2], x[3]), b2 = FoldEpi32(x[4], x[5]);
  const __m512i b3 = FoldEpi32(x[6], x[7]), b4 = FoldEpi32(x[8], x[9]), b5 = FoldEpi32(x[10], x[11]);
  const __m512i b6 = FoldEpi32(x[12], x[13]), b7 = FoldEpi32(x[14], x[15]);
  *e = Fold128Epi32(FoldEpi64(b0, b1), FoldEpi64(b2, b3));
  *f = Fold128Epi32(FoldEpi64(b4, b5), FoldEpi64(b6, b7));
}

// The f16 scales of 16 rows (src: [16][ng], row-major) as f32, group-major:
// out[g * kDecodeChunk + j] = scale g of row j.
inline void ScalesByGroup(const uint16_t* src, int ng, float* out) {
  if (ng == 1) {
    _mm512_store_ps(out, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
  } else if (ng == 2) {
    alignas(64) static constexpr uint16_t kIdx[32] = {0, 2, 4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                                      1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    const __m512i t = _mm512_permutexvar_epi16(_mm512_load_si512(kIdx), _mm512_loadu_si512(src));
    _mm512_store_ps(out, _mm512_cvtph_ps(_mm512_castsi512_si256(t)));
    _mm512_store_ps(out + kDecodeChunk, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(t, 1)));
  } else if (ng == 4) {
    const __m512i a = _mm512_loadu_si512(src), b = _mm512_loadu_si512(src + 32);
    for (int g = 0; g < 4; g += 2) {
      alignas(64) static constexpr uint16_t kIdx[32] = {0, 4, 8,  12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60,
                                                        1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61};
      const __m512i idx = _mm512_add_epi16(_mm512_load_si512(kIdx), _mm512_set1_epi16(static_cast<int16_t>(g)));
      const __m512i t = _mm512_permutex2var_epi16(a, idx, b);
      _mm512_store_ps(out + g * kDecodeChunk, _mm512_cvtph_ps(_mm512_castsi512_si256(t)));
      _mm512_store_ps(out + (g + 1) * kDecodeChunk, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(t, 1)));
    }
  } else {
    for (int g = 0; g < ng; ++g)
      for (int j = 0; j < kGroup; ++j) out[g * kDecodeChunk + j] = _cvtsh_ss(src[j * ng + g]);
  }
}

// sc[g * kDecodeChunk + i] = scale g (as f32) of the q8_0 row of virtual slot c + i in
// `pool` (k_q8 or v_q8), 0 past max_lim: read in place for a run of 16 rows inside one
// block, else gathered row by row.
inline void StepScalesQ8(const AttendParams& p, const SlotMap& map, int c, int max_lim, const int8_t* pool, int ng,
                         float* sc) {
  const int bs = map.block_size();
  alignas(64) uint16_t tmp[kGroup * 8];
  for (int gi = 0; gi < kGroups; ++gi) {
    const int c0 = c + gi * kGroup;
    const int n = std::clamp(max_lim - c0, 0, kGroup);
    const uint16_t* src = tmp;
    if (p.indices == nullptr && n == kGroup && c0 % bs + kGroup <= bs && ng <= 8) {
      src = Q8Scales(pool, map.Q8ScaleOffset(c0));
    } else if (ng <= 8) {
      for (int j = 0; j < n; ++j) {
        const uint16_t* s = Q8Scales(pool, map.Q8ScaleOffset(p.indices ? p.indices[c0 + j] : c0 + j));
        std::copy_n(s, ng, tmp + j * ng);
      }
      std::fill(tmp + n * ng, tmp + kGroup * ng, uint16_t{0});
    } else {  // more than 8 groups (head_dim > 256): row by row
      for (int j = 0; j < kGroup; ++j) {
        const uint16_t* s =
            j < n ? Q8Scales(pool, map.Q8ScaleOffset(p.indices ? p.indices[c0 + j] : c0 + j)) : nullptr;
        for (int g = 0; g < ng; ++g) sc[g * kDecodeChunk + gi * kGroup + j] = s ? _cvtsh_ss(s[g]) : 0.0f;
      }
      continue;
    }
    ScalesByGroup(src, ng, sc + gi * kGroup);
  }
}

// P V over one step for q8_0 rows (AccumulateRows' form): pq [ng][R][kDecodeChunk] holds
// each row's weights already multiplied by the V group scale of each slot. kQ4: q4_0 rows,
// each value read as its 4-bit code minus 8 (kv_q4.h; 32-value groups: values
// [32 g, 32 g + 16) are the low nibbles of bytes [16 g, 16 g + 16), the next 16 values
// their high nibbles).
template <int R, int VB, int JS, int kD, bool kQ4 = false>
inline void AccumulateRowsQ8(float* ot, const float* pq, const int8_t* const* vr, const __m512* alpha, int col,
                             int d_runtime = 0) {
  const int d = kD ? kD : d_runtime;
  const int group = KvQ8Group(d);
  const __m512i low = _mm512_set1_epi32(0xF), eight = _mm512_set1_epi32(8);
  const float* pv[VB];
#pragma GCC unroll 8
  for (int v = 0; v < VB; ++v) pv[v] = pq + (col + 16 * v) / group * (R * kDecodeChunk);
  __m512 acc[JS][R][VB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < VB; ++v) {
      acc[0][r][v] = _mm512_mul_ps(_mm512_load_ps(ot + r * d + 16 * v), alpha[r]);
#pragma GCC unroll 8
      for (int js = 1; js < JS; ++js) acc[js][r][v] = _mm512_setzero_ps();
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < kDecodeChunk; j += JS) {
#pragma GCC unroll 8
    for (int js = 0; js < JS; ++js) {
      __m512 vv[VB];
#pragma GCC unroll 8
      for (int v = 0; v < VB; ++v) {
        const int at = col + 16 * v;
        if constexpr (kQ4) {
          const uint8_t* row = reinterpret_cast<const uint8_t*>(vr[j + js]);  // the codes' bytes
          const __m512i b =
              _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + at / 32 * 16)));
          const __m512i code = (at / 16) % 2 == 0 ? _mm512_and_si512(b, low) : _mm512_srli_epi32(b, 4);
          vv[v] = _mm512_cvtepi32_ps(_mm512_sub_epi32(code, eight));
        } else {
          vv[v] = _mm512_cvtepi32_ps(
              _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr[j + js] + at))));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
        for (int v = 0; v < VB; ++v) {
          acc[js][r][v] = _mm512_fmadd_ps(_mm512_set1_ps(pv[v][r * kDecodeChunk + j + js]), vv[v], acc[js][r][v]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < VB; ++v) {
      __m512 t = acc[0][r][v];
#pragma GCC unroll 8
      for (int js = 1; js < JS; ++js) t = _mm512_add_ps(t, acc[js][r][v]);
      _mm512_store_ps(ot + r * d + 16 * v, t);
    }
  }
}

// The int8 bytes [64 * piece, 64 * piece + 64) of a row, zero past head_dim.
template <int kD>
inline __m512i LoadQ8Piece(const int8_t* row, int piece, int d) {
  if (kD > 0 && kD % 64 == 0) return _mm512_loadu_si512(row + 64 * piece);
  const int left = d - 64 * piece;
  if (left >= 64) return _mm512_loadu_si512(row + 64 * piece);
  return _mm512_maskz_loadu_epi8((__mmask64{1} << left) - 1, row + 64 * piece);
}

// The scores of one 64-slot step over q8_0 K for R query rows with VNNI, head_dim kP x 64
// (DecodeKernelQ8T's kQuads form; the row-by-row form below gives the same int32 sums).
// Each 16-slot group's K bytes are loaded and flipped once for all R rows, and arranged
// by QuadWords so that vector 4 q + e holds, in lane i of block b, the 4-byte word 4 b + e
// of slot 4 q + i. One vpdpbusd per vector against the query's matching words (qe, laid
// out by the kernel) leaves in each lane one slot's sum over 16 values, and a cross-block
// fold per 8 slots gives Reduce16Halves' layout: 8 shuffles per slot quad shared by the
// rows, where the row-by-row form runs a 16-slot reduction tree per row (~42
// instructions per 16 slots and row).
inline void QuadWords(const int8_t* const* k, int pc, __m512i (&u)[16]) {
  const __m512i flip = _mm512_set1_epi8(-128);
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    __m512i x[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) x[i] = _mm512_xor_si512(_mm512_loadu_si512(k[4 * q + i] + 64 * pc), flip);
    const __m512i lo01 = _mm512_unpacklo_epi32(x[0], x[1]), hi01 = _mm512_unpackhi_epi32(x[0], x[1]);
    const __m512i lo23 = _mm512_unpacklo_epi32(x[2], x[3]), hi23 = _mm512_unpackhi_epi32(x[2], x[3]);
    u[4 * q + 0] = _mm512_unpacklo_epi64(lo01, lo23);
    u[4 * q + 1] = _mm512_unpackhi_epi64(lo01, lo23);
    u[4 * q + 2] = _mm512_unpacklo_epi64(hi01, hi23);
    u[4 * q + 3] = _mm512_unpackhi_epi64(hi01, hi23);
  }
}

// qe: [R][kP][4][64] bytes (the query words of QuadWords' vector e), corr and dqv:
// [R][kP][16] as the row-by-row form's; then each row's online-softmax step.
template <int R, int kP>
[[gnu::always_inline]] inline void QuadScores(const int8_t* const* kr, const int8_t* qe, const int32_t* corr,
                                              const float* dqv, const float* ksc, bool masked, int c,
                                              const int32_t* lim, float (*pbuf)[kDecodeChunk], __m512* m,
                                              __m512* alpha, __m512* lsum) {
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i idx_e = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i idx_f = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 s[R][kGroups];
#pragma GCC unroll 4
  for (int gi = 0; gi < kGroups; ++gi) {
    const int8_t* const* k = kr + gi * kGroup;
    __m512 ef[R], ff[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) ef[r] = ff[r] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int pc = 0; pc < kP; ++pc) {
      __m512i u[16];
      QuadWords(k, pc, u);
      const float* k0 = ksc + (2 * pc) * kDecodeChunk + gi * kGroup;
      const float* k1 = k0 + kDecodeChunk;
      const __m512 we = _mm512_permutex2var_ps(_mm512_load_ps(k0), idx_e, _mm512_load_ps(k1));
      const __m512 wf = _mm512_permutex2var_ps(_mm512_load_ps(k0), idx_f, _mm512_load_ps(k1));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int at = r * kP + pc;
        const __m512i* qw = reinterpret_cast<const __m512i*>(qe + at * 4 * 64);
        const __m512i c0 = _mm512_load_si512(corr + at * 16);
        __m512i acc[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
          acc[q] = _mm512_dpbusd_epi32(c0, u[4 * q], _mm512_load_si512(qw));
#pragma GCC unroll 4
          for (int e = 1; e < 4; ++e) acc[q] = _mm512_dpbusd_epi32(acc[q], u[4 * q + e], _mm512_load_si512(qw + e));
        }
        const __m512i e = Fold128Epi32(acc[0], acc[1]), f = Fold128Epi32(acc[2], acc[3]);
        const __m512 dq = _mm512_load_ps(dqv + at * 16);
        ef[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(e), _mm512_mul_ps(we, dq), ef[r]);
        ff[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(f), _mm512_mul_ps(wf, dq), ff[r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      s[r][gi] = Fold128(ef[r], ff[r]);
      if (masked) s[r][gi] = MaskScores(s[r][gi], c + gi * kGroup, lim[r], iota, neg_inf);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) SoftmaxStep(s[r], m[r], alpha[r], lsum[r], pbuf[r]);
}

// Row-major q8_0 kernel for R rows (<= 8); kD = head_dim (64, 128), or 0 for any
// supported multiple of 16. Steps of 64 slots as DecodeKernelT's; rows through one
// pointer per slot (DecodeRows), so index lists and block edges read rows in place.
// kV4: V in q4_0 (head_dim a multiple of 32), its rows and scales found by V's own
// SlotMap; K and the scores as with a q8_0 V.
template <int R, int kD, bool kVnni, bool kV4>
void DecodeKernelQ8T(const AttendParams& p, const TileJob& job, float* o, float* m_out, float* l_out) {
  const int d = kD ? kD : p.shape.head_dim;
  const int group = KvQ8Group(d), ng = d / group;
  const int pieces = (d + 63) / 64;  // 64-byte pieces of a row
  const int ngp = 2 * pieces;        // groups counted per piece (two 32-value halves)
  float* qs = ThreadScratch(0, static_cast<size_t>(R) * d);
  float* ot = ThreadScratch(1, static_cast<size_t>(R) * d);
  // Scratch: the zero row, the quantized queries and their lane constants, the step's
  // K and V scales by group, the weights by V group.
  const size_t piece_floats = static_cast<size_t>(R) * pieces * 16;
  // kQuads: head_dim a multiple of 64 with VNNI, where the scores take K in slot quads
  // (below), sharing each step's K bytes among the R query rows.
  constexpr bool kQuads = kVnni && kD > 0 && kD % 64 == 0;
  float* scratch = ThreadScratch(2, pieces * 16 + 3 * piece_floats + 2 * static_cast<size_t>(ngp) * kDecodeChunk +
                                        static_cast<size_t>(ng) * R * kDecodeChunk + (kQuads ? 4 * piece_floats : 0));
  int8_t* zero = reinterpret_cast<int8_t*>(scratch);
  int8_t* qq = reinterpret_cast<int8_t*>(scratch + pieces * 16);  // [R][pieces][64]
  int32_t* corr = reinterpret_cast<int32_t*>(scratch + pieces * 16 + piece_floats);  // [R][pieces][16]
  float* dqv = scratch + pieces * 16 + 2 * piece_floats;                              // [R][pieces][16]
  float* ksc = dqv + piece_floats;                                                    // [ngp][kDecodeChunk]
  float* vsc = ksc + static_cast<size_t>(ngp) * kDecodeChunk;                         // [ng][kDecodeChunk]
  float* pq = vsc + static_cast<size_t>(ngp) * kDecodeChunk;                          // [ng][R][kDecodeChunk]
  // kQuads: [R][pieces][4][64], QuadScores' query words.
  int8_t* qe = reinterpret_cast<int8_t*>(pq + static_cast<size_t>(ng) * R * kDecodeChunk);
  std::fill(zero, zero + pieces * 64, int8_t{0});
  std::fill(ksc, ksc + static_cast<size_t>(ngp) * kDecodeChunk, 0.0f);  // groups past ng stay 0
  std::fill(ot, ot + static_cast<size_t>(R) * d, 0.0f);

  int32_t lim[R], min_lim, max_lim;
  LoadDecodeRows(p, job, R, qs, lim, &min_lim, &max_lim);
  if constexpr (kVnni) {
    // qq = round(q / dq) per group, dq = max|q| / 127 (0 for a zero group); dqv holds, per
    // row and piece, dq in Reduce16Halves' lane layout (blocks 0, 2: the piece's first
    // group; 1, 3: its second); corr = -128 * sum of the lane's qq bytes.
    std::fill(qq, qq + piece_floats * 4, int8_t{0});
    for (int r = 0; r < R; ++r) {
      float dq_of[16] = {};
      for (int g = 0; g < ng; ++g) {
        const float* x = qs + r * d + g * group;
        float amax = 0;
        for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float dq = amax / 127.0f;
        dq_of[g] = dq;
        for (int i = 0; i < group; ++i) {
          const float t = dq > 0 ? std::nearbyint(x[i] / dq) : 0.0f;
          qq[(r * pieces) * 64 + g * group + i] = static_cast<int8_t>(std::clamp(t, -127.0f, 127.0f));
        }
      }
      for (int pc = 0; pc < pieces; ++pc) {
        const int at = r * pieces + pc;
        const __m512i qv = _mm512_load_si512(qq + at * 64);
        __m512i s = _mm512_setzero_si512();
        if constexpr (kQuads) {
          // qe[e]: lane 4 b + i holds the query's 4-byte word 4 b + e (the word slot
          // quads' vector e holds in block b, lane i: QuadWords); corr sums the four.
          for (int e = 0; e < 4; ++e) {
            const __m512i words = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
            const __m512i w = _mm512_permutexvar_epi32(_mm512_add_epi32(_mm512_set1_epi32(e), words), qv);
            _mm512_store_si512(qe + (at * 4 + e) * 64, w);
            s = _mm512_dpbusd_epi32(s, _mm512_set1_epi8(-128), w);
          }
        } else {
          s = _mm512_dpbusd_epi32(s, _mm512_set1_epi8(-128), qv);
        }
        _mm512_store_si512(corr + at * 16, _mm512_sub_epi32(_mm512_setzero_si512(), s));
        // The groups of the piece's halves (bytes 0-31 and 32-63).
        const int g0 = 64 * pc / group, g1 = (64 * pc + 32) / group;
        const float d0 = dq_of[g0], d1 = 64 * pc + 32 < d ? dq_of[g1] : 0.0f;
        _mm512_store_ps(dqv + at * 16, _mm512_setr_ps(d0, d0, d0, d0, d1, d1, d1, d1, d0, d0, d0, d0, d1, d1, d1, d1));
      }
    }
  }
  __m512 m[R], lsum[R];
  for (int r = 0; r < R; ++r) {
    m[r] = _mm512_set1_ps(-FLT_MAX);
    lsum[r] = _mm512_setzero_ps();
  }

  const SlotMap map(p.kv, job.kv_head, d);
  const SlotMap vmap = kV4 ? SlotMap::ForV(p.kv, job.kv_head, d) : map;
  const int8_t* v_pool = kV4 ? reinterpret_cast<const int8_t*>(p.kv.v_q4) : p.kv.v_q8;
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i flip = _mm512_set1_epi8(-128);
  // Halves' scales into Reduce16Halves' layout: e (slots 0-7) and f (slots 8-15).
  const __m512i idx_e = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i idx_f = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  alignas(64) float pbuf[R][kDecodeChunk];
  __m512 alpha[R];
  // The next step's K and V rows (and scales) are prefetched while this one is computed.
  // Per slot, as the f32 / f16 kernels do: prefetching each block run's bytes once instead
  // (no repeated scale lines) measured slower (attention_bench --only decode
  // --decode-context 8192 --threads 1, 3 alternating rounds: smollm2-135m 0.31 -> 0.41 ms,
  // llama-1b 0.89 -> 1.20 ms per layer).
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
    // K scales by group (ksc has a group for each half-piece, ngp >= ng: the rest stay 0).
    StepScalesQ8(p, map, c, max_lim, p.kv.k_q8, ng, ksc);
    const bool masked = c + kDecodeChunk > min_lim;
    if constexpr (kQuads) {
      QuadScores<R, kD / 64>(kr, qe, corr, dqv, ksc, masked, c, lim, pbuf, m, alpha, lsum);
    } else {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m512 s[kGroups];
        for (int gi = 0; gi < kGroups; ++gi) {
          const int8_t* const* k = kr + gi * kGroup;
          if constexpr (kVnni) {
            __m512 ef = _mm512_setzero_ps(), ff = _mm512_setzero_ps();
            for (int pc = 0; pc < pieces; ++pc) {
              const int at = r * pieces + pc;
              const __m512i qv = _mm512_load_si512(qq + at * 64);
              const __m512i c0 = _mm512_load_si512(corr + at * 16);
              __m512i acc[kGroup];
#pragma GCC unroll 16
              for (int j = 0; j < kGroup; ++j) {
                acc[j] = _mm512_dpbusd_epi32(c0, _mm512_xor_si512(LoadQ8Piece<kD>(k[j], pc, d), flip), qv);
              }
              __m512i e, f;
              Reduce16Halves(acc, &e, &f);
              const __m512 dq = _mm512_load_ps(dqv + at * 16);
              const float* k0 = ksc + (2 * pc) * kDecodeChunk + gi * kGroup;
              const float* k1 = k0 + kDecodeChunk;
              const __m512 we = _mm512_permutex2var_ps(_mm512_load_ps(k0), idx_e, _mm512_load_ps(k1));
              const __m512 wf = _mm512_permutex2var_ps(_mm512_load_ps(k0), idx_f, _mm512_load_ps(k1));
              ef = _mm512_fmadd_ps(_mm512_cvtepi32_ps(e), _mm512_mul_ps(we, dq), ef);
              ff = _mm512_fmadd_ps(_mm512_cvtepi32_ps(f), _mm512_mul_ps(wf, dq), ff);
            }
            s[gi] = Fold128(ef, ff);
          } else {
            __m512 acc[kGroup];
#pragma GCC unroll 16
            for (int j = 0; j < kGroup; ++j) acc[j] = _mm512_setzero_ps();
            for (int g = 0; g < ng; ++g) {
              const float* kscale = ksc + g * kDecodeChunk + gi * kGroup;
#pragma GCC unroll 16
              for (int j = 0; j < kGroup; ++j) {
                __m512 t = _mm512_setzero_ps();
                for (int i = g * group; i < (g + 1) * group; i += 16) {
                  const __m512 kv = _mm512_cvtepi32_ps(
                      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k[j] + i))));
                  t = _mm512_fmadd_ps(_mm512_load_ps(qs + r * d + i), kv, t);
                }
                acc[j] = _mm512_fmadd_ps(t, _mm512_set1_ps(kscale[j]), acc[j]);
              }
            }
            s[gi] = Reduce16(acc);
          }
          if (masked) s[gi] = MaskScores(s[gi], c + gi * kGroup, lim[r], iota, neg_inf);
        }
        SoftmaxStep(s, m[r], alpha[r], lsum[r], pbuf[r]);
      }
    }
    // The weights times each slot's V scale, per V group.
    StepScalesQ8(p, vmap, c, max_lim, v_pool, ng, vsc);
    for (int g = 0; g < ng; ++g) {
      for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (int i = 0; i < kDecodeChunk; i += 16) {
          _mm512_store_ps(pq + (g * R + r) * kDecodeChunk + i,
                          _mm512_mul_ps(_mm512_load_ps(pbuf[r] + i), _mm512_load_ps(vsc + g * kDecodeChunk + i)));
        }
      }
    }
    if constexpr (kD > 0) {
      constexpr int VB = DecodeVb(R, kD / 16);
      for (int v0 = 0; v0 < kD / 16; v0 += VB)
        AccumulateRowsQ8<R, VB, DecodeJs(R, VB), kD, kV4>(ot + 16 * v0, pq, vr, alpha, 16 * v0);
    } else {
      for (int v0 = 0; v0 < d / 16; ++v0)
        AccumulateRowsQ8<R, 1, DecodeJs(R, 1), 0, kV4>(ot + 16 * v0, pq, vr, alpha, 16 * v0, d);
    }
  }
  for (int r = 0; r < R; ++r) {
    std::copy_n(ot + r * d, d, o + static_cast<int64_t>(r) * d);
    m_out[r] = _mm512_cvtss_f32(m[r]);
    l_out[r] = _mm512_reduce_add_ps(lsum[r]);
  }
}

template <int kD, bool kVnni, bool kV4>
void DecodeKernelQ8D(const AttendParams& p, const TileJob& job, float* o, float* m, float* l) {
  switch (job.n_rows) {
    case 1: return DecodeKernelQ8T<1, kD, kVnni, kV4>(p, job, o, m, l);
    case 2: return DecodeKernelQ8T<2, kD, kVnni, kV4>(p, job, o, m, l);
    case 3: return DecodeKernelQ8T<3, kD, kVnni, kV4>(p, job, o, m, l);
    case 4: return DecodeKernelQ8T<4, kD, kVnni, kV4>(p, job, o, m, l);
    case 5: return DecodeKernelQ8T<5, kD, kVnni, kV4>(p, job, o, m, l);
    case 6: return DecodeKernelQ8T<6, kD, kVnni, kV4>(p, job, o, m, l);
    case 7: return DecodeKernelQ8T<7, kD, kVnni, kV4>(p, job, o, m, l);
    default: return DecodeKernelQ8T<8, kD, kVnni, kV4>(p, job, o, m, l);
  }
}

// K in q8_0 with V in q8_0, or (kV4) in q4_0.
template <bool kVnni, bool kV4 = false>
void DecodeKernelQ8(const AttendParams& p, const TileJob& job, float* o, float* m, float* l) {
  switch (p.shape.head_dim) {
    case 64: return DecodeKernelQ8D<64, kVnni, kV4>(p, job, o, m, l);
    case 128: return DecodeKernelQ8D<128, kVnni, kV4>(p, job, o, m, l);
    default: return DecodeKernelQ8D<0, kVnni, kV4>(p, job, o, m, l);
  }
}

}  // namespace
}  // namespace attic::attention::internal
