// CPU compute kernels the forward pass is made of. Each validates nothing (callers own
// shapes) and dispatches at run time to AVX-512 / AVX2 / generic code.
//
// Conventions: row-major; activations are f32; weights are WeightTensor in f32, f16,
// bf16 (or q8_0), stored [out, in] (y = x W^T).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attic/backend/thread_pool.h"
#include "attic/core/status.h"
#include "attic/tensor/weight_tensor.h"

namespace attic::backend {

// y[m, n] = x[m, k] * W[n, k]^T (+ bias[n] if bias != nullptr).
// Small m (decode, batched decode; up to the crossover CalibrateLinear measured, else the
// ISA's fixed one: on AVX-512 m <= 32 for bf16 (12 when prepacked, PrepackWeights), 32 for
// f16, 24 for f32, 10 for q8_0) is a GEMV streaming each weight
// row once for all m rows, in true f32 math (weights widened exactly). Larger m is a packed, register-blocked GEMM: f32 FMA on
// widened weights for f32/f16/q8_0 (true f32 math), and for bf16 weights on CPUs with
// AVX512-BF16 vdpbf16ps with x rounded to bf16 (error <= 2^-9 * sum|x*w|, typically
// ~1e-4 of it; llama.cpp makes the same trade). Parallel over `pool`; no other threads are used. `y` must not alias `x`.
//
// A GEMV row's result is the same bits whatever the other rows of x are; a GEMM row's
// is not (its blocking differs). `mode` chooses:
//   kFastest       GEMV up to the crossover above, GEMM beyond: a row's last bits then
//                  depend on how many rows share the call.
//   kRowInvariant  the GEMV for every m: a row's result never depends on the other rows
//                  (a deterministic server). On the development Xeon the bf16 GEMV
//                  matches the unpacked GEMM at 64 rows (w_up: 926 vs 934 us); SmolLM2-
//                  135M bf16 prefill of 512 tokens runs at 0.83-0.87x end to end.
enum class LinearMode { kFastest, kRowInvariant };
void Linear(ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y,
            LinearMode mode = LinearMode::kFastest);

// Whether Linear rounds x to bf16 before multiplying bf16 weights, on every path (the
// AVX-512 kernels on CPUs with AVX512-BF16: vdpbf16ps). Each product is then exact in
// f32 and the only extra error is x's rounding (relative <= 2^-8 an element, round to
// nearest even); false: x is used as it is. A reference that rounds the inputs of its
// bf16 matrix products the same way follows the kernels' arithmetic up to f32
// accumulation.
bool LinearRoundsBf16Activations();

// A model's linear matrices as its forward pass multiplies by them: per layer, the groups
// of outputs computed from one input -- {wq, wk, wv}, {wo}, {w_gate, w_up}, {w_down} --
// then the LM head. What prepacking and calibration walk (engine::LinearsOf builds it
// from a loaded model).
struct LayerLinears {
  WeightTensor* wq = nullptr;
  WeightTensor* wk = nullptr;
  WeightTensor* wv = nullptr;
  WeightTensor* wo = nullptr;
  WeightTensor* w_gate = nullptr;
  WeightTensor* w_up = nullptr;
  WeightTensor* w_down = nullptr;
};
struct ModelLinears {
  std::vector<LayerLinears> layers;
  WeightTensor* lm_head = nullptr;
  // Keeps memory alive as long as the weights (the packed copies PrepackWeights adds).
  std::function<void(std::shared_ptr<void>)> own;
};

// Adds the CPU GEMM's packed layout of the model's bf16 matrices (WeightTensor::packed) on
// CPUs with AVX512-BF16, when that copy is at most `max_bytes`: the GEMM then skips
// packing each weight panel on every call (prefill of short chunks ~1.2-1.3x faster) at
// the cost of a second copy of those matrices (handed to `model.own`). Results are
// bit-identical to the unpacked GEMM.
// Block-quantized matrices of the types with a packed layout (q4_0, q4_1, q5_0, q5_1,
// q8_0, q4_k, q6_k) are packed on CPUs with AVX512-VNNI whatever `max_bytes` says: the
// packed copy is the layout the GEMV and prefill read (16 rows interleaved for
// vpdpbusd, 2-9x faster than the row-major kernel), and the mapped file's pages are then
// only read for embedding rows (the kernel reclaims the rest). Returns the bytes added
// (0: nothing packed).
uint64_t PrepackWeights(const ModelLinears& model, ThreadPool& pool, uint64_t max_bytes);

// What CalibrateLinear chose for a model on this CPU.
struct LinearCalibration {
  std::string isa;             // the ISA whose GEMM (and prepacked layout) serves m above the crossover
  std::string gemv;            // the kernel table whose GEMV serves m up to gemv_max_m
  int64_t gemv_max_m = 0;      // largest m on the GEMV (0: the GEMM from one row up)
  bool prepacked = false;      // the model's matrices are prepacked (the crossover is for them)
  double seconds = 0;          // wall time the calibration took
  // Each candidate's time for a sweep over the sampled layers: {kernel, m, microseconds}.
  struct Timing {
    std::string kernel;
    int64_t m;
    double us;
  };
  std::vector<Timing> timings;
  int sample_layers = 0;       // layers of the model the sweeps ran over
  uint64_t sample_bytes = 0;   // their matrices' bytes
  bool cached = false;         // installed from a stored calibration, not measured now
  // One line for logs: "GEMV avx512 up to 12 rows, then the avx512 GEMM (...)".
  std::string Summary() const;
  // A few "name=value" lines (the choice and the timings), and back.
  std::string Serialize() const;
  static StatusOr<LinearCalibration> Parse(std::string_view text);
};

// Measures, on this CPU and `model`'s own matrices, which kernels Linear should use:
// each GEMV this CPU runs (the active ISA's, lower ISAs', and on AVX512-BF16 the exact
// f32-FMA bf16 form) and the active ISA's GEMM at one row, then the GEMV/GEMM crossover
// in m (rows 2..64), each timed as a sweep over a sample of the model's layers large
// enough to stream from DRAM as decode does (minimum of 3 interleaved runs). Installs
// the fastest as the kernels in use for the process and returns what it chose. Takes
// ~0.1-0.5 s. Every candidate computes the same products within the documented bounds
// (Linear's comment); only which runs, and so the last bits, depends on the timing.
// REQUIRES: no kernel runs concurrently (call at load, after PrepackWeights).
StatusOr<LinearCalibration> CalibrateLinear(const ModelLinears& model, ThreadPool& pool);

// Whether CalibrateLinear's timing is worth its cost on `model`: false when any layer
// matrix is block-quantized (q4_0 ... iq4_xs; q8_0 is timed): their GEMM widens every
// weight tile per call, and timing it over the sweep's rows took two minutes at load on
// SmolLM2-135M Q4_K_M (a loaded 2-core machine). Such models keep the fixed table. Also
// false when a layer matrix is block-quantized and packed (PrepackWeights; q8_0 too):
// the packed GEMV takes every m, so there is no crossover to measure.
bool CalibrationWorthTiming(const ModelLinears& model);

// Installs a choice CalibrateLinear made before (a stored one) without timing anything:
// InvalidArgument if its kernels are not candidates here (another CPU or ISA cap), or
// it was made with the other prepacking. Same REQUIRES.
Status InstallLinearCalibration(const LinearCalibration& cal, const ModelLinears& model);

// What a stored calibration is valid for: the CPU model, the kernels in use, the thread
// count, and the dtype, shape and prepacking of the model's layer matrices, as a hex
// digest (a file name part).
std::string LinearCalibrationKey(const ModelLinears& model, const ThreadPool& pool);

// One output of LinearMulti: y[m, w->rows()] = x W^T (+ bias).
struct LinearOutput {
  const WeightTensor* w = nullptr;
  const float* bias = nullptr;  // optional
  float* y = nullptr;
};

// Linear for several weights that share x (q/k/v, gate/up), bit-identical to calling
// Linear for each. On the GEMV path (decode), and on the AVX-512 GEMM path when the
// weights share dtype and prepacking, it is one pool dispatch over all the weights'
// rows with x prepared once: saves the per-call overhead (one barrier instead of one per
// weight) and balances small matrices (the 135M model's k/v projections are 221 KB)
// across threads. REQUIRES: all weights have x's k columns.
void LinearMulti(ThreadPool& pool, const float* x, int64_t m, const LinearOutput* outs, int n_outs,
                 LinearMode mode = LinearMode::kFastest);

// out[i, :] = x[i, :] / rms(x[i, :]) * weight; rows of length n. out may alias x.
void RmsNorm(ThreadPool& pool, const float* x, const float* weight, int64_t rows, int64_t n, float eps, float* out);

// gate[i] = silu(gate[i]) * up[i] for i < n.
void SiluMul(ThreadPool& pool, float* gate, const float* up, int64_t n);

// x[i] += y[i].
void Add(float* x, const float* y, int64_t n);

// Copies row `id` of an embedding table (any weight dtype) to out[0..cols) as f32.
void EmbeddingRow(const WeightTensor& table, int64_t id, float* out);

// Numerically stable in-place softmax of x[0..n).
void Softmax(float* x, int64_t n);

}  // namespace attic::backend
