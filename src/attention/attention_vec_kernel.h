// The transposed flash-attention tile kernel written with GCC/Clang vector extensions of
// W floats, shared by the portable kernel (W = 4: one SSE register on baseline x86-64)
// and the AVX2 kernel (W = 8, compiled with -mavx2 -mfma). Vector v of a tile holds W rows:
//   S^T[j][rows] = sum_i K[j][i] * Q^T[i][rows],   O^T[i][rows] += V[j][i] * P^T[j][rows].
// Rows are padded to a multiple of W only, so a decode step (a few rows) stays cheap.
//
// Everything here has internal linkage: each including file gets its own copy compiled
// for its own ISA (a shared inline definition could let the linker pick the AVX2 one).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "attention/attention_internal.h"

namespace attic::attention::internal {
namespace {

constexpr int kVecRows = 32;  // rows per tile
constexpr int kVecChunk = 32;  // slots per online-softmax step

// (vector_size on a type that depends on W is ignored by GCC 12, so spell each width out.)
template <int W>
struct VecTypes;
template <>
struct VecTypes<4> {
  typedef float F __attribute__((vector_size(16)));
  typedef int32_t I __attribute__((vector_size(16)));
};
template <>
struct VecTypes<8> {
  typedef float F __attribute__((vector_size(32)));
  typedef int32_t I __attribute__((vector_size(32)));
};

template <int W>
struct Vec {
  using F = typename VecTypes<W>::F;
  using I = typename VecTypes<W>::I;
  static F Splat(float x) { return x - F{}; }
  static F Load(const float* p) { return *reinterpret_cast<const F*>(p); }  // 4W-byte aligned
  static void Store(float* p, F v) { *reinterpret_cast<F*>(p) = v; }

