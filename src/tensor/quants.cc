// Dequantization of the GGUF block formats (layouts: attic/tensor/quants.h). Plain scalar
// code: this is the definition the kernels are tested against and the path that widens
// embedding rows and norms. Compiled without FMA contraction so each product and sum is
// rounded as written.
#include "attic/tensor/quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#pragma GCC optimize("fp-contract=off")

namespace attic {

const int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

namespace {

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

void Q4_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((b[2 + j] & 0xF) - 8);
    y[j + 16] = d * static_cast<float>((b[2 + j] >> 4) - 8);
  }
}

void Q4_1(const uint8_t* b, float* y) {
  const float d = Half(b), m = Half(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(b[4 + j] & 0xF) + m;
    y[j + 16] = d * static_cast<float>(b[4 + j] >> 4) + m;
  }
}

// q5_0 / q5_1: bit j of the little-endian u32 qh is the fifth bit of element j.
void Q5(const uint8_t* b, float* y, bool has_min) {
  const float d = Half(b), m = has_min ? Half(b + 2) : 0.0f;
  const uint8_t* p = b + (has_min ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const uint8_t* qs = p + 4;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    if (has_min) {
      y[j] = d * static_cast<float>(lo) + m;
      y[j + 16] = d * static_cast<float>(hi) + m;
    } else {
      y[j] = d * static_cast<float>(lo - 16);
      y[j + 16] = d * static_cast<float>(hi - 16);
    }
  }
}

void Q8_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j]);
}

void Iq4Nl(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4nlValues[b[2 + j] & 0xF]);
    y[j + 16] = d * static_cast<float>(kIq4nlValues[b[2 + j] >> 4]);
  }
}

// q2_k: two halves of 128; in each, 2-bit plane `shift` of qs[0..32) gives 32 elements,
// the first 16 from qs[0..16) and the next 16 from qs[16..32), each 16 with its own scale.
void Q2K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = Half(b + 80), dmin = Half(b + 82);
  int is = 0;
  for (int half = 0; half < 2; ++half, qs += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int g = 0; g < 2; ++g) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((qs[16 * g + l] >> shift) & 3) - ml;
      }
    }
  }
}

