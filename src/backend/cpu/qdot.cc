// Block-quantized GEMV (qdot.h): x's quantization, the weight blocks' decoding, and the
// portable kernel every ISA's is tested against.
#include "backend/cpu/qdot.h"

#include <cmath>
#include <cstring>

#include "attic/tensor/quants.h"
#include "backend/cpu/kernel_table.h"

namespace attic::backend::cpu {

namespace {

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

// Groups of 32 with one scale: both halves' sc/mn equal.
void Set32(DecodedBlock* o, int g32, float sc, float mn) {
  o->sc[2 * g32] = o->sc[2 * g32 + 1] = sc;
  o->mn[2 * g32] = o->mn[2 * g32 + 1] = mn;
}

}  // namespace

void DecodeBlock(DType t, const uint8_t* b, DecodedBlock* o) {
  int8_t* q = o->q;
  switch (t) {
    case DType::kQ4_0:
    case DType::kIQ4_NL: {
      const bool nl = t == DType::kIQ4_NL;
      for (int j = 0; j < 16; ++j) {
        const int lo = b[2 + j] & 0xF, hi = b[2 + j] >> 4;
        q[j] = static_cast<int8_t>(nl ? kIq4nlValues[lo] : lo - 8);
        q[j + 16] = static_cast<int8_t>(nl ? kIq4nlValues[hi] : hi - 8);
      }
      Set32(o, 0, Half(b), 0.0f);
      return;
    }
    case DType::kQ4_1:
      for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<int8_t>(b[4 + j] & 0xF);
        q[j + 16] = static_cast<int8_t>(b[4 + j] >> 4);
      }
      Set32(o, 0, Half(b), Half(b + 2));
      return;
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const bool has_min = t == DType::kQ5_1;
      const uint8_t* p = b + (has_min ? 4 : 2);
      uint32_t qh;
      std::memcpy(&qh, p, 4);
      const int off = has_min ? 0 : 16;
      for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<int8_t>(((p[4 + j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4)) - off);
        q[j + 16] = static_cast<int8_t>(((p[4 + j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4)) - off);
      }
      Set32(o, 0, Half(b), has_min ? Half(b + 2) : 0.0f);
      return;
    }
    case DType::kQ8_0:
      std::memcpy(q, b + 2, 32);
      Set32(o, 0, Half(b), 0.0f);
      return;
    case DType::kQ2_K: {
      const uint8_t* qs = b + 16;
      const float d = Half(b + 80), dmin = Half(b + 82);
      int g = 0;
      for (int half = 0; half < 2; ++half, qs += 32)
        for (int shift = 0; shift < 8; shift += 2)
          for (int h = 0; h < 2; ++h, ++g) {
            o->sc[g] = d * static_cast<float>(b[g] & 0xF);
            o->mn[g] = -(dmin * static_cast<float>(b[g] >> 4));
            for (int l = 0; l < 16; ++l) q[16 * g + l] = static_cast<int8_t>((qs[16 * h + l] >> shift) & 3);
          }
      return;
    }
    case DType::kQ3_K: {
      const uint8_t* hmask = b;
      const uint8_t* qs = b + 32;
      uint8_t sc[16];
      Q3KScales(b + 96, sc);
      const float d = Half(b + 108);
      int g = 0;
      uint8_t m = 1;
      for (int half = 0; half < 2; ++half, qs += 32)
        for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1))
          for (int h = 0; h < 2; ++h, ++g) {
            o->sc[g] = d * static_cast<float>(static_cast<int>(sc[g]) - 32);
            o->mn[g] = 0.0f;
            for (int l = 0; l < 16; ++l)
              q[16 * g + l] =
                  static_cast<int8_t>(((qs[16 * h + l] >> shift) & 3) - ((hmask[16 * h + l] & m) ? 0 : 4));
          }
      return;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool five = t == DType::kQ5_K;
      const float d = Half(b), dmin = Half(b + 2);
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int c = 0; c < 4; ++c, qs += 32)
        for (int h = 0; h < 2; ++h) {
          uint8_t sc, mn;
          KQuantScaleMin(2 * c + h, b + 4, &sc, &mn);
          Set32(o, 2 * c + h, d * static_cast<float>(sc), -(dmin * static_cast<float>(mn)));
          int8_t* qq = q + 32 * (2 * c + h);
          for (int l = 0; l < 32; ++l) {
            int v = h == 0 ? (qs[l] & 0xF) : (qs[l] >> 4);
            if (five && ((qh[l] >> (2 * c + h)) & 1)) v += 16;
            qq[l] = static_cast<int8_t>(v);
          }
        }
      return;
    }
    case DType::kQ6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = Half(b + 208);
      for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, q += 128) {
        for (int l = 0; l < 32; ++l) {
          q[l] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
          q[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
          q[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
          q[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
        for (int g = 0; g < 8; ++g) {
          o->sc[8 * half + g] = d * static_cast<float>(sc[g]);
          o->mn[8 * half + g] = 0.0f;
        }
      }
      return;
    }
    case DType::kIQ4_XS: {
      const float d = Half(b);
      uint16_t scales_h;
      std::memcpy(&scales_h, b + 2, 2);
      const uint8_t* qs = b + 8;
      for (int ib = 0; ib < 8; ++ib, qs += 16) {
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
        Set32(o, ib, d * static_cast<float>(ls - 32), 0.0f);
        for (int j = 0; j < 16; ++j) {
          q[32 * ib + j] = kIq4nlValues[qs[j] & 0xF];
          q[32 * ib + j + 16] = kIq4nlValues[qs[j] >> 4];
        }
      }
      return;
    }
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: return;
  }
}

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
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xr[32 * b + j]));
      const float d = amax / 127.0f;
      const float id = d > 0.0f ? 1.0f / d : 0.0f;
      dx[b] = d;
      for (int h = 0; h < 2; ++h) {
        int32_t sum = 0;
        for (int j = 16 * h; j < 16 * h + 16; ++j) {
          const float v = std::nearbyint(xr[32 * b + j] * id);
          const int qv = static_cast<int>(std::max(-127.0f, std::min(127.0f, v)));
          xq[32 * b + j] = static_cast<int8_t>(qv);
          sum += qv;
        }
        s[2 * b + h] = sum;
      }
    }
  }
  return reinterpret_cast<const float*>(base);
}

