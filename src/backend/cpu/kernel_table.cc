// Assembles the per-ISA kernel tables and picks the active one.
#include "backend/cpu/kernel_table.h"

#include <atomic>
#include <deque>
#include <limits>
#include <mutex>

#include "backend/cpu/qpack.h"

namespace attic::backend::cpu {

namespace {

// A table's prepacking: its GEMM's panels of unquantized matrices (bf16, f16; within
// PrepackWeights' budget), or
// block-quantized matrices packed for its integer GEMV (qpack.h).
template <bool (*kCanDense)(const WeightTensor&), uint64_t (*kDenseBytes)(const WeightTensor&),
          void (*kPackDense)(ThreadPool&, const WeightTensor&, void*), bool (*kCanQuant)(const WeightTensor&)>
void SetPrepacking(KernelTable* t) {
  t->can_prepack = [](const WeightTensor& w) { return kCanDense(w) || kCanQuant(w); };
  t->prepacked_bytes = [](const WeightTensor& w) {
    return DTypeIsBlock(w.dtype) ? qpack::PackedBytes(w) : kDenseBytes(w);
  };
  t->prepack = [](ThreadPool& pool, const WeightTensor& w, void* out) {
    if (DTypeIsBlock(w.dtype)) {
      qpack::Pack(pool, w, out);
    } else {
      kPackDense(pool, w, out);
    }
  };
}

template <class Fns>
KernelTable MakeTable(Isa isa, const char* name) {
  KernelTable t;
  t.isa = isa;
  t.name = name;
  t.f16_to_f32 = Fns::F16ToF32;
  t.bf16_to_f32 = Fns::Bf16ToF32;
  t.f32_to_bf16 = Fns::F32ToBf16;
  t.f32_to_f16 = Fns::F32ToF16;
  t.row_to_f32 = Fns::RowToF32;
  t.gemv_prepare = Fns::GemvPrepare;
  t.gemv_layout = Fns::GemvLayout;
  t.gemv = Fns::Gemv;
  t.gemm = Fns::Gemm;
  t.rmsnorm_row = Fns::RmsNormRow;
  t.silu_mul = Fns::SiluMul;
  t.add = Fns::Add;
  t.softmax = Fns::Softmax;
  return t;
}

#define ATTIC_FNS(ns)                                            \
  struct ns##_fns {                                              \
    static constexpr auto F16ToF32 = ns::F16ToF32;               \
    static constexpr auto Bf16ToF32 = ns::Bf16ToF32;             \
    static constexpr auto F32ToBf16 = ns::F32ToBf16;             \
    static constexpr auto F32ToF16 = ns::F32ToF16;               \
    static constexpr auto RowToF32 = ns::RowToF32;               \
    static constexpr auto GemvPrepare = ns::GemvPrepare;         \
    static constexpr auto GemvLayout = ns::GemvLayout;           \
    static constexpr auto Gemv = ns::Gemv;                       \
    static constexpr auto Gemm = ns::Gemm;                       \
    static constexpr auto RmsNormRow = ns::RmsNormRow;           \
    static constexpr auto SiluMul = ns::SiluMul;                 \
    static constexpr auto Add = ns::Add;                         \
    static constexpr auto Softmax = ns::Softmax;                 \
  };
ATTIC_FNS(generic)
ATTIC_FNS(avx2)
ATTIC_FNS(avx512)
#undef ATTIC_FNS

}  // namespace

const KernelTable& GenericTable() {
  static const KernelTable t = MakeTable<generic_fns>(Isa::kGeneric, "generic");
  return t;
}

const KernelTable& Avx2Table() {
  static const KernelTable t = [] {
    KernelTable t = MakeTable<avx2_fns>(Isa::kAvx2, "avx2");
    t.gemm_multi = avx2::GemmMulti;
    SetPrepacking<avx2::CanPrepackDense, avx2::PrepackedDenseBytes, avx2::PrepackDense, avx2::CanPrepackQuant>(&t);
    // Crossover (`kernels_bench --only crossover`, AMD EPYC Zen 3, 2 threads): the bf16
    // GEMV beats the GEMM that packs per call up to m ~ 16-24 (w_up: 339 vs 368 us at
    // 16, 465 vs 435 at 24); on prepacked weights the GEMM wins from m = 1 (w_up 81 vs
    // 105 us, wk 13 vs 17; at m = 8 120 vs 221), so prepacked weights always take it.
    // Its rows are computed independently (same bits whatever m), as the GEMV's are.
    t.gemv_max_m[static_cast<int>(DType::kBF16)] = 16;
    t.gemv_max_m_packed = 0;
    // Packed block-quantized weights (qpack.h): the GEMV reads them, for every m (the
    // GEMM would widen the row-major tiles for OpenBLAS).
    t.gemv_packed_rows = kQuantPanelRows;
    t.gemv_max_m_packed_block = std::numeric_limits<int64_t>::max();
    return t;
  }();
  return t;
}