void Q3K(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  uint8_t sc[16];
  Q3KScales(b + 96, sc);
  const float d = Half(b + 108);
  int is = 0;
  uint8_t m = 1;
  for (int half = 0; half < 2; ++half, qs += 32) {
    for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
      for (int g = 0; g < 2; ++g) {
        const float dl = d * static_cast<float>(static_cast<int>(sc[is++]) - 32);
        for (int l = 0; l < 16; ++l) {
          const int q = ((qs[16 * g + l] >> shift) & 3) - ((hmask[16 * g + l] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(q);
        }
      }
    }
  }
}

// q4_k / q5_k: four chunks of 64 elements from 32 bytes of qs: the low nibbles (group
// 2c) then the high nibbles (group 2c + 1); q5_k's fifth bits are bit 2c / 2c + 1 of qh[l].
void Q45K(const uint8_t* b, float* y, bool five) {
  const float d = Half(b), dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five ? 48 : 16);
  for (int c = 0; c < 4; ++c, qs += 32) {
    for (int g = 0; g < 2; ++g) {
      uint8_t sc, mn;
      KQuantScaleMin(2 * c + g, scales, &sc, &mn);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
      for (int l = 0; l < 32; ++l) {
        int q = g == 0 ? (qs[l] & 0xF) : (qs[l] >> 4);
        if (five && (qh[l] >> (2 * c + g)) & 1) q += 16;
        *y++ = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

// q6_k: two halves of 128 elements; in each, element l (< 32) of its four 32-runs takes
// its low 4 bits from ql[l] / ql[l + 32] (low, low, high, high nibble) and its top 2 bits
// from bits 0-1, 2-3, 4-5, 6-7 of qh[l]; scales per 16 elements.
void Q6K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

void Iq4Xs(const uint8_t* b, float* y) {
  const float d = Half(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < 8; ++ib, y += 32, qs += 16) {
    const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
      y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
    }
  }
}

}  // namespace

void Q3KScales(const uint8_t* p, uint8_t out[16]) {
  for (int i = 0; i < 4; ++i) {
    out[i] = static_cast<uint8_t>((p[i] & 0xF) | (((p[8 + i] >> 0) & 3) << 4));
    out[4 + i] = static_cast<uint8_t>((p[4 + i] & 0xF) | (((p[8 + i] >> 2) & 3) << 4));
    out[8 + i] = static_cast<uint8_t>((p[i] >> 4) | (((p[8 + i] >> 4) & 3) << 4));
    out[12 + i] = static_cast<uint8_t>((p[4 + i] >> 4) | (((p[8 + i] >> 6) & 3) << 4));
  }
}

void DequantizeBlocks(DType t, const void* src, float* dst, size_t n) {
  const uint8_t* s = static_cast<const uint8_t*>(src);
  const size_t bs = static_cast<size_t>(DTypeBlockSize(t)), bb = DTypeBlockBytes(t);
  for (size_t i = 0; i < n / bs; ++i, s += bb, dst += bs) {
    switch (t) {
      case DType::kQ4_0: Q4_0(s, dst); break;
      case DType::kQ4_1: Q4_1(s, dst); break;
      case DType::kQ5_0: Q5(s, dst, false); break;
      case DType::kQ5_1: Q5(s, dst, true); break;
      case DType::kQ8_0: Q8_0(s, dst); break;
      case DType::kIQ4_NL: Iq4Nl(s, dst); break;
      case DType::kQ2_K: Q2K(s, dst); break;
      case DType::kQ3_K: Q3K(s, dst); break;
      case DType::kQ4_K: Q45K(s, dst, false); break;
      case DType::kQ5_K: Q45K(s, dst, true); break;
      case DType::kQ6_K: Q6K(s, dst); break;
      case DType::kIQ4_XS: Iq4Xs(s, dst); break;
      case DType::kF32:
      case DType::kF16:
      case DType::kBF16: return;  // not block types
    }
  }
}

}  // namespace attic

// ---- Quantization: llama.cpp's reference algorithms (quantize_row_*_ref), as described
// in its ggml-quants.c, written here. ----

namespace attic {

namespace {

void PutHalf(uint8_t* p, float v) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(p, &h, 2);
}

// Round to nearest, ties to even (ggml's nearest_int for |v| < 2^22).
int NearestInt(float v) { return static_cast<int>(std::nearbyint(v)); }

constexpr float kGroupMaxEps = 1e-15f;

// Symmetric blocks of 32 with `nlev` levels (q4_0: 16, q5_0: 32): d = signed max / -(nlev/2),
// codes (x / d + nlev/2 + 0.5) truncated, capped at nlev - 1.
void QuantSym32(const float* x, uint8_t* b, int nlev) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / static_cast<float>(-nlev / 2);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  PutHalf(b, d);
  uint8_t codes[32];
  for (int j = 0; j < 32; ++j) {
    const int c = static_cast<int8_t>(x[j] * id + (static_cast<float>(nlev / 2) + 0.5f));
    codes[j] = static_cast<uint8_t>(std::min(nlev - 1, c));
  }
  if (nlev == 16) {
    for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(codes[j] | (codes[j + 16] << 4));
  } else {
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      b[6 + j] = static_cast<uint8_t>((codes[j] & 0xF) | ((codes[j + 16] & 0xF) << 4));
      qh |= static_cast<uint32_t>((codes[j] >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((codes[j + 16] >> 4) & 1) << (j + 16);
    }
    std::memcpy(b + 2, &qh, 4);
  }
}

// Blocks of 32 with a min (q4_1: 16 levels, q5_1: 32): d = (max - min) / (nlev - 1).
void QuantMin32(const float* x, uint8_t* b, int nlev) {
  float min = x[0], max = x[0];
  for (int j = 1; j < 32; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / static_cast<float>(nlev - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  PutHalf(b, d);
  PutHalf(b + 2, min);
  uint8_t codes[32];
  for (int j = 0; j < 32; ++j) {
    const int c = static_cast<int8_t>((x[j] - min) * id + 0.5f);
    codes[j] = static_cast<uint8_t>(std::min(nlev - 1, c));
  }
  if (nlev == 16) {
    for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(codes[j] | (codes[j + 16] << 4));
  } else {
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      b[8 + j] = static_cast<uint8_t>((codes[j] & 0xF) | ((codes[j + 16] & 0xF) << 4));
      qh |= static_cast<uint32_t>((codes[j] >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((codes[j + 16] >> 4) & 1) << (j + 16);
    }
    std::memcpy(b + 4, &qh, 4);
  }
}

void QuantQ8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  PutHalf(b, d);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
}

// A scale and min for n values with weights: codes in [0, nmax], least squares over a
// search of nstep + 1 candidate scales around the max-min range (the K-quants' search).
// Returns the scale; *the_min gets -min (>= 0).
float MakeQkx2Quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                     uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1.0f / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = NearestInt(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    const float diff = scale * static_cast<float>(L[i]) + min - x[i];
    best_error += weights[i] * diff * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, NearestInt(iscale * (x[i] - min))));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * static_cast<float>(l);
      sum_l2 += w * static_cast<float>(l * l);
      sum_xl += w * static_cast<float>(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        cur_error += weights[i] * diff * diff;
      }
      if (cur_error < best_error) {
        std::memcpy(L, Laux, static_cast<size_t>(n));
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// A symmetric scale for n values, codes in [-nmax, nmax - 1] stored + nmax, weights x^2,
// refined over 18 candidate scales (q6_k's groups of 16).
float MakeQxQuants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  auto pass = [&](float iscale, float* sumlx, float* suml2, int8_t* out) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i])));
      if (out != nullptr) out[i] = static_cast<int8_t>(l + nmax);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * static_cast<float>(l);
      *suml2 += w * static_cast<float>(l * l);
    }
  };
  float sumlx, suml2;
  pass(-static_cast<float>(nmax) / max, &sumlx, &suml2, L);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    pass(iscale, &sumlx, &suml2, nullptr);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      pass(iscale, &sumlx, &suml2, L);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void QuantQ4K(const float* x, uint8_t* b) {
  uint8_t L[256], Laux[32];
  float weights[32], mins[8], scales[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = MakeQkx2Quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.0f, 0.1f, 20);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t* sc = b + 4;
  std::memset(sc, 0, 12);
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = static_cast<uint8_t>(std::min(63, NearestInt(inv_scale * scales[j])));
    const uint8_t lm = static_cast<uint8_t>(std::min(63, NearestInt(inv_min * mins[j])));
    if (j < 4) {
      sc[j] = ls;
      sc[j + 4] = lm;
    } else {
      sc[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      sc[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      sc[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  PutHalf(b, max_scale / 63.0f);
  PutHalf(b + 2, max_min / 63.0f);
  const float d_all = Half(b), dmin_all = Half(b + 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    KQuantScaleMin(j, sc, &s, &m);
    const float d = d_all * static_cast<float>(s);
    if (d == 0.0f) continue;
    const float dm = dmin_all * static_cast<float>(m);
    for (int i = 0; i < 32; ++i) {
      L[32 * j + i] = static_cast<uint8_t>(std::max(0, std::min(15, NearestInt((x[32 * j + i] + dm) / d))));
    }
  }
  uint8_t* q = b + 16;
  for (int j = 0; j < 256; j += 64, q += 32)
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
}

void QuantQ6K(const float* x, uint8_t* b) {
  int8_t L[256];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < 16; ++ib) {
    scales[ib] = MakeQxQuants(16, 32, x + 16 * ib, L + 16 * ib);
    if (std::fabs(scales[ib]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[ib]);
      max_scale = scales[ib];
    }
  }
  std::memset(b, 0, 210);
  if (max_abs_scale < kGroupMaxEps) return;  // all zero (d = +0)
  const float iscale = -128.0f / max_scale;
  PutHalf(b + 208, 1.0f / iscale);
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  for (int ib = 0; ib < 16; ++ib) sc[ib] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[ib])));
  const float d_all = Half(b + 208);
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<float>(sc[j]);
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i) {
      L[16 * j + i] = static_cast<int8_t>(std::max(-32, std::min(31, NearestInt(x[16 * j + i] / d))) + 32);
    }
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int j = 0; j < 256; j += 128, ql += 64, qh += 32) {
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
      ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
      ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
      qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                   ((L[j + l + 96] >> 4) << 6));
    }
  }
}

}  // namespace

bool CanQuantize(DType t) {
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kQ4_K:
    case DType::kQ6_K: return true;
    default: return false;
  }
}

void QuantizeBlocks(DType t, const float* src, void* dst, size_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  const size_t bs = static_cast<size_t>(DTypeBlockSize(t)), bb = DTypeBlockBytes(t);
  for (size_t i = 0; i < n / bs; ++i, src += bs, b += bb) {
    switch (t) {
      case DType::kQ4_0: QuantSym32(src, b, 16); break;
      case DType::kQ5_0: QuantSym32(src, b, 32); break;
      case DType::kQ4_1: QuantMin32(src, b, 16); break;
      case DType::kQ5_1: QuantMin32(src, b, 32); break;
      case DType::kQ8_0: QuantQ8_0(src, b); break;
      case DType::kQ4_K: QuantQ4K(src, b); break;
      case DType::kQ6_K: QuantQ6K(src, b); break;
      default: ATTIC_CHECK(false && "QuantizeBlocks: not a type Attic quantizes to"); return;
    }
  }
}

}  // namespace attic
