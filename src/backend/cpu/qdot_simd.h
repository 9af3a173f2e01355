// Internal: the block-quantized GEMV's loop (qdot.h) for the SIMD ISAs, included by
// qdot_avx2.cc (vpmaddubsw + vpmaddwd) and qdot_vnni.cc (vpdpbusd), each compiled for its
// ISA. Dot::Chunk(q, xq) returns the 8 int32 sums of 4 consecutive products q_i * xq_i of
// a 32-element chunk (lanes 0-3: its first 16 elements, 4-7: the next 16); both forms take
// |q| as the unsigned operand and xq with q's sign (|q|, |xq| <= 127: no int16 overflow).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "attic/tensor/quants.h"
#include "backend/cpu/qdot.h"

namespace attic::backend::cpu {

inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// DecodeBlock with SIMD code for the types of llama.cpp's common presets (q4_0, q5_0,
// q5_1, q4_k, q6_k); the same codes, scales and offsets as DecodeBlock (qdot_test checks both).
inline void FastDecode(DType t, const uint8_t* b, DecodedBlock* o) {
  const __m128i m4 = _mm_set1_epi8(0x0F);
  switch (t) {
    case DType::kQ4_0: {
      const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
      // One 32-byte store: the dot product's 32-byte load then forwards from it (two
      // 16-byte stores would stall it).
      const __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
      _mm256_store_si256(reinterpret_cast<__m256i*>(o->q), _mm256_sub_epi8(codes, _mm256_set1_epi8(8)));
      o->sc[0] = o->sc[1] = HalfAt(b);
      o->mn[0] = o->mn[1] = 0.0f;
      return;
    }
    case DType::kQ5_0:
    case DType::kQ5_1: {
      // Element j (< 32) takes bit j of the little-endian u32 qh as its fifth bit: byte j
      // of a copy of qh's byte j / 8, tested against bit j % 8.
      const bool has_min = t == DType::kQ5_1;
      const uint8_t* p = b + (has_min ? 4 : 2);
      uint32_t qh;
      std::memcpy(&qh, p, 4);
      const __m256i idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                           3, 3, 3, 3, 3, 3, 3);
      const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
      const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), idx);
      const __m256i fifth = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
      const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
      __m256i codes = _mm256_or_si256(
          _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4)), fifth);
      if (!has_min) codes = _mm256_sub_epi8(codes, _mm256_set1_epi8(16));
      _mm256_store_si256(reinterpret_cast<__m256i*>(o->q), codes);
      o->sc[0] = o->sc[1] = HalfAt(b);
      o->mn[0] = o->mn[1] = has_min ? HalfAt(b + 2) : 0.0f;
      return;
    }
    case DType::kQ4_K: {
      const float d = HalfAt(b), dmin = HalfAt(b + 2);
      const __m256i m4w = _mm256_set1_epi8(0x0F);
      for (int c = 0; c < 4; ++c) {
        const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
        _mm256_store_si256(reinterpret_cast<__m256i*>(o->q + 64 * c), _mm256_and_si256(qs, m4w));
        _mm256_store_si256(reinterpret_cast<__m256i*>(o->q + 64 * c + 32),
                           _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4w));
      }
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, mn;
        KQuantScaleMin(j, b + 4, &sc, &mn);
        o->sc[2 * j] = o->sc[2 * j + 1] = d * static_cast<float>(sc);
        o->mn[2 * j] = o->mn[2 * j + 1] = -(dmin * static_cast<float>(mn));
      }
      return;
    }
    case DType::kQ6_K: {
      const float d = HalfAt(b + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const __m256i m4w = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b + 64 * h;
        const uint8_t* qh = b + 128 + 32 * h;
        const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
        const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
        int8_t* q = o->q + 128 * h;
        const __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4w), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
        const __m256i q1 = _mm256_or_si256(_mm256_and_si256(l1, m4w), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
        const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4w), _mm256_and_si256(hb, m30));
        const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4w),
                                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        _mm256_store_si256(reinterpret_cast<__m256i*>(q), _mm256_sub_epi8(q0, k32));
        _mm256_store_si256(reinterpret_cast<__m256i*>(q + 32), _mm256_sub_epi8(q1, k32));
        _mm256_store_si256(reinterpret_cast<__m256i*>(q + 64), _mm256_sub_epi8(q2, k32));
        _mm256_store_si256(reinterpret_cast<__m256i*>(q + 96), _mm256_sub_epi8(q3, k32));
      }
      for (int g = 0; g < 16; ++g) {
        o->sc[g] = d * static_cast<float>(sc[g]);
        o->mn[g] = 0.0f;
      }
      return;
    }
    default: DecodeBlock(t, b, o); return;
  }
}

template <class Dot>
void GemvQuantT(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                int64_t n1) {
  const int64_t k = w.cols(), n = w.rows(), rb = QuantXRowBytes(k);
  const int64_t bs = DTypeBlockSize(w.dtype), nblk = k / bs;
  const size_t bb = DTypeBlockBytes(w.dtype);
  const uint8_t* xb = reinterpret_cast<const uint8_t*>(xp);
  // Types whose decoded offsets are all zero skip the offset term.
  const bool has_mn = w.dtype == DType::kQ4_1 || w.dtype == DType::kQ5_1 || w.dtype == DType::kQ2_K ||
                      w.dtype == DType::kQ4_K || w.dtype == DType::kQ5_K;
  constexpr int kMaxM = 16;
  DecodedBlock blk;
  for (int64_t j = n0; j < n1; ++j) {
    const uint8_t* row = w.row(j);
    for (int64_t i0 = 0; i0 < m; i0 += kMaxM) {
      const int64_t mm = std::min<int64_t>(kMaxM, m - i0);
      __m256 acc[kMaxM];
      float macc[kMaxM];
      for (int64_t i = 0; i < mm; ++i) {
        acc[i] = _mm256_setzero_ps();
        macc[i] = 0.0f;
      }
      for (int64_t b = 0; b < nblk; ++b) {
        if (b + 1 < nblk) _mm_prefetch(reinterpret_cast<const char*>(row + (b + 1) * bb) + 64, _MM_HINT_T0);
        FastDecode(w.dtype, row + b * bb, &blk);
        for (int64_t i = 0; i < mm; ++i) {
          const uint8_t* xr = xb + (i0 + i) * rb;
          const int8_t* xq = reinterpret_cast<const int8_t*>(xr) + b * bs;
          const float* dx = reinterpret_cast<const float*>(xr + k) + b * bs / 32;
          const int32_t* s = reinterpret_cast<const int32_t*>(xr + k + 4 * (k / 32)) + b * bs / 16;
          for (int64_t c = 0; c < bs / 32; ++c) {
            const __m256i v = Dot::Chunk(blk.q + 32 * c, xq + 32 * c);
            const __m256 sc = _mm256_set_m128(_mm_set1_ps(blk.sc[2 * c + 1] * dx[c]), _mm_set1_ps(blk.sc[2 * c] * dx[c]));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), sc, acc[i]);
            if (has_mn) {
              macc[i] += dx[c] * (blk.mn[2 * c] * static_cast<float>(s[2 * c]) +
                                  blk.mn[2 * c + 1] * static_cast<float>(s[2 * c + 1]));
            }
          }
        }
      }
      for (int64_t i = 0; i < mm; ++i) {
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        const float v = _mm_cvtss_f32(h) + macc[i];
        y[(i0 + i) * n + j] = bias ? v + bias[j] : v;
      }
    }
  }
}

}  // namespace attic::backend::cpu