namespace generic {

void GemvQuant(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
               int64_t n1) {
  const int64_t k = w.cols(), n = w.rows(), rb = QuantXRowBytes(k);
  const int64_t bs = DTypeBlockSize(w.dtype), nblk = k / bs;
  const size_t bb = DTypeBlockBytes(w.dtype);
  const uint8_t* xb = reinterpret_cast<const uint8_t*>(xp);
  constexpr int kMaxM = 64;
  DecodedBlock blk;
  for (int64_t j = n0; j < n1; ++j) {
    const uint8_t* row = w.row(j);
    for (int64_t i0 = 0; i0 < m; i0 += kMaxM) {
      const int64_t mm = std::min<int64_t>(kMaxM, m - i0);
      float acc[kMaxM] = {};
      for (int64_t b = 0; b < nblk; ++b) {
        DecodeBlock(w.dtype, row + b * bb, &blk);
        for (int64_t i = 0; i < mm; ++i) {
          const uint8_t* xr = xb + (i0 + i) * rb;
          const int8_t* xq = reinterpret_cast<const int8_t*>(xr) + b * bs;
          const float* dx = reinterpret_cast<const float*>(xr + k) + b * bs / 32;
          const int32_t* s = reinterpret_cast<const int32_t*>(xr + k + 4 * (k / 32)) + b * bs / 16;
          float a = 0.0f;
          for (int64_t c = 0; c < bs / 32; ++c) {
            float part = 0.0f;
            for (int h = 0; h < 2; ++h) {
              const int g = static_cast<int>(2 * c + h);
              int32_t isum = 0;
              for (int l = 0; l < 16; ++l) isum += static_cast<int32_t>(blk.q[16 * g + l]) * xq[16 * g + l];
              part += blk.sc[g] * static_cast<float>(isum) + blk.mn[g] * static_cast<float>(s[g]);
            }
            a += dx[c] * part;
          }
          acc[i] += a;
        }
      }
      for (int64_t i = 0; i < mm; ++i) y[(i0 + i) * n + j] = bias ? acc[i] + bias[j] : acc[i];
    }
  }
}

}  // namespace generic

}  // namespace attic::backend::cpu
