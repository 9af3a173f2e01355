// AVX-512 attention kernels (compiled with -mavx512f/bw/vl/dq -mfma).
//
// TransposedKernel (prefill, chunks, anything with many rows per KV head): the tile works
// transposed, one zmm = 16 rows. Q^T [d][48] and O^T [d][48] stay in L1; each K and V
// element is broadcast straight from the paged pool into 3 FMAs (48 rows), so K/V are
// never copied and every loaded row is reused by 48 query rows:
//   S^T[j][rows] = sum_d K[j][d] * Q^T[d][rows]      (8 slots x 3 vectors = 24 accumulators)
//   O^T[d][rows] = O^T * alpha + sum_j V[j][d] * P^T[j][rows]   (8 dims x 3 vectors)
// Softmax statistics are per lane (per row), so max / sum / rescale are vertical.
// A job may hold up to kMaxSubTiles such tiles (a chunk of queries whose rows per KV head
// exceed 48, e.g. 24 queries x group 3 = 72): they take each chunk of K/V rows in turn,
// so rows streamed from a long stored history are loaded once, not once per tile
// (`attention_bench --only chunk`: chunk24 ~190 -> ~200, chunk64 ~260 -> ~265-285 GFLOP/s).
//
// DecodeKernel (<= 8 rows, head_dim % 16 == 0): row-major, vectorised over head_dim;
// 16 dot products are reduced at once by a shuffle-add tree, 64 slots per softmax step.
// It loads whole K/V rows, which is fastest when the pool is 64-byte aligned (rows then
// start on cache lines: misaligned rows cost ~1.5x in cache); any alignment is correct.

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "attention/attention_avx512_decode.h"
#include "attention/attention_internal.h"
#include "attic/core/status.h"

