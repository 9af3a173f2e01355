// Internal: one ISA's CPU kernel implementations, as a table of function pointers.
// kernels.cc picks the table for ActiveIsa(); tests use KernelsFor(isa) to
// exercise every ISA the machine can run, whatever ATTIC_ISA says.
//
// Thread-safety: tables are immutable; kernels are reentrant (scratch is thread-local).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "attic/backend/cpu_features.h"
#include "attic/backend/kernels.h"
#include "attic/backend/thread_pool.h"
#include "attic/tensor/buffer.h"
#include "attic/tensor/weight_tensor.h"

namespace attic::backend::cpu {

// Most weights one KernelTable::gemm_multi call takes.
constexpr int kMaxGemmOuts = 8;

struct KernelTable {
  Isa isa = Isa::kGeneric;
  const char* name = "";

  // Bulk conversions (see attic/backend/convert.h for contracts).
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n) = nullptr;
  void (*bf16_to_f32)(const uint16_t* src, float* dst, int64_t n) = nullptr;
  void (*f32_to_bf16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
  void (*f32_to_f16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
  // n elements of a weight row (any dtype; q8_0: n % 32 == 0) to f32.
  void (*row_to_f32)(DType dtype, const void* src, float* dst, int64_t n) = nullptr;

  // GEMV, in two steps. gemv_prepare lays x out the way this ISA's gemv wants it for
  // weight w (padded, permuted, shifted to w's alignment) and returns it: either x itself
  // or a pointer into *scratch. Weights with equal gemv_layout(w) (and dtype and k) can
  // share one prepared x. Then gemv computes the slice y[i, j] = sum_k x[i, k] * W[j, k]
  // (+ bias[j]) for i < m, n0 <= j < n1, streaming each weight row once for all m rows.
  // Single-threaded; Linear prepares once and splits n over the pool. y has row stride
  // W.rows().
  const float* (*gemv_prepare)(const WeightTensor& w, const float* x, int64_t m, AlignedBuffer* scratch) =
      nullptr;
  int64_t (*gemv_layout)(const WeightTensor& w) = nullptr;
  void (*gemv)(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
               int64_t n1) = nullptr;
  // Whole GEMM y[m, n] = x[m, k] W[n, k]^T (+ bias), parallelised over `pool`.
  void (*gemm)(ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w, const float* bias,
               float* y) = nullptr;
  // Optional: gemm for several weights sharing x (same dtype, k and prepacking), in one
  // pool dispatch, bit-identical to gemm on each. nullptr: LinearMulti calls gemm per weight.
  // REQUIRES: n_outs <= kMaxGemmOuts.
  void (*gemm_multi)(ThreadPool& pool, const float* x, int64_t m, const LinearOutput* outs, int n_outs) = nullptr;
  // Optional: a copy of a weight in this ISA's GEMM panel layout, read by gemm instead
  // of packing per call (PrepackWeights; WeightTensor::packed_layout == isa). nullptr:
  // this ISA's GEMM has none. out: prepacked_bytes(w), 64-byte aligned.
  bool (*can_prepack)(const WeightTensor& w) = nullptr;
  uint64_t (*prepacked_bytes)(const WeightTensor& w) = nullptr;
  void (*prepack)(ThreadPool& pool, const WeightTensor& w, void* out) = nullptr;
  // Linear uses gemv for m <= gemv_max_m[dtype], gemm above (gemv_max_m_packed for a
  // weight with a prepacked layout, whose GEMM skips packing).
  int64_t gemv_max_m[kNumDTypes] = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
  int64_t gemv_max_m_packed = 4;
  // The same for a block-quantized weight with a prepacked layout.
  int64_t gemv_max_m_packed_block = 4;
  // Rows of one prepacked panel when this table's gemv reads prepacked weights (its row
  // ranges then start at multiples of it); 0: its gemv reads the row-major weights only.
  int64_t gemv_packed_rows = 0;
  // Whether every bf16 GEMV and GEMM of this table rounds x to bf16 before its products
  // (vdpbf16ps; AVX-512 on CPUs with AVX512-BF16). False: bf16 weights are widened
  // exactly and x is used as it is (true f32 math).
  bool bf16_rounds_x = false;

  // Elementwise / row ops (single row or flat range; callers split work).
  void (*rmsnorm_row)(const float* x, const float* weight, int64_t n, float eps, float* out) = nullptr;
  void (*silu_mul)(float* gate, const float* up, int64_t n) = nullptr;
  void (*add)(float* x, const float* y, int64_t n) = nullptr;
  void (*softmax)(float* x, int64_t n) = nullptr;
};

// The table for `isa`, or nullptr when this CPU cannot run it.
const KernelTable* KernelsFor(Isa isa);
// The AVX-512 table with its bf16 GEMV in the exact f32-FMA form (x not rounded), on
// CPUs where the AVX-512 table's bf16 GEMV uses vdpbf16ps; else nullptr. A candidate of
// CalibrateLinear.
const KernelTable* Avx512FmaGemvTable();
// The kernels in use: the table for ActiveIsa(), or the one InstallActiveKernels set
// (never null).
const KernelTable& ActiveKernels();
// Makes a copy of `t` the kernels in use (CalibrateLinear's choice). REQUIRES: no
// kernel runs concurrently with the call (a model load does it before serving); the
// tables installed before stay valid (calls already running keep theirs).
void InstallActiveKernels(const KernelTable& t);
// Back to the table for ActiveIsa() (tests). Same REQUIRES.
void ResetActiveKernels();

// Linear with an explicit table (kernels.cc's Linear is LinearWith(ActiveKernels(), ...)).
void LinearWith(const KernelTable& t, ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w,
                const float* bias, float* y);
// The GEMV/GEMM choice: by m (kAuto), or forced (kGemv: LinearMode::kRowInvariant;
// tests and benchmarks).
enum class LinearPath { kAuto, kGemv, kGemm };
// kGemm is not accepted here: LinearMulti's GEMM path is only taken automatically.
void LinearMultiWith(const KernelTable& t, ThreadPool& pool, const float* x, int64_t m, const LinearOutput* outs,
                     int n_outs, LinearPath path = LinearPath::kAuto);
void LinearWithPath(const KernelTable& t, LinearPath path, ThreadPool& pool, const float* x, int64_t m,
                    const WeightTensor& w, const float* bias, float* y);

// Whether t can prepack w (t.can_prepack set and true for w).
inline bool CanPrepack(const KernelTable& t, const WeightTensor& w) {
  return t.can_prepack != nullptr && t.can_prepack(w);
}
// Packs w in t's layout into `dst` (t.prepacked_bytes(w) bytes, 64-byte aligned) and
// points w.packed at it (packed_layout = t.isa); the caller keeps dst as long as w is
// used. REQUIRES: CanPrepack(t, w).
void PrepackInto(const KernelTable& t, ThreadPool& pool, WeightTensor* w, void* dst);
// The same into a new buffer of its own.
std::shared_ptr<AlignedBuffer> PrepackWith(const KernelTable& t, ThreadPool& pool, WeightTensor* w);

// Rows [begin, end) of output `out` of a multi-output GEMV/GEMM: one unit of work.
struct RowRange {
  int out;
  int64_t begin, end;
};
// Cuts each output's rows(i) rows (i < n_outs) into ranges of `step` rows, in order,
// into a thread-local list that stays valid until the calling thread's next call.
template <class RowsOf>
const std::vector<RowRange>& CutRows(int n_outs, int64_t step, RowsOf rows) {
  thread_local std::vector<RowRange> ranges;
  ranges.clear();
  for (int i = 0; i < n_outs; ++i)
    for (int64_t b = 0, n = rows(i); b < n; b += step) ranges.push_back({i, b, std::min(n, b + step)});
  return ranges;
}

// A GEMM's tasks over n_outs outputs whose weight rows (output columns) are rows(i):
// each output's rows cut into tasks of up to max_task_panels panels of panel_rows, at
// least 4 per thread when the outputs' panels together allow, all run as fn(range) in
// one pool dispatch, claimed dynamically (a thread sharing its core with another process
// takes fewer). Outputs that share x (q/k/v, gate/up) so cost one barrier, not one each.
template <class RowsOf, class Fn>
void RunPanelTasks(ThreadPool& pool, int n_outs, RowsOf rows, int64_t panel_rows, int64_t max_task_panels, Fn fn) {
  int64_t panels = 0;
  for (int i = 0; i < n_outs; ++i) panels += (rows(i) + panel_rows - 1) / panel_rows;
  const int64_t per_task = std::clamp<int64_t>(panels / (4 * pool.n_threads()), 1, max_task_panels);
  const std::vector<RowRange>& tasks = CutRows(n_outs, per_task * panel_rows, rows);
  const RowRange* t = tasks.data();
  pool.ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t i, int) { fn(t[i]); });
}