  // 2^x for x <= 0 (Cephes exp2f polynomial on [-0.5, 0.5]); 0 below -126 (and -inf).
  static F Exp2(F x) {
    const I valid = x >= Splat(-126.0f);
    x = x < Splat(-126.0f) ? Splat(-126.0f) : x;
    const F y = x + 0.5f;
    I n = __builtin_convertvector(y, I);  // truncates toward zero
    F nf = __builtin_convertvector(n, F);
    const I too_big = nf > y;  // -1 where truncation rounded up: floor = n - 1
    n += too_big;
    nf += __builtin_convertvector(too_big, F);
    const F f = x - nf;
    F p = Splat(1.535336188319500e-4f);
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    const F scale = reinterpret_cast<F>((n + 127) << 23);
    return valid ? p * scale : Splat(0.0f);
  }
};

template <int W>
void VecTile(const AttendParams& p, const TileJob& job, float* o, float* m_out, float* l_out) {
  using V = Vec<W>;
  using F = typename V::F;
  using I = typename V::I;
  constexpr int kRows = kVecRows;
  constexpr int kChunk = kVecChunk;
  // Register blocks of 8 independent accumulators: enough to cover the FMA latency.
  constexpr int kJb = 8;  // slots per score block
  constexpr int kIb = 8;  // head dims per output block
  const int d = p.shape.head_dim;
  const int n_rows = job.n_rows;
  const int nv = (n_rows + W - 1) / W;  // row vectors in use
  const int g = p.group;
  const float qscale = p.shape.scale * kLog2e;
  // Layouts: qt, ot [d][kRows]; st [kChunk][kRows]; vector v holds rows [W v, W v + W).
  float* qt = ThreadScratch(0, static_cast<size_t>(d) * kRows);
  float* ot = ThreadScratch(1, static_cast<size_t>(d) * kRows);
  float* st = ThreadScratch(2, static_cast<size_t>(kChunk) * kRows);
  for (int i = 0; i < d; ++i) {
    for (int v = 0; v < nv; ++v) {
      V::Store(qt + i * kRows + W * v, V::Splat(0.0f));
      V::Store(ot + i * kRows + W * v, V::Splat(0.0f));
    }
  }

  alignas(64) int32_t lim[kRows] = {};  // visible virtual slots per row within this job
  int32_t min_lim = INT32_MAX, max_lim = 0;
  for (int r = 0; r < n_rows; ++r) {
    const int64_t row = job.row_begin + r;
    const int64_t query = row / g;
    const int head = job.kv_head * g + static_cast<int>(row % g);
    const float* src = p.q + (query * p.shape.n_heads + head) * d;
    for (int i = 0; i < d; ++i) qt[i * kRows + r] = src[i] * qscale;
    lim[r] = std::min(p.n_vis[query], job.slot_end);
    min_lim = std::min(min_lim, lim[r]);
    max_lim = std::max(max_lim, lim[r]);
  }
  F m[kRows / W], l[kRows / W], alpha[kRows / W];
  for (int v = 0; v < nv; ++v) {
    m[v] = V::Splat(-FLT_MAX);
    l[v] = V::Splat(0.0f);
  }

  const SlotMap map(p.kv, job.kv_head, d);
  const float* kp[kChunk];
  const float* vp[kChunk];
  const KvRowReader reader(p.kv, job.kv_head, d);
  float* widened = reader.widens() ? ThreadScratch(kF16Scratch, static_cast<size_t>(2 * kChunk) * d) : nullptr;
  for (int c = job.slot_begin; c < max_lim; c += kChunk) {
    const int n = std::min(kChunk, max_lim - c);
    const int nb = (n + kJb - 1) / kJb * kJb;
    reader.Read(map, p.indices, c, n, d, widened, kp, vp);
    for (int j = n; j < nb; ++j) {  // padding: valid rows, masked below
      kp[j] = kp[0];
      vp[j] = vp[0];
    }
    // Scores, kJb slots x W rows at a time.
    for (int v = 0; v < nv; ++v) {
      for (int j = 0; j < nb; j += kJb) {
        F a[kJb];
#pragma GCC unroll 8
        for (int b = 0; b < kJb; ++b) a[b] = V::Splat(0.0f);
        for (int i = 0; i < d; ++i) {
          const F q = V::Load(qt + i * kRows + W * v);
#pragma GCC unroll 8
          for (int b = 0; b < kJb; ++b) a[b] += kp[j + b][i] * q;
        }
#pragma GCC unroll 8
        for (int b = 0; b < kJb; ++b) V::Store(st + (j + b) * kRows + W * v, a[b]);
      }
    }
    // Online softmax; slots at or beyond a row's limit get -inf (and then weight 0).
    const bool masked = c + nb > min_lim;
    for (int v = 0; v < nv; ++v) {
      const I lv = *reinterpret_cast<const I*>(lim + W * v);
      F mx = m[v];
      for (int j = 0; j < nb; ++j) {
        F s = V::Load(st + j * kRows + W * v);
        if (masked) {
          s = lv > (c + j) ? s : V::Splat(-INFINITY);
          V::Store(st + j * kRows + W * v, s);
        }
        mx = mx > s ? mx : s;
      }
      alpha[v] = V::Exp2(m[v] - mx);
      m[v] = mx;
      F sum = V::Splat(0.0f);
      for (int j = 0; j < nb; ++j) {
        const F e = V::Exp2(V::Load(st + j * kRows + W * v) - mx);
        V::Store(st + j * kRows + W * v, e);
        sum += e;
      }
      l[v] = l[v] * alpha[v] + sum;
    }
    // O^T = O^T * alpha + P V, kIb dims x W rows at a time.
    for (int v = 0; v < nv; ++v) {
      int i = 0;
      for (; i + kIb <= d; i += kIb) {
        F a[kIb];
#pragma GCC unroll 8
        for (int b = 0; b < kIb; ++b) a[b] = V::Load(ot + (i + b) * kRows + W * v) * alpha[v];
        for (int j = 0; j < nb; ++j) {
          const F pj = V::Load(st + j * kRows + W * v);
          const float* vr = vp[j] + i;
#pragma GCC unroll 8
          for (int b = 0; b < kIb; ++b) a[b] += vr[b] * pj;
        }
#pragma GCC unroll 8
        for (int b = 0; b < kIb; ++b) V::Store(ot + (i + b) * kRows + W * v, a[b]);
      }
      for (; i < d; ++i) {
        F a = V::Load(ot + i * kRows + W * v) * alpha[v];
        for (int j = 0; j < nb; ++j) a += vp[j][i] * V::Load(st + j * kRows + W * v);
        V::Store(ot + i * kRows + W * v, a);
      }
    }
  }

  alignas(64) float mbuf[kRows], lbuf[kRows];
  for (int v = 0; v < nv; ++v) {
    V::Store(mbuf + W * v, m[v]);
    V::Store(lbuf + W * v, l[v]);
  }
  for (int r = 0; r < n_rows; ++r) {
    for (int i = 0; i < d; ++i) o[static_cast<int64_t>(r) * d + i] = ot[i * kRows + r];
    m_out[r] = mbuf[r];
    l_out[r] = lbuf[r];
  }
}

}  // namespace
}  // namespace attic::attention::internal
