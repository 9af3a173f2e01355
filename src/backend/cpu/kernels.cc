// Public kernel entry points (attic/backend/kernels.h, attic/backend/convert.h): choose
// the path and split work over the pool; the per-ISA code does the arithmetic.
#include "attic/backend/kernels.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "attic/backend/convert.h"
#include "attic/core/huge_pages.h"
#include "attic/core/status.h"
#include "backend/cpu/kernel_table.h"

namespace attic::backend {

namespace cpu {

namespace {

// Below this many weight bytes a GEMV runs on the calling thread: waking the pool costs
// more than it saves.
constexpr int64_t kGemvParallelBytes = 48 << 10;
// Rows per GEMV work unit (keeps each thread's rows in whole register blocks).
constexpr int64_t kGemvRowAlign = 16;
// Target weight bytes per dynamically scheduled GEMV chunk.
constexpr int64_t kGemvChunkBytes = 256 << 10;

}  // namespace

void ParallelChunks(ThreadPool& pool, int64_t n_chunks, const std::function<void(int64_t chunk)>& fn) {
  const int64_t n_regions = std::min<int64_t>(pool.n_threads(), n_chunks);
  if (n_regions <= 1) {
    for (int64_t c = 0; c < n_chunks; ++c) fn(c);
    return;
  }
  struct alignas(64) Region {
    std::atomic<int64_t> next;
    int64_t end;
  };
  Region stack_regions[8];
  std::vector<Region> heap_regions(n_regions > 8 ? static_cast<size_t>(n_regions) : 0);
  Region* regions = n_regions > 8 ? heap_regions.data() : stack_regions;
  for (int64_t r = 0; r < n_regions; ++r) {
    regions[r].next.store(n_chunks * r / n_regions, std::memory_order_relaxed);
    regions[r].end = n_chunks * (r + 1) / n_regions;
  }
  // Tasks [0, n_regions) own region `task` first; tasks [n_regions, 2 n_regions) only help.
  pool.ParallelFor(2 * n_regions, [&](int64_t task, int) {
    for (int64_t d = 0; d < n_regions; ++d) {
      Region& g = regions[static_cast<size_t>((task + d) % n_regions)];
      for (int64_t c; (c = g.next.fetch_add(1, std::memory_order_relaxed)) < g.end;) fn(c);
    }
  });
}

// GEMV for outputs that share x (and so k and, here, dtype and gemv_layout): one
// preparation of x, one ParallelChunks over the rows of all the weights.
void GemvMulti(const KernelTable& t, ThreadPool& pool, const float* x, int64_t m, const LinearOutput* outs,
               int n_outs) {
  const DType dtype = outs[0].w->dtype;
  const int64_t k = outs[0].w->cols();
  thread_local AlignedBuffer xp_buf;
  const float* xp = t.gemv_prepare(*outs[0].w, x, m, &xp_buf);
  int64_t rows = 0;
  for (int i = 0; i < n_outs; ++i) rows += outs[i].w->rows();
  const int64_t row_bytes = std::max<int64_t>(1, static_cast<int64_t>(DTypeBytes(dtype, static_cast<size_t>(k))));
  if (rows * row_bytes < kGemvParallelBytes || pool.n_threads() == 1 || rows < 2 * kGemvRowAlign) {
    for (int i = 0; i < n_outs; ++i) t.gemv(xp, m, *outs[i].w, outs[i].bias, outs[i].y, 0, outs[i].w->rows());
    return;
  }
  // Chunks of ~kGemvChunkBytes (at least 4 per thread), scheduled by ParallelChunks; whole
  // panels for a GEMV that reads prepacked weights.
  const WeightTensor& w0 = *outs[0].w;
  const bool panels = t.gemv_packed_rows > 0 && w0.packed != nullptr && w0.packed_layout == static_cast<int>(t.isa);
  const int64_t align = panels ? t.gemv_packed_rows : kGemvRowAlign;
  int64_t rows_per_chunk = std::min(kGemvChunkBytes / row_bytes, rows / (4 * pool.n_threads()));
  rows_per_chunk = std::max(align, rows_per_chunk / align * align);
  const std::vector<RowRange>& chunks = CutRows(n_outs, rows_per_chunk, [&](int i) { return outs[i].w->rows(); });
  const RowRange* c = chunks.data();
  ParallelChunks(pool, static_cast<int64_t>(chunks.size()), [&](int64_t ci) {
    const LinearOutput& o = outs[c[ci].out];
    t.gemv(xp, m, *o.w, o.bias, o.y, c[ci].begin, c[ci].end);
  });
}

// Largest m that takes the GEMV path for `w`.
int64_t GemvMaxM(const KernelTable& t, const WeightTensor& w) {
  if (w.packed == nullptr || w.packed_layout != static_cast<int>(t.isa)) return t.gemv_max_m[static_cast<int>(w.dtype)];
  return DTypeIsBlock(w.dtype) ? t.gemv_max_m_packed_block : t.gemv_max_m_packed;
}

void LinearWithPath(const KernelTable& t, LinearPath path, ThreadPool& pool, const float* x, int64_t m,
                    const WeightTensor& w, const float* bias, float* y) {
  if (m <= 0 || w.rows() <= 0) return;
  bool use_gemv = path == LinearPath::kGemv || (path == LinearPath::kAuto && m <= GemvMaxM(t, w));
  if (!use_gemv) {
    t.gemm(pool, x, m, w, bias, y);
    return;
  }
  const LinearOutput out{&w, bias, y};
  GemvMulti(t, pool, x, m, &out, 1);
}

void LinearWith(const KernelTable& t, ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w,
                const float* bias, float* y) {
  LinearWithPath(t, LinearPath::kAuto, pool, x, m, w, bias, y);
}

void LinearMultiWith(const KernelTable& t, ThreadPool& pool, const float* x, int64_t m, const LinearOutput* outs,
                     int n_outs, LinearPath path) {
  ATTIC_CHECK(path != LinearPath::kGemm);
  if (m <= 0 || n_outs <= 0) return;
  // One pass: do the weights share x's preparation (dtype, k), and do they all take the
  // GEMV path (with one x layout) or all the GEMM path (with one prepacking)?
  const WeightTensor& w0 = *outs[0].w;
  bool same = true, all_gemv = true, all_gemm = true;
  for (int i = 0; i < n_outs; ++i) {
    const WeightTensor& w = *outs[i].w;
    same = same && w.dtype == w0.dtype && w.cols() == w0.cols();
    const bool gemv = path == LinearPath::kGemv || m <= GemvMaxM(t, w);
    all_gemv = all_gemv && gemv && t.gemv_layout(w) == t.gemv_layout(w0);
    all_gemm = all_gemm && !gemv && (w.packed == nullptr) == (w0.packed == nullptr);
  }
  if (same && all_gemv) {
    GemvMulti(t, pool, x, m, outs, n_outs);
    return;
  }
  if (same && all_gemm && t.gemm_multi != nullptr && n_outs <= kMaxGemmOuts) {
    t.gemm_multi(pool, x, m, outs, n_outs);
    return;
  }
  for (int i = 0; i < n_outs; ++i) LinearWithPath(t, path, pool, x, m, *outs[i].w, outs[i].bias, outs[i].y);
}

void PrepackInto(const KernelTable& t, ThreadPool& pool, WeightTensor* w, void* dst) {
  t.prepack(pool, *w, dst);
  w->packed = dst;
  w->packed_layout = static_cast<int>(t.isa);
}

std::shared_ptr<AlignedBuffer> PrepackWith(const KernelTable& t, ThreadPool& pool, WeightTensor* w) {
  auto buf = std::make_shared<AlignedBuffer>();
  buf->Reserve(t.prepacked_bytes(*w));
  PrepackInto(t, pool, w, buf->data());
  return buf;
}

}  // namespace cpu

namespace {
cpu::LinearPath PathFor(LinearMode mode) {
  return mode == LinearMode::kRowInvariant ? cpu::LinearPath::kGemv : cpu::LinearPath::kAuto;
}
}  // namespace

void Linear(ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w, const float* bias, float* y,
            LinearMode mode) {
  cpu::LinearWithPath(cpu::ActiveKernels(), PathFor(mode), pool, x, m, w, bias, y);
}

void LinearMulti(ThreadPool& pool, const float* x, int64_t m, const LinearOutput* outs, int n_outs, LinearMode mode) {
  cpu::LinearMultiWith(cpu::ActiveKernels(), pool, x, m, outs, n_outs, PathFor(mode));
}

bool LinearRoundsBf16Activations() { return cpu::ActiveKernels().bf16_rounds_x; }

uint64_t PrepackWeights(const ModelLinears& model, ThreadPool& pool, uint64_t max_bytes) {
  const cpu::KernelTable& t = cpu::ActiveKernels();  // the layout is the active ISA's GEMM's
  std::vector<WeightTensor*> ws;
  for (const LayerLinears& l : model.layers)
    for (WeightTensor* w : {l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down}) ws.push_back(w);
  ws.push_back(model.lm_head);
  uint64_t total = 0;
  // All or nothing for the unquantized matrices (bf16, f16: one rule per model) within
  // max_bytes; block-quantized matrices always (their packed copy replaces the file's
  // layout), each whose type has a packed layout (the others keep the row-major GEMV).
  std::vector<WeightTensor*> pack;
  bool all_dense = true;
  uint64_t dense_bytes = 0;
  for (WeightTensor* w : ws) {
    const bool can = w->present() && cpu::CanPrepack(t, *w);
    if (w->present() && DTypeIsBlock(w->dtype)) {
      if (can) pack.push_back(w);
    } else if (can) {
      dense_bytes += t.prepacked_bytes(*w);
    } else {
      all_dense = false;
    }
  }
  if (all_dense && dense_bytes <= max_bytes)
    for (WeightTensor* w : ws)
      if (w->present() && !DTypeIsBlock(w->dtype)) pack.push_back(w);
  // One 2 MiB-aligned arena for every packed matrix (each at a 4 KiB boundary), in huge
  // pages where the kernel gives them: a decode step streams all of it, and a matrix
  // allocated on its own under 2 MiB would sit in 4 KiB pages (core/huge_pages.h).
  constexpr uint64_t kPage = 4096;
  auto padded = [&](const WeightTensor* w) { return (t.prepacked_bytes(*w) + kPage - 1) / kPage * kPage; };
  uint64_t arena_bytes = 0;
  for (WeightTensor* w : pack) {
    arena_bytes += padded(w);
    total += t.prepacked_bytes(*w);
  }
  if (pack.empty()) return 0;
  std::shared_ptr<std::byte> arena = AllocateHugePageAligned(arena_bytes);
  uint64_t at = 0;
  for (WeightTensor* w : pack) {
    cpu::PrepackInto(t, pool, w, arena.get() + at);
    at += padded(w);
  }
  model.own(arena);
  return total;
}

void RmsNorm(ThreadPool& pool, const float* x, const float* weight, int64_t rows, int64_t n, float eps, float* out) {
  const auto& t = cpu::ActiveKernels();
  if (rows <= 0) return;
  // One decode row is ~1 µs of work: not worth a pool dispatch.
  if (rows * n < (1 << 15) || rows == 1) {
    for (int64_t r = 0; r < rows; ++r) t.rmsnorm_row(x + r * n, weight, n, eps, out + r * n);
    return;
  }
  pool.ParallelRange(rows, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) t.rmsnorm_row(x + r * n, weight, n, eps, out + r * n);
  });
}