namespace attic::attention::internal {
namespace {

constexpr int kVecs = 3;              // row vectors per tile
constexpr int kStride = 16 * kVecs;   // floats per d (or per slot) in the transposed buffers
constexpr int kChunk = 32;            // slots per online-softmax step (multiple of 8)
constexpr int kMaxSubTiles = 4;       // tiles of kStride rows one job may run over shared K/V


// ---------------------------------------------------------------------------------------
// Transposed tile kernel.

// st[j][rows] = sum_d kp[j][d] * qt[d][rows] for 8 slots.
template <int RV>
inline void Scores8(const float* qt, int d, const float* const* kp, float* st) {
  __m512 acc[8][RV];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
#pragma GCC unroll 3
    for (int v = 0; v < RV; ++v) acc[j][v] = _mm512_setzero_ps();
  }
  const float *k0 = kp[0], *k1 = kp[1], *k2 = kp[2], *k3 = kp[3], *k4 = kp[4], *k5 = kp[5], *k6 = kp[6], *k7 = kp[7];
  for (int i = 0; i < d; ++i) {
    __m512 qv[RV];
#pragma GCC unroll 3
    for (int v = 0; v < RV; ++v) qv[v] = _mm512_load_ps(qt + i * kStride + 16 * v);
    const float ks[8] = {k0[i], k1[i], k2[i], k3[i], k4[i], k5[i], k6[i], k7[i]};
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512 b = _mm512_set1_ps(ks[j]);
#pragma GCC unroll 3
      for (int v = 0; v < RV; ++v) acc[j][v] = _mm512_fmadd_ps(b, qv[v], acc[j][v]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
#pragma GCC unroll 3
    for (int v = 0; v < RV; ++v) _mm512_store_ps(st + j * kStride + 16 * v, acc[j][v]);
  }
}

// ot[i][rows] = ot[i][rows] * alpha + sum_j vp[j][i] * pt[j][rows] for i in [i0, i0 + DB).
template <int RV, int DB>
inline void Accumulate(float* ot, int i0, const float* pt, const float* const* vp, int n, const __m512* alpha) {
  __m512 acc[DB][RV];
#pragma GCC unroll 8
  for (int i = 0; i < DB; ++i) {
#pragma GCC unroll 3
    for (int v = 0; v < RV; ++v) acc[i][v] = _mm512_mul_ps(_mm512_load_ps(ot + (i0 + i) * kStride + 16 * v), alpha[v]);
  }
  for (int j = 0; j < n; ++j) {
    __m512 pv[RV];
#pragma GCC unroll 3
    for (int v = 0; v < RV; ++v) pv[v] = _mm512_load_ps(pt + j * kStride + 16 * v);
    const float* vr = vp[j] + i0;
#pragma GCC unroll 8
    for (int i = 0; i < DB; ++i) {
      const __m512 b = _mm512_set1_ps(vr[i]);
#pragma GCC unroll 3
      for (int v = 0; v < RV; ++v) acc[i][v] = _mm512_fmadd_ps(b, pv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < DB; ++i) {
#pragma GCC unroll 3
    for (int v = 0; v < RV; ++v) _mm512_store_ps(ot + (i0 + i) * kStride + 16 * v, acc[i][v]);
  }
}

// One tile of <= kStride rows inside a job: its transposed Q and O and per-row softmax
// statistics.
struct SubTile {
  int row0 = 0;  // first row, relative to the job's
  int n_rows = 0;
  int rv = 0;           // vectors of 16 rows it uses
  float* qt = nullptr;  // [d][kStride]
  float* ot = nullptr;  // [d][kStride]
  alignas(64) int32_t lim[kStride] = {};  // visible virtual slots per row within the job
  int32_t min_lim = INT32_MAX, max_lim = 0;
  __m512 m[kVecs], l[kVecs];
};

// One chunk of slots [c, c + n8) (padded with valid rows past the visible ones) for one
// sub-tile: scores, online softmax, P V.
template <int RV>
inline void TileChunk(SubTile& t, int d, int c, int n8, const float* const* kp, const float* const* vp, float* st) {
  for (int j = 0; j < n8; j += 8) Scores8<RV>(t.qt, d, kp + j, st + j * kStride);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 alpha[RV];
  const bool masked = c + n8 > t.min_lim;
  for (int v = 0; v < RV; ++v) {
    float* sv = st + 16 * v;
    __m512 mx = t.m[v];
    if (masked) {
      const __m512i limv = _mm512_load_si512(t.lim + 16 * v);
      for (int j = 0; j < n8; ++j) {
        const __mmask16 vis = _mm512_cmpgt_epi32_mask(limv, _mm512_set1_epi32(c + j));
        const __m512 s = _mm512_mask_mov_ps(neg_inf, vis, _mm512_load_ps(sv + j * kStride));
        _mm512_store_ps(sv + j * kStride, s);
        mx = _mm512_max_ps(mx, s);
      }
    } else {
      for (int j = 0; j < n8; ++j) mx = _mm512_max_ps(mx, _mm512_load_ps(sv + j * kStride));
    }
    alpha[v] = Exp2(_mm512_sub_ps(t.m[v], mx));
    t.m[v] = mx;
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < n8; ++j) {
      const __m512 e = Exp2(_mm512_sub_ps(_mm512_load_ps(sv + j * kStride), mx));
      _mm512_store_ps(sv + j * kStride, e);
      sum = _mm512_add_ps(sum, e);
    }
    t.l[v] = _mm512_fmadd_ps(t.l[v], alpha[v], sum);
  }
  int i = 0;
  for (; i + 8 <= d; i += 8) Accumulate<RV, 8>(t.ot, i, st, vp, n8, alpha);
  for (; i < d; ++i) Accumulate<RV, 1>(t.ot, i, st, vp, n8, alpha);
}

// A job of up to kMaxSubTiles * kStride rows, as consecutive sub-tiles of kStride rows
// that share every K/V chunk: the chunk's rows are loaded (from DRAM, for a long stored
// history) once and reused from L1 by each sub-tile, instead of streamed again per tile.
void TransposedKernel(const AttendParams& p, const TileJob& job, float* o, float* m_out, float* l_out) {
  const int d = p.shape.head_dim;
  const int g = p.group;
  const float qscale = p.shape.scale * kLog2e;
  const int n_sub = (job.n_rows + kStride - 1) / kStride;
  ATTIC_CHECK(n_sub <= kMaxSubTiles);  // the planner's jobs are at most tile_rows * max_tiles_per_job rows
  float* qt_all = ThreadScratch(0, static_cast<size_t>(n_sub) * d * kStride);
  float* ot_all = ThreadScratch(1, static_cast<size_t>(n_sub) * d * kStride);
  float* st = ThreadScratch(2, static_cast<size_t>(kChunk) * kStride);
  SubTile subs[kMaxSubTiles];
  int32_t max_lim = 0;
  for (int s = 0; s < n_sub; ++s) {
    SubTile& t = subs[s];
    t.row0 = s * kStride;
    t.n_rows = std::min(kStride, job.n_rows - t.row0);
    t.rv = (t.n_rows + 15) / 16;
    t.qt = qt_all + static_cast<size_t>(s) * d * kStride;
    t.ot = ot_all + static_cast<size_t>(s) * d * kStride;
    for (int i = 0; i < d; ++i) {
      for (int v = 0; v < kVecs; ++v) {
        _mm512_store_ps(t.qt + i * kStride + 16 * v, _mm512_setzero_ps());
        _mm512_store_ps(t.ot + i * kStride + 16 * v, _mm512_setzero_ps());
      }
    }
    for (int r = 0; r < t.n_rows; ++r) {
      const int64_t row = job.row_begin + t.row0 + r;
      const int64_t query = row / g;
      const int head = job.kv_head * g + static_cast<int>(row % g);
      const float* src = p.q + (query * p.shape.n_heads + head) * d;
      for (int i = 0; i < d; ++i) t.qt[i * kStride + r] = src[i] * qscale;
      t.lim[r] = std::min(p.n_vis[query], job.slot_end);
      t.min_lim = std::min(t.min_lim, t.lim[r]);
      t.max_lim = std::max(t.max_lim, t.lim[r]);
    }
    for (int v = 0; v < kVecs; ++v) {
      t.m[v] = _mm512_set1_ps(-FLT_MAX);
      t.l[v] = _mm512_setzero_ps();
    }
    max_lim = std::max(max_lim, t.max_lim);
  }

  const SlotMap map(p.kv, job.kv_head, d);
  const float* kp[kChunk];
  const float* vp[kChunk];
  const KvRowReader reader(p.kv, job.kv_head, d);
  float* widened = reader.widens() ? ThreadScratch(kF16Scratch, static_cast<size_t>(2 * kChunk) * d) : nullptr;
  for (int c = job.slot_begin; c < max_lim; c += kChunk) {
    const int n = std::min(kChunk, max_lim - c);
    const int n8 = (n + 7) & ~7;
    // A tile over a long stored history streams its K/V from DRAM.
    PrefetchKvRows(p.kv, map, p.indices, c + kChunk, std::min(max_lim, c + 2 * kChunk), d);
    reader.Read(map, p.indices, c, n, d, widened, kp, vp);
    for (int j = n; j < n8; ++j) {  // padding: valid rows, masked below
      kp[j] = kp[0];
      vp[j] = vp[0];
    }
    for (int s = 0; s < n_sub; ++s) {
      SubTile& t = subs[s];
      if (c >= t.max_lim) continue;  // nothing of this chunk is visible to the sub-tile
      switch (t.rv) {
        case 1: TileChunk<1>(t, d, c, n8, kp, vp, st); break;
        case 2: TileChunk<2>(t, d, c, n8, kp, vp, st); break;
        default: TileChunk<3>(t, d, c, n8, kp, vp, st); break;
      }
    }
  }

  for (int s = 0; s < n_sub; ++s) {
    const SubTile& t = subs[s];
    alignas(64) float mbuf[kStride], lbuf[kStride];
    for (int v = 0; v < kVecs; ++v) {
      _mm512_store_ps(mbuf + 16 * v, t.m[v]);
      _mm512_store_ps(lbuf + 16 * v, t.l[v]);
    }
    for (int r = 0; r < t.n_rows; ++r) {
      const int64_t row = t.row0 + r;
      for (int i = 0; i < d; ++i) o[row * d + i] = t.ot[i * kStride + r];
      m_out[row] = mbuf[r];
      l_out[row] = lbuf[r];
    }
  }
}

// ---------------------------------------------------------------------------------------
// Row-major decode kernel.


// 16 K/V elements widened to f32: f32 rows as they are, f16 rows converted in the load.
inline __m512 LoadKv(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 LoadKv(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}


// P V for R rows over one 64-slot step, for VB vectors of head_dim starting at float
// `col`: ot[r][col..] = ot[r][col..] * alpha[r] + sum_j p[r][j] * V_j[col..]. JS x R x VB
// independent accumulators (>= 8) keep both FMA pipes busy despite the 4-cycle latency.

// `between(gi)` runs before each group of slots (the step's spread prefetch).
template <int R, int VB, int JS, int kD, class T, class Between>
inline void AccumulateRows(float* ot, const float* p /*[R][kDecodeChunk]*/, const T* const* vb,
                           const __m512* alpha, int col, int d_runtime, const Between& between) {
  const int d = kD ? kD : d_runtime;
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
  for (int gi = 0; gi < kGroups; ++gi) {
    between(gi);
    const T* vg = vb[gi] + col;
    const float* pg = p + gi * kGroup;
#pragma GCC unroll 16
    for (int j = 0; j < kGroup; j += JS) {
#pragma GCC unroll 8
      for (int js = 0; js < JS; ++js) {
        __m512 vv[VB];
#pragma GCC unroll 8
        for (int v = 0; v < VB; ++v) vv[v] = LoadKv(vg + (j + js) * d + 16 * v);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512 pr = _mm512_set1_ps(pg[r * kDecodeChunk + j + js]);
#pragma GCC unroll 8
          for (int v = 0; v < VB; ++v) acc[js][r][v] = _mm512_fmadd_ps(pr, vv[v], acc[js][r][v]);
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

// Row-major kernel for R rows (<= 8); kD = head_dim, or 0 for any multiple of 16.
// Each step takes 64 slots as 4 groups of 16: a group inside one block is read in place
// (rows head_dim apart); any other group (index lists, block edges, the tail) is first
// gathered into a local buffer, zero-padded. 64 slots per softmax step keep the serial
// max -> exp -> rescale chain short relative to the independent dot products.
// T: the KV element type (float, or uint16_t for f16, widened as it is loaded). q8_0
// rows: DecodeKernelQ8T (attention_avx512_decode.h).
template <int R, int kD, class T>
void DecodeKernelT(const AttendParams& p, const TileJob& job, float* o, float* m_out, float* l_out) {
  const int d = kD ? kD : p.shape.head_dim;
  const int dv = d / 16;
  float* qs = ThreadScratch(0, static_cast<size_t>(R) * d);
  float* ot = ThreadScratch(1, static_cast<size_t>(R) * d);
  constexpr bool f16 = sizeof(T) == 2;
  T* kbuf = reinterpret_cast<T*>(ThreadScratch(2, static_cast<size_t>(2 * kDecodeChunk) * d));
  T* vbuf = kbuf + kDecodeChunk * d;
  const T* k_pool = f16 ? reinterpret_cast<const T*>(p.kv.k_f16) : reinterpret_cast<const T*>(p.kv.k_pool);
  const T* v_pool = f16 ? reinterpret_cast<const T*>(p.kv.v_f16) : reinterpret_cast<const T*>(p.kv.v_pool);
  std::fill(ot, ot + static_cast<size_t>(R) * d, 0.0f);

  int32_t lim[R], min_lim, max_lim;
  LoadDecodeRows(p, job, R, qs, lim, &min_lim, &max_lim);
  __m512 m[R], lsum[R];
  for (int r = 0; r < R; ++r) {
    m[r] = _mm512_set1_ps(-FLT_MAX);
    lsum[r] = _mm512_setzero_ps();
  }

  const SlotMap map(p.kv, job.kv_head, d);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  alignas(64) float pbuf[R][kDecodeChunk];
  __m512 alpha[R];
  // The first step's rows now (the job before on this thread may have fetched them);
  // the next step's in (R + 1) x kGroups parts, one after each group of scores and of P V.
  PrefetchKvRows(p.kv, map, p.indices, job.slot_begin, std::min(max_lim, job.slot_begin + kDecodeChunk), d);
  StepPrefetch prefetch(p, job, map, max_lim, kDecodeChunk);
  constexpr int kParts = (R + 1) * kGroups;
  for (int c = job.slot_begin; c < max_lim; c += kDecodeChunk) {
    prefetch.Begin(c);
    const T* kb[kGroups];
    const T* vb[kGroups];
    DecodeGroups<kGroup, kGroups>(p, map, c, max_lim, k_pool, v_pool, kbuf, vbuf, kb, vb);
    const bool masked = c + kDecodeChunk > min_lim;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512 s[kGroups];
      for (int gi = 0; gi < kGroups; ++gi) {
        const T* k = kb[gi];
        __m512 acc[kGroup];
#pragma GCC unroll 16
        for (int j = 0; j < kGroup; ++j) acc[j] = _mm512_setzero_ps();
        if constexpr (kD > 0) {
          // Row by row, in address order, so the L2 streamer can run ahead in DRAM.
#pragma GCC unroll 16
          for (int j = 0; j < kGroup; ++j) {
#pragma GCC unroll 8
            for (int v = 0; v < kD / 16; ++v) {
              acc[j] = _mm512_fmadd_ps(_mm512_load_ps(qs + r * d + 16 * v), LoadKv(k + j * d + 16 * v), acc[j]);
            }
          }
        } else {
          for (int v = 0; v < dv; ++v) {
            const __m512 qv = _mm512_load_ps(qs + r * d + 16 * v);
#pragma GCC unroll 16
            for (int j = 0; j < kGroup; ++j) acc[j] = _mm512_fmadd_ps(qv, LoadKv(k + j * d + 16 * v), acc[j]);
          }
        }
        s[gi] = Reduce16(acc);
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
        constexpr int VB = DecodeVb(R, kD / 16);
        AccumulateRows<R, VB, DecodeJs(R, VB), kD, T>(ot + 16 * v0, pbuf[0], vb, alpha, 16 * v0, 0, between);
        v0 += VB;
      } else {
        AccumulateRows<R, 1, DecodeJs(R, 1), 0, T>(ot + 16 * v0, pbuf[0], vb, alpha, 16 * v0, d, between);
        ++v0;
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    std::copy_n(ot + r * d, d, o + static_cast<int64_t>(r) * d);
    m_out[r] = _mm512_cvtss_f32(m[r]);
    l_out[r] = _mm512_reduce_add_ps(lsum[r]);
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
  if (p.kv.k_q8 != nullptr && p.kv.v_q4 != nullptr) {
    return backend::GetCpuFeatures().avx512_vnni ? Avx512DecodeK8V4Vnni(p, job, o, m, l)
                                                 : DecodeKernelQ8</*kVnni=*/false, /*kV4=*/true>(p, job, o, m, l);
  }
  if (p.kv.k_q8 != nullptr) {
    return backend::GetCpuFeatures().avx512_vnni ? Avx512DecodeQ8Vnni(p, job, o, m, l)
                                                 : DecodeKernelQ8</*kVnni=*/false>(p, job, o, m, l);
  }
  if (p.kv.k_f16 != nullptr) return DecodeKernelE<uint16_t>(p, job, o, m, l);
  return DecodeKernelE<float>(p, job, o, m, l);
}

}  // namespace

KernelSet Avx512Kernels() {
  KernelSet ks;
  ks.tile = TransposedKernel;
  ks.tile_rows = kStride;
  ks.max_tiles_per_job = kMaxSubTiles;
  // A job pays a fixed cost per piece of slots (Q transposed in, O out, its partial
  // merged: ~10 us for 192 rows), so a short chunk over a long history is cut into fewer,
  // longer pieces: with 2 threads, chunks of 8-64 queries after 0.5-2K slots run 8-21%
  // faster at 2 pieces per thread than at 8, and no case is slower (best of 30-40 calls
  // of each plan, the plans alternating call by call in one attention_bench --only chunk
  // process; separate processes differed by +-10% run to run). The decode kernel keeps 8.
  ks.tile_jobs_per_thread = 2;
  ks.few = DecodeKernel;
  ks.few_rows_max = kDecodeRows;
  ks.few_head_dim_multiple = 16;
  ks.few_q8_quantizes_query = backend::GetCpuFeatures().avx512_vnni;
  ks.few_k8_v4 = true;
  return ks;
}

}  // namespace attic::attention::internal

namespace attic::attention::internal {

void Avx512DecodeQ8NoVnni(const AttendParams& p, const TileJob& job, float* o, float* m, float* l) {
  DecodeKernelQ8</*kVnni=*/false>(p, job, o, m, l);
}

void Avx512DecodeK8V4NoVnni(const AttendParams& p, const TileJob& job, float* o, float* m, float* l) {
  DecodeKernelQ8</*kVnni=*/false, /*kV4=*/true>(p, job, o, m, l);
}

}  // namespace attic::attention::internal