// Runs fn(chunk) for chunk in [0, n_chunks) on the pool. The chunks are cut into one
// contiguous region per thread, each walked in order (sequential memory streams for the
// prefetchers); a thread whose region is done steals the next chunks of the others, and
// spare helper tasks let a thread that started late join in. So an unloaded machine
// gets a static split, and a thread that loses its core to another process costs only
// the chunks it did not get to.
void ParallelChunks(ThreadPool& pool, int64_t n_chunks, const std::function<void(int64_t chunk)>& fn);

// Per-ISA tables (defined in kernel_table.cc from the functions below).
const KernelTable& GenericTable();
const KernelTable& Avx2Table();
const KernelTable& Avx512Table();

// GEMM for ISAs without their own: converts weight tiles to f32 (with t.row_to_f32) and
// runs single-threaded OpenBLAS sgemm on each thread's share of n.
void SgemmFallback(const KernelTable& t, ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w,
                   const float* bias, float* y);

namespace generic {
void F16ToF32(const uint16_t* src, float* dst, int64_t n);
void Bf16ToF32(const uint16_t* src, float* dst, int64_t n);
void F32ToBf16(const float* src, uint16_t* dst, int64_t n);
void F32ToF16(const float* src, uint16_t* dst, int64_t n);
void RowToF32(DType dtype, const void* src, float* dst, int64_t n);
const float* GemvPrepare(const WeightTensor& w, const float* x, int64_t m, AlignedBuffer* scratch);
int64_t GemvLayout(const WeightTensor& w);
void Gemv(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0, int64_t n1);
void Gemm(ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y);
void RmsNormRow(const float* x, const float* weight, int64_t n, float eps, float* out);
void SiluMul(float* gate, const float* up, int64_t n);
void Add(float* x, const float* y, int64_t n);
void Softmax(float* x, int64_t n);
}  // namespace generic

