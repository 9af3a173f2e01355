// Portable (baseline x86-64) kernels: the reference every faster ISA is tested against,
// and the fallback on CPUs without AVX2. Plain loops the compiler can vectorise for SSE2.
#include <cmath>
#include <cstring>

#include "backend/cpu/kernel_table.h"
#include "backend/cpu/qdot.h"

namespace attic::backend::cpu::generic {

void F16ToF32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = attic::F16ToF32(src[i]);
}

void Bf16ToF32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = attic::Bf16ToF32(src[i]);
}

void F32ToBf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = attic::F32ToBf16(src[i]);
}

void F32ToF16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = attic::F32ToF16(src[i]);
}

void RowToF32(DType dtype, const void* src, float* dst, int64_t n) {
  attic::ConvertToF32(dtype, src, dst, static_cast<size_t>(n));
}

namespace {

// Dot product of f32 x with one weight row of any dtype, accumulated in 8 lanes of f32
// (vectorisable, and close to what the SIMD kernels do).
float DotRow(const float* x, const WeightTensor& w, int64_t j, int64_t k) {
  const uint8_t* row = w.row(j);
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  switch (w.dtype) {
    case DType::kF32: {
      const float* r = reinterpret_cast<const float*>(row);
      int64_t i = 0;
      for (; i + 8 <= k; i += 8)
        for (int l = 0; l < 8; ++l) acc[l] += x[i + l] * r[i + l];
      for (; i < k; ++i) acc[0] += x[i] * r[i];
      break;
    }
    case DType::kBF16: {
      const uint16_t* r = reinterpret_cast<const uint16_t*>(row);
      int64_t i = 0;
      for (; i + 8 <= k; i += 8)
        for (int l = 0; l < 8; ++l) acc[l] += x[i + l] * attic::Bf16ToF32(r[i + l]);
      for (; i < k; ++i) acc[0] += x[i] * attic::Bf16ToF32(r[i]);
      break;
    }
    case DType::kF16: {
      const uint16_t* r = reinterpret_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < k; ++i) acc[i & 7] += x[i] * attic::F16ToF32(r[i]);
      break;
    }
    case DType::kQ8_0: {
      for (int64_t b = 0; b < k / 32; ++b) {
        const uint8_t* blk = row + b * 34;
        uint16_t d16;
        std::memcpy(&d16, blk, 2);
        const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
        float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int i = 0; i < 32; ++i) part[i & 7] += x[b * 32 + i] * static_cast<float>(q[i]);
        float d = attic::F16ToF32(d16);
        for (int l = 0; l < 8; ++l) acc[l] += d * part[l];
      }
      break;
    }
    default: break;  // block types: GemvQuant
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace

const float* GemvPrepare(const WeightTensor& w, const float* x, int64_t m, AlignedBuffer* scratch) {
  return UsesQuantDot(w.dtype) ? QuantizeX(x, m, w.cols(), scratch) : x;
}
int64_t GemvLayout(const WeightTensor& w) { return UsesQuantDot(w.dtype) ? -1 : 0; }

void Gemv(const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
          int64_t n1) {
  if (UsesQuantDot(w.dtype)) {
    GemvQuant(x, m, w, bias, y, n0, n1);
    return;
  }
  const int64_t k = w.cols(), n = w.rows();
  for (int64_t j = n0; j < n1; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      float v = DotRow(x + i * k, w, j, k);
      y[i * n + j] = bias ? v + bias[j] : v;
    }
  }
}

void Gemm(ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y) {
  SgemmFallback(GenericTable(), pool, x, m, w, bias, y);
}

void RmsNormRow(const float* x, const float* weight, int64_t n, float eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void SiluMul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void Add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace attic::backend::cpu::generic