void SiluMul(ThreadPool& pool, float* gate, const float* up, int64_t n) {
  const auto& t = cpu::ActiveKernels();
  if (n < (1 << 15)) {
    t.silu_mul(gate, up, n);
    return;
  }
  pool.ParallelRange(n, 64, [&](int64_t b, int64_t e, int) { t.silu_mul(gate + b, up + b, e - b); });
}

void Add(float* x, const float* y, int64_t n) { cpu::ActiveKernels().add(x, y, n); }

void EmbeddingRow(const WeightTensor& table, int64_t id, float* out) {
  cpu::ActiveKernels().row_to_f32(table.dtype, table.row(id), out, table.cols());
}

void Softmax(float* x, int64_t n) { cpu::ActiveKernels().softmax(x, n); }

void ConvertF16ToF32(const uint16_t* src, float* dst, int64_t n) { cpu::ActiveKernels().f16_to_f32(src, dst, n); }
void ConvertBf16ToF32(const uint16_t* src, float* dst, int64_t n) { cpu::ActiveKernels().bf16_to_f32(src, dst, n); }
void ConvertF32ToBf16(const float* src, uint16_t* dst, int64_t n) { cpu::ActiveKernels().f32_to_bf16(src, dst, n); }
void ConvertF32ToF16(const float* src, uint16_t* dst, int64_t n) { cpu::ActiveKernels().f32_to_f16(src, dst, n); }
void ConvertRowToF32(DType dtype, const void* src, float* dst, int64_t n) {
  cpu::ActiveKernels().row_to_f32(dtype, src, dst, n);
}

}  // namespace attic::backend