namespace avx2 {
void F16ToF32(const uint16_t* src, float* dst, int64_t n);
void Bf16ToF32(const uint16_t* src, float* dst, int64_t n);
void F32ToBf16(const float* src, uint16_t* dst, int64_t n);
void F32ToF16(const float* src, uint16_t* dst, int64_t n);
void RowToF32(DType dtype, const void* src, float* dst, int64_t n);
const float* GemvPrepare(const WeightTensor& w, const float* x, int64_t m, AlignedBuffer* scratch);
int64_t GemvLayout(const WeightTensor& w);
void Gemv(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0, int64_t n1);
// GEMM (gemm_avx2.cc): bf16 and f16 weights through Attic's own packed kernel (true f32
// math), read from a prepacked copy (PrepackDense's layout, [panel][k][16] of the file's
// 16-bit values, WeightTensor::packed_layout == kPackedLayout) when there is one,
// bit-identically; other dtypes through SgemmFallback.
constexpr int kPackedLayout = static_cast<int>(Isa::kAvx2);
bool CanPrepackDense(const WeightTensor& w);
uint64_t PrepackedDenseBytes(const WeightTensor& w);
void PrepackDense(ThreadPool& pool, const WeightTensor& w, void* out);  // out: 64-byte aligned
void Gemm(ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y);
void GemmMulti(ThreadPool& pool, const float* x, int64_t m, const LinearOutput* outs, int n_outs);
void RmsNormRow(const float* x, const float* weight, int64_t n, float eps, float* out);
void SiluMul(float* gate, const float* up, int64_t n);
void Add(float* x, const float* y, int64_t n);
void Softmax(float* x, int64_t n);
}  // namespace avx2

