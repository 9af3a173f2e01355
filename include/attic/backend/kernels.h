// CPU compute kernels the forward pass is made of. Each validates nothing (callers own
// shapes) and dispatches at run time to AVX-512 / AVX2 / generic code.
//
// Conventions: row-major; activations are f32; weights are WeightTensor in f32, f16,
// bf16 (or q8_0), stored [out, in] (y = x W^T).
#pragma once

#include <cstdint>

#include "attic/backend/thread_pool.h"
#include "attic/model/weights.h"

namespace attic::backend {

// y[m, n] = x[m, k] * W[n, k]^T (+ bias[n] if bias != nullptr).
// Small m (decode, batched decode) streams each weight row once for all m rows
// (memory-bound GEMV); large m uses a GEMM (oneDNN for bf16/f32, BLAS sgemm for
// converted f16/f32). `y` must not alias `x`.
void Linear(ThreadPool& pool, const float* x, int64_t m, const model::WeightTensor& w, const float* bias, float* y);

// out[i, :] = x[i, :] / rms(x[i, :]) * weight; rows of length n. out may alias x.
void RmsNorm(ThreadPool& pool, const float* x, const float* weight, int64_t rows, int64_t n, float eps, float* out);

// gate[i] = silu(gate[i]) * up[i] for i < n.
void SiluMul(ThreadPool& pool, float* gate, const float* up, int64_t n);

// x[i] += y[i].
void Add(float* x, const float* y, int64_t n);

// Copies row `id` of an embedding table (any weight dtype) to out[0..cols) as f32.
void EmbeddingRow(const model::WeightTensor& table, int64_t id, float* out);

// Numerically stable in-place softmax of x[0..n).
void Softmax(float* x, int64_t n);

}  // namespace attic::backend