const KernelTable& Avx512Table() {
  static const KernelTable t = [] {
    KernelTable t = MakeTable<avx512_fns>(Isa::kAvx512, "avx512");
    t.gemm_multi = avx512::GemmMulti;
    SetPrepacking<avx512::CanPrepackDense, avx512::PrepackedDenseBytes, avx512::PrepackDense, vnni::CanPrepackQuant>(
        &t);
    // GEMV/GEMM crossover in m, measured with `kernels_bench --only crossover` (cold
    // weights, 2 threads; 135M and 1B shapes agree within a step): bf16 GEMM runs at
    // ~2x the f32 rate (vdpbf16ps), so against the f32-FMA bf16 GEMV it wins from m = 16;
    // the vdpbf16ps GEMV (AVX512-BF16) halves that GEMV's work and stays ahead up to
    // m = 32-64. q8_0's GEMV is the simplest.
    t.gemv_max_m[static_cast<int>(DType::kF32)] = 24;
    t.gemv_max_m[static_cast<int>(DType::kF16)] = 32;
    t.gemv_max_m[static_cast<int>(DType::kBF16)] = avx512::Bf16GemvUsesDot() ? 32 : 16;
    t.gemv_max_m[static_cast<int>(DType::kQ8_0)] = 10;
    // Prepacked bf16 (PrepackWeights): without the per-call packing the GEMM beats the
    // vdpbf16ps GEMV from m = 8 on the large matrices (w_up 576x1536: 39 vs 50 us at m = 8,
    // 52 vs 63 at 12) and from ~24 on the small k/v projections; 12 for the step's mix.
    t.gemv_max_m_packed = avx512::Bf16GemvUsesDot() ? 12 : t.gemv_max_m[static_cast<int>(DType::kBF16)];
    t.gemv_packed_rows = avx512::kPackedPanelRows;  // its GEMV reads prepacked panels
    static_assert(avx512::kPackedPanelRows % kQuantPanelRows == 0);
    // Prepacked block-quantized weights: the GEMV for every m (see qpack_vnni.cc; measured
    // against the GEMM on widened tiles in docs/engine.md).
    t.gemv_max_m_packed_block = std::numeric_limits<int64_t>::max();
    t.bf16_rounds_x = GetCpuFeatures().avx512_bf16;
    return t;
  }();
  return t;
}

const KernelTable* KernelsFor(Isa isa) {
  const CpuFeatures& f = GetCpuFeatures();
  switch (isa) {
    case Isa::kGeneric:
      return &GenericTable();
    case Isa::kAvx2:
      return f.avx2 && f.fma && f.f16c ? &Avx2Table() : nullptr;
    case Isa::kAvx512:
      return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq ? &Avx512Table()
                                                                                            : nullptr;
  }
  return nullptr;
}

const KernelTable* Avx512FmaGemvTable() {
  const KernelTable* base = KernelsFor(Isa::kAvx512);
  if (base == nullptr || !avx512::Bf16GemvUsesDot()) return nullptr;
  static const KernelTable t = [base] {
    KernelTable t = *base;
    t.name = "avx512-fma";
    t.gemv_prepare = avx512::GemvPrepareFma;
    t.gemv = avx512::GemvFma;
    t.bf16_rounds_x = false;  // the GEMV's x is exact; the GEMM's is still rounded
    return t;
  }();
  return &t;
}

namespace {

std::atomic<const KernelTable*> g_installed{nullptr};

}  // namespace

const KernelTable& ActiveKernels() {
  if (const KernelTable* t = g_installed.load(std::memory_order_acquire)) return *t;
  static const KernelTable* t = KernelsFor(ActiveIsa());
  return *t;
}

void InstallActiveKernels(const KernelTable& t) {
  // Installed tables live as long as the process: a kernel call that read the previous
  // pointer may still be using it.
  static std::mutex mu;
  static std::deque<KernelTable> kept;
  std::lock_guard<std::mutex> lock(mu);
  kept.push_back(t);
  g_installed.store(&kept.back(), std::memory_order_release);
}

void ResetActiveKernels() { g_installed.store(nullptr, std::memory_order_release); }

}  // namespace attic::backend::cpu