namespace avx512 {
void F16ToF32(const uint16_t* src, float* dst, int64_t n);
void Bf16ToF32(const uint16_t* src, float* dst, int64_t n);
void F32ToBf16(const float* src, uint16_t* dst, int64_t n);
void F32ToF16(const float* src, uint16_t* dst, int64_t n);
void RowToF32(DType dtype, const void* src, float* dst, int64_t n);
const float* GemvPrepare(const WeightTensor& w, const float* x, int64_t m, AlignedBuffer* scratch);
int64_t GemvLayout(const WeightTensor& w);
// bf16 GEMV uses vdpbf16ps with x rounded to bf16 when the CPU has AVX512-BF16
// (Bf16GemvUsesDot()), exact f32 FMA otherwise.
void Gemv(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0, int64_t n1);
bool Bf16GemvUsesDot();
// The GEMV with bf16 weights always in the exact f32-FMA form (x not rounded), whatever
// the CPU: a candidate of CalibrateLinear (Avx512FmaGemvTable). Same layout as Gemv's.
const float* GemvPrepareFma(const WeightTensor& w, const float* x, int64_t m, AlignedBuffer* scratch);
void GemvFma(const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
             int64_t n1);
// Tests only: with `disabled`, bf16 GEMV takes the f32-FMA form as on CPUs without
// AVX512-BF16. Not thread-safe; no GEMV may run concurrently.
void SetBf16GemvDotDisabledForTesting(bool disabled);
// bf16 GEMM uses vdpbf16ps when the CPU has AVX512-BF16 (x rounded to bf16), f32 FMA
// on converted weight panels otherwise and for the other dtypes. A bf16 weight with
// `packed` set (PrepackBf16's layout) is read from there instead of being packed.
bool CanPrepackBf16(const WeightTensor& w);
uint64_t PrepackedBf16Bytes(const WeightTensor& w);
void PrepackBf16(ThreadPool& pool, const WeightTensor& w, void* out);  // out: 64-byte aligned
// Rows per prepacked panel: a GEMV over prepacked weights takes row ranges starting at
// multiples of it.
constexpr int64_t kPackedPanelRows = 48;
// Whether w is prepacked in PrepackBf16's layout (the GEMV then reads the panels).
bool IsPrepackedBf16(const WeightTensor& w);
// GEMV rows [n0, n1) of a prepacked bf16 weight (n0 % kPackedPanelRows == 0). x as
// GemvPrepare lays it out for such a weight: bf16 with `dot` (vdpbf16ps), f32 without.
void GemvPackedBf16(const void* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                    int64_t n1, bool dot);
// f16 matrices prepacked as [panel][k][kNR] f16 (the f32 GEMM path's panels, kept in f16:
// exact). The GEMM reads them instead of packing per call (bit-identical); the GEMV
// streams them (x as GemvPrepare lays it out for such a weight: f32, unshifted, zero past
// k; true f32 math). Any AVX-512 CPU (vcvtph2ps is AVX-512F).
bool CanPrepackF16(const WeightTensor& w);
uint64_t PrepackedF16Bytes(const WeightTensor& w);
void PrepackF16(ThreadPool& pool, const WeightTensor& w, void* out);  // out: 64-byte aligned
bool IsPrepackedF16(const WeightTensor& w);
void GemvPackedF16(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                   int64_t n1);
// The table's prepacking of unquantized matrices: bf16 (PrepackBf16) or f16 (PrepackF16).
bool CanPrepackDense(const WeightTensor& w);
// Whether w is prepacked in either layout (the GEMV then reads panels, with x unshifted).
bool IsPrepackedDense(const WeightTensor& w);
uint64_t PrepackedDenseBytes(const WeightTensor& w);
void PrepackDense(ThreadPool& pool, const WeightTensor& w, void* out);
void Gemm(ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y);
void GemmMulti(ThreadPool& pool, const float* x, int64_t m, const LinearOutput* outs, int n_outs);
void RmsNormRow(const float* x, const float* weight, int64_t n, float eps, float* out);
void SiluMul(float* gate, const float* up, int64_t n);
void Add(float* x, const float* y, int64_t n);
void Softmax(float* x, int64_t n);
}  // namespace avx512

}  // namespace attic::backend::cpu
