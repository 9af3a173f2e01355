// kernels_bench: throughput of Attic's CPU kernels on the model shapes it must serve.
//
//   GEMV (decode, m = 1..8): effective weight bandwidth in GB/s, weights cold (each call
//     uses a different copy of the matrix, >= 512 MiB in rotation, so they come from DRAM
//     as in a real decode step).
//   GEMM (prefill, m = 512 / 2048): GFLOP/s (2*m*n*k / time).
//   Per-model sums: the Linear time of one decode step / one prefill of m tokens
//     (all layers + lm_head for decode; layers only for prefill, which needs the lm_head
//     for the last token only) -> a Linear-only tokens/s ceiling.
//   Decode step: every layer's Linears with distinct weights (the realistic number; the
//     per-matrix rows above are best-of-rounds of one shape and run ~15-25% higher), as
//     separate Linear calls and with LinearMulti for q/k/v and gate/up.
//   Crossover: GEMV vs GEMM time for m = 1..64 (sets KernelTable::gemv_max_m).
//   ThreadPool: cost of one ParallelFor, empty and with 2/10 us tasks.
//   Baselines (when built with -DATTIC_BENCH_DNNL): oneDNN bf16 matmul (src bf16,
//     weights [n,k] as 'ba', dst f32) and OpenBLAS sgemm with its own threads.
//   A/B (--only ab, not part of the default run): one decode step (as in "Decode step",
//     fused; --m rows, default 1) for several weight dtypes (--ab bf16,f16 by default;
//     "bf16-fma" is bf16 with the GEMV in its f32-FMA form where AVX512-BF16 would pick
//     vdpbf16ps; "bf16-ffn1" streams each layer's gate, up and down bytes in one call,
//     down as the [ffn, hidden] matrix a column-split fused FFN would read: the most that
//     fusing the two FFN calls can save) timed in rotating order round by round (--rounds
//     N), so that a noisy machine slows all of them alike; prints medians per dtype and
//     per matrix kind, and the median per-round time ratio to the first dtype. Use this to compare dtypes and
//     kernel forms; compare builds by running them alternately.
//
// Usage: kernels_bench [--threads N] [--quick] [--no-baselines] [--huge-pages] [--misalign B]
//                      [--json FILE]
//                      [--only pool|gemv|step|crossover|gemm|ab] [--model smollm2-135m|llama-1b]
//                      [--dtype bf16|f16|f32|q8_0] [--m 64|128|512|2048] [--ab DT,DT,...] [--rounds N]
// Output: a human table on stdout and one JSON document (stdout after the table, or FILE).
// Built by CMake (target kernels_bench; -DATTIC_BENCH_DNNL when oneDNN is found).
// On a shared machine run one section at a time when it is idle (numbers are best-of-5).
#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attic/backend/kernels.h"
#include "attic/backend/thread_pool.h"
#include "attic/tensor/buffer.h"
#include "backend/cpu/kernel_table.h"
#include "bench/common/flags.h"
#include "bench/common/format.h"
#include "bench/common/measure.h"
#include "bench/common/model_shapes.h"
#include "bench/common/output.h"
#include "bench/common/stats.h"

#ifdef ATTIC_BENCH_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace {

// Command-line filters (empty = all).
std::string g_model_filter, g_dtype_filter;
int g_m_filter = 0;  // GEMM: only this m
bool g_huge_pages = false;  // --huge-pages: weights in 2 MiB transparent huge pages
int g_misalign = 0;         // --misalign B: weights start B bytes past a 64-byte boundary
bool Skip(const char* model, attic::DType dt) {
  return (!g_model_filter.empty() && g_model_filter != model) ||
         (!g_dtype_filter.empty() && g_dtype_filter != attic::DTypeName(dt));
}

using attic::AlignedBuffer;
using attic::DType;
using attic::backend::ThreadPool;
using attic::WeightTensor;
namespace cpu = attic::backend::cpu;

using attic::bench::Fmt;
using attic::bench::Median;
using attic::bench::NowSeconds;

struct Mat {
  const char* name;
  int64_t n, k;
  int per_layer;  // how many per layer (0 = once per model, i.e. lm_head)
};

struct ModelMatrices {
  const char* name;
  int n_layers;
  std::vector<Mat> mats;
};

// The Linear matrices of each benchmark shape (bench/common/model_shapes.h), in the
// order BenchAb indexes them: q, k, v, o, gate, up, down, then lm_head.
std::vector<ModelMatrices> Models() {
  std::vector<ModelMatrices> out;
  for (const attic::bench::ModelShape& s : attic::bench::BenchModelShapes()) {
    out.push_back({s.name, s.n_layers,
                   {{"wq", s.q_dim(), s.hidden, 1},
                    {"wk", s.kv_dim(), s.hidden, 1},
                    {"wv", s.kv_dim(), s.hidden, 1},
                    {"wo", s.hidden, s.q_dim(), 1},
                    {"w_gate", s.ffn, s.hidden, 1},
                    {"w_up", s.ffn, s.hidden, 1},
                    {"w_down", s.hidden, s.ffn, 1},
                    {"lm_head", s.vocab, s.hidden, 0}}});
  }
  return out;
}

// Fills a weight buffer with sane random values of the dtype (no NaN/inf/subnormals).
void FillWeights(DType dt, uint8_t* p, int64_t n, int64_t k, uint64_t seed) {
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  };
  const int64_t count = n * k;
  switch (dt) {
    case DType::kBF16: {
      auto* q = reinterpret_cast<uint16_t*>(p);
      for (int64_t i = 0; i < count; ++i) { uint32_t r = next(); q[i] = static_cast<uint16_t>(0x3c00 | (r & 0x7f) | (r & 0x100 ? 0x8000 : 0) | ((r >> 9) & 3) << 7); }
      break;
    }
    case DType::kF16: {
      auto* q = reinterpret_cast<uint16_t*>(p);
      for (int64_t i = 0; i < count; ++i) { uint32_t r = next(); q[i] = static_cast<uint16_t>(0x2000 | (r & 0xfff) | (r & 0x10000 ? 0x8000 : 0)); }
      break;
    }
    case DType::kF32: {
      auto* q = reinterpret_cast<uint32_t*>(p);
      for (int64_t i = 0; i < count; ++i) { uint32_t r = next(); q[i] = 0x3c000000u | (r & 0x1ffffff) | (r & 0x80000000u); }
      break;
    }
    case DType::kQ8_0: {
      for (int64_t b = 0; b < count / 32; ++b) {
        uint8_t* blk = p + b * 34;
        uint16_t d = 0x2000;
        std::memcpy(blk, &d, 2);
        for (int i = 0; i < 32; ++i) blk[2 + i] = static_cast<uint8_t>(next());
      }
      break;
    }
    default:  // the other block types are not among this program's dtypes
      std::fprintf(stderr, "kernels_bench: no weights of %s\n", attic::DTypeName(dt));
      std::abort();
  }
}

// `copies` independent copies of an [n, k] matrix.
struct WeightSet {
  std::vector<AlignedBuffer> bufs;
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> huge;  // --huge-pages buffers
  std::vector<WeightTensor> w;
  WeightSet(DType dt, int64_t n, int64_t k, int copies) {
    for (int c = 0; c < copies; ++c) {
      bufs.emplace_back();
      const size_t bytes = attic::DTypeBytes(dt, static_cast<size_t>(n * k));
      if (g_huge_pages && bytes >= (2u << 20)) {
        // 2 MiB-aligned and THP-advised before first touch (the buffer is re-made here).
        void* p = nullptr;
        const size_t rounded = (bytes + (2u << 20) - 1) & ~size_t{(2u << 20) - 1};
        if (posix_memalign(&p, 2u << 20, rounded) == 0) {
          madvise(p, rounded, MADV_HUGEPAGE);
          huge.emplace_back(static_cast<uint8_t*>(p), &std::free);
          std::memset(p, 0, rounded);
        }
      }
      if (huge.size() <= static_cast<size_t>(c)) bufs.back().Resize(bytes + 64);
      uint8_t* data = huge.size() > static_cast<size_t>(c) ? huge[static_cast<size_t>(c)].get() : bufs.back().data() + g_misalign;
      FillWeights(dt, data, n, k, static_cast<uint64_t>(c + 1) * 977 + static_cast<uint64_t>(n));
      WeightTensor t;
      t.dtype = dt;
      t.data = data;
      t.shape = {n, k};
      w.push_back(t);
    }
  }
  // Adds each copy's prepacked layout (the active ISA's GEMM, as backend::PrepackWeights
  // does at load); false when that GEMM has none for this dtype.
  bool Prepack(ThreadPool& pool) {
    const cpu::KernelTable& t = cpu::ActiveKernels();
    for (WeightTensor& wt : w) {
      if (!cpu::CanPrepack(t, wt)) return false;
      packed_bufs.push_back(cpu::PrepackWith(t, pool, &wt));
    }
    return true;
  }
  std::vector<std::shared_ptr<AlignedBuffer>> packed_bufs;  // Prepack's copies
};

std::vector<float> RandomF32(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = 12345;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(s >> 8) % 2001 - 1000) * 1e-3f;
  }
  return v;
}

// Seconds per call of fn(i) (i = call index): the best of kRounds rounds, each at least
// min_time / kRounds seconds and min_reps calls. Best-of filters out other processes
// on a shared machine; the first call of each round is not timed (warm-up).
double TimePerCall(const std::function<void(int)>& fn, double min_time, int min_reps) {
  constexpr int kRounds = 5;
  double best = 1e30;
  int idx = 0;
  for (int round = 0; round < kRounds; ++round) {
    fn(idx++);
    int reps = 0;
    double t0 = NowSeconds(), t;
    do {
      fn(idx++);
      ++reps;
      t = NowSeconds();
    } while (t - t0 < min_time / kRounds || reps < min_reps);
    best = std::min(best, (t - t0) / reps);
  }
  return best;
}

struct Json {
  std::string s = "{";
  bool first_section = true;
  std::string cur;
  void Begin(const char* name) {
    s += (first_section ? "\n \"" : ",\n \"") + std::string(name) + "\": [";
    first_section = false;
    cur.clear();
  }
  void Row(const std::string& row) {
    s += (cur.empty() ? "\n  " : ",\n  ") + row;
    cur = "x";
  }
  void End() { s += "\n ]"; }
  std::string Done() { return s + "\n}\n"; }
};

void BenchPool(ThreadPool& pool, Json& json) {
  json.Begin("pool");
  printf("\n== ThreadPool (%d threads) ==\n", pool.n_threads());
  volatile int sink = 0;
  double t_for = TimePerCall([&](int) { pool.ParallelFor(pool.n_threads(), [&](int64_t, int) { sink = sink + 1; }); }, 0.3, 1000);
  double t_range = TimePerCall([&](int) { pool.ParallelRange(1000, 16, [&](int64_t, int64_t, int) { sink = sink + 1; }); }, 0.3, 1000);
  printf("ParallelFor(n_threads tasks, empty): %.2f us/call\nParallelRange(1000, align 16, empty): %.2f us/call\n",
         t_for * 1e6, t_range * 1e6);
  // Overhead with real work: each thread busy-waits `work` us; overhead = wall - work.
  for (double work_us : {2.0, 10.0}) {
    auto busy = [&](int64_t, int) {
      double end = NowSeconds() + work_us * 1e-6;
      while (NowSeconds() < end) {
      }
    };
    double t_busy = TimePerCall([&](int) { pool.ParallelFor(pool.n_threads(), busy); }, 0.3, 1000);
    printf("ParallelFor(n_threads tasks of %.0f us): overhead %.2f us/call\n", work_us, t_busy * 1e6 - work_us);
    json.Row(Fmt("{\"op\": \"parallel_for_busy\", \"work_us\": %.1f, \"overhead_us\": %.3f}", work_us,
                 t_busy * 1e6 - work_us));
  }
  json.Row(Fmt("{\"op\": \"parallel_for\", \"threads\": %d, \"us\": %.3f}", pool.n_threads(), t_for * 1e6));
  json.Row(Fmt("{\"op\": \"parallel_range\", \"threads\": %d, \"us\": %.3f}", pool.n_threads(), t_range * 1e6));
  json.End();
}

void BenchGemv(ThreadPool& pool, bool quick, Json& json) {
  json.Begin("gemv");
  const auto& t = cpu::ActiveKernels();
  printf("\n== GEMV (decode), isa=%s, %d threads, cold weights ==\n", t.name, pool.n_threads());
  printf("%-13s %-5s %-8s %6s %6s %2s %9s %8s\n", "model", "dtype", "matrix", "n", "k", "m", "us/call", "GB/s");
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kQ8_0};
  for (const ModelMatrices& model : Models()) {
    for (DType dt : dtypes) {
      if ((quick && (dt == DType::kF32 || dt == DType::kQ8_0)) || Skip(model.name, dt)) continue;
      double step_s = 0, step_bytes = 0;
      for (const Mat& mat : model.mats) {
        const double bytes = static_cast<double>(attic::DTypeBytes(dt, static_cast<size_t>(mat.n * mat.k)));
        const int copies = std::max(2, static_cast<int>((quick ? 256e6 : 512e6) / bytes));
        WeightSet ws(dt, mat.n, mat.k, copies);
        std::vector<int> ms = {1};
        if (!quick && (std::string(mat.name) == "w_up" || std::string(mat.name) == "wq")) ms = {1, 2, 4, 8};
        for (int m : ms) {
          std::vector<float> x = RandomF32(m * mat.k), y(static_cast<size_t>(m * mat.n));
          double s = TimePerCall([&](int i) {
            cpu::LinearWithPath(t, cpu::LinearPath::kGemv, pool, x.data(), m, ws.w[i % copies], nullptr, y.data());
          }, quick ? 0.1 : 0.25, copies);
          printf("%-13s %-5s %-8s %6lld %6lld %2d %9.1f %8.2f\n", model.name, attic::DTypeName(dt), mat.name,
                 static_cast<long long>(mat.n), static_cast<long long>(mat.k), m, s * 1e6, bytes / s / 1e9);
          json.Row(Fmt("{\"model\": \"%s\", \"dtype\": \"%s\", \"matrix\": \"%s\", \"n\": %lld, \"k\": %lld, \"m\": %d, "
                       "\"us\": %.2f, \"gbps\": %.3f}",
                       model.name, attic::DTypeName(dt), mat.name, static_cast<long long>(mat.n),
                       static_cast<long long>(mat.k), m, s * 1e6, bytes / s / 1e9));
          if (m == 1) {
            const int count = mat.per_layer ? mat.per_layer * model.n_layers : 1;
            step_s += s * count;
            step_bytes += bytes * count;
          }
        }
      }
      printf("%-13s %-5s DECODE STEP (Linear only): %.2f ms, %.2f GB/s -> <= %.1f tok/s\n", model.name,
             attic::DTypeName(dt), step_s * 1e3, step_bytes / step_s / 1e9, 1.0 / step_s);
      json.Row(Fmt("{\"model\": \"%s\", \"dtype\": \"%s\", \"matrix\": \"decode_step\", \"ms\": %.3f, \"gbps\": %.3f, "
                   "\"tok_s_linear_only\": %.2f}",
                   model.name, attic::DTypeName(dt), step_s * 1e3, step_bytes / step_s / 1e9, 1.0 / step_s));
    }
  }
  json.End();
}

#ifdef ATTIC_BENCH_DNNL
// oneDNN bf16 matmul y[m,n] = bf16(x)[m,k] * W^T with W [n,k] bf16 used in place ('ba').
double DnnlBf16Seconds(const WeightTensor& w, const float* x, int64_t m, float* y) {
  using namespace dnnl;
  static engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  const int64_t n = w.rows(), k = w.cols();
  memory::desc src_md({m, k}, memory::data_type::bf16, memory::format_tag::ab);
  memory::desc wei_md({k, n}, memory::data_type::bf16, memory::format_tag::ba);
  memory::desc dst_md({m, n}, memory::data_type::f32, memory::format_tag::ab);
  matmul::primitive_desc pd(matmul::desc(src_md, wei_md, dst_md), eng);
  matmul prim(pd);
  std::vector<uint16_t> xb(static_cast<size_t>(m * k));
  attic::ConvertFromF32(DType::kBF16, x, xb.data(), xb.size());
  memory src(src_md, eng, xb.data()), wei(wei_md, eng, const_cast<void*>(w.data)), dst(dst_md, eng, y);
  return TimePerCall([&](int) {
    prim.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    strm.wait();
  }, 0.2, 2);
}
#endif

void BenchGemm(ThreadPool& pool, bool quick, bool baselines, Json& json) {
  json.Begin("gemm");
  const auto& t = cpu::ActiveKernels();
  printf("\n== GEMM (prefill), isa=%s, %d threads ==\n", t.name, pool.n_threads());
  printf("%-13s %-5s %-8s %6s %6s %5s %9s %8s %10s %10s\n", "model", "dtype", "matrix", "n", "k", "m", "ms/call",
         "GFLOP/s", "dnnl_bf16", "blas_f32");
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kQ8_0};
  for (const ModelMatrices& model : Models()) {
    for (int64_t m : {64, 128, 512, 2048}) {
      if (quick && m == 2048 && std::string(model.name) == "llama-1b") continue;
      if (g_m_filter ? m != g_m_filter : m < 512) continue;
      for (DType dt : dtypes) {
        if ((quick && (dt == DType::kF32 || dt == DType::kQ8_0)) || Skip(model.name, dt)) continue;
        double layer_s = 0, layer_flop = 0;
        for (const Mat& mat : model.mats) {
          if (!mat.per_layer) continue;
          // Small m: one weight copy per layer, cycled, so the weights come from DRAM as in
          // a real forward pass (at m >= 512 one copy; the packing cost is amortized).
          const int copies = m < 512 ? model.n_layers : 1;
          WeightSet ws(dt, mat.n, mat.k, copies);
          std::vector<float> x = RandomF32(m * mat.k), y(static_cast<size_t>(m * mat.n));
          const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(mat.n) * static_cast<double>(mat.k);
          double s = TimePerCall([&](int i) {
            cpu::LinearWithPath(t, cpu::LinearPath::kGemm, pool, x.data(), m, ws.w[static_cast<size_t>(i % copies)],
                                nullptr, y.data());
          }, quick ? 0.1 : 0.3, 2);
          double dnnl_gf = 0, blas_gf = 0;
#ifdef ATTIC_BENCH_DNNL
          if (baselines && dt == DType::kBF16) dnnl_gf = flop / DnnlBf16Seconds(ws.w[0], x.data(), m, y.data()) / 1e9;
#endif
          if (baselines && dt == DType::kF32) {
            openblas_set_num_threads(pool.n_threads());
            double bs = TimePerCall([&](int) {
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(mat.n),
                          static_cast<int>(mat.k), 1.0f, x.data(), static_cast<int>(mat.k),
                          static_cast<const float*>(ws.w[0].data), static_cast<int>(mat.k), 0.0f, y.data(),
                          static_cast<int>(mat.n));
            }, 0.2, 2);
            openblas_set_num_threads(1);
            blas_gf = flop / bs / 1e9;
          }
          printf("%-13s %-5s %-8s %6lld %6lld %5lld %9.2f %8.1f %10.1f %10.1f\n", model.name, attic::DTypeName(dt),
                 mat.name, static_cast<long long>(mat.n), static_cast<long long>(mat.k), static_cast<long long>(m),
                 s * 1e3, flop / s / 1e9, dnnl_gf, blas_gf);
          json.Row(Fmt("{\"model\": \"%s\", \"dtype\": \"%s\", \"matrix\": \"%s\", \"n\": %lld, \"k\": %lld, \"m\": %lld, "
                       "\"ms\": %.3f, \"gflops\": %.2f, \"dnnl_bf16_gflops\": %.2f, \"openblas_f32_gflops\": %.2f}",
                       model.name, attic::DTypeName(dt), mat.name, static_cast<long long>(mat.n),
                       static_cast<long long>(mat.k), static_cast<long long>(m), s * 1e3, flop / s / 1e9, dnnl_gf,
                       blas_gf));
          layer_s += s * mat.per_layer;
          layer_flop += flop * mat.per_layer;
        }
        const double total = layer_s * model.n_layers;
        printf("%-13s %-5s PREFILL m=%lld (Linear only, no lm_head): %.1f ms, %.1f GFLOP/s -> <= %.0f tok/s\n",
               model.name, attic::DTypeName(dt), static_cast<long long>(m), total * 1e3, layer_flop / layer_s / 1e9,
               static_cast<double>(m) / total);
        json.Row(Fmt("{\"model\": \"%s\", \"dtype\": \"%s\", \"matrix\": \"prefill\", \"m\": %lld, \"ms\": %.2f, "
                     "\"gflops\": %.2f, \"tok_s_linear_only\": %.1f}",
                     model.name, attic::DTypeName(dt), static_cast<long long>(m), total * 1e3,
                     layer_flop / layer_s / 1e9, static_cast<double>(m) / total));
      }
    }
  }
  json.End();
}

// A whole decode step's Linears (m = 1) over every layer's own weights (so they come
// from DRAM as in real decoding): q, k, v, o, gate, up, down per layer + lm_head, as
// separate Linear calls and with LinearMulti for q/k/v and gate/up.
void BenchStep(ThreadPool& pool, Json& json) {
  json.Begin("decode_step");
  printf("\n== Decode step, all layers (m=1, distinct weights per layer), %d threads ==\n", pool.n_threads());
  printf("%-13s %-5s %12s %12s %10s\n", "model", "dtype", "separate_ms", "fused_ms", "GB/s");
  for (const ModelMatrices& model : Models()) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kQ8_0}) {
      if (Skip(model.name, dt)) continue;
      std::vector<std::unique_ptr<WeightSet>> layers;  // per layer: one WeightSet per matrix
      std::vector<WeightTensor> w;                      // [layer * 7 + matrix]
      double bytes = 0;
      for (int l = 0; l < model.n_layers; ++l) {
        for (const Mat& mat : model.mats) {
          if (!mat.per_layer) continue;
          layers.push_back(std::make_unique<WeightSet>(dt, mat.n, mat.k, 1));
          w.push_back(layers.back()->w[0]);
          bytes += static_cast<double>(attic::DTypeBytes(dt, static_cast<size_t>(mat.n * mat.k)));
        }
      }
      const Mat& head = model.mats.back();
      WeightSet lm(dt, head.n, head.k, 1);
      bytes += static_cast<double>(attic::DTypeBytes(dt, static_cast<size_t>(head.n * head.k)));
      const int64_t hidden = model.mats[0].k, ffn = model.mats[4].n;
      std::vector<float> x = RandomF32(std::max(hidden, ffn)), q(hidden * 4), kv(hidden * 4), g(ffn), u(ffn),
          logits(head.n);
      double s[2];
      for (int fused = 0; fused < 2; ++fused) {
        s[fused] = TimePerCall([&](int) {
          for (int l = 0; l < model.n_layers; ++l) {
            const WeightTensor* lw = &w[static_cast<size_t>(l) * 7];
            if (fused) {
              attic::backend::LinearOutput qkv[3] = {{&lw[0], nullptr, q.data()}, {&lw[1], nullptr, kv.data()},
                                                     {&lw[2], nullptr, kv.data() + hidden}};
              attic::backend::LinearMulti(pool, x.data(), 1, qkv, 3);
            } else {
              attic::backend::Linear(pool, x.data(), 1, lw[0], nullptr, q.data());
              attic::backend::Linear(pool, x.data(), 1, lw[1], nullptr, kv.data());
              attic::backend::Linear(pool, x.data(), 1, lw[2], nullptr, kv.data() + hidden);
            }
            attic::backend::Linear(pool, q.data(), 1, lw[3], nullptr, x.data());
            if (fused) {
              attic::backend::LinearOutput gu[2] = {{&lw[4], nullptr, g.data()}, {&lw[5], nullptr, u.data()}};
              attic::backend::LinearMulti(pool, x.data(), 1, gu, 2);
            } else {
              attic::backend::Linear(pool, x.data(), 1, lw[4], nullptr, g.data());
              attic::backend::Linear(pool, x.data(), 1, lw[5], nullptr, u.data());
            }
            attic::backend::Linear(pool, g.data(), 1, lw[6], nullptr, x.data());
          }
          attic::backend::Linear(pool, x.data(), 1, lm.w[0], nullptr, logits.data());
        }, 0.5, 3);
      }
      printf("%-13s %-5s %12.2f %12.2f %10.1f  (Linear-only ceiling %.0f tok/s)\n", model.name, attic::DTypeName(dt),
             s[0] * 1e3, s[1] * 1e3, bytes / s[1] / 1e9, 1.0 / s[1]);
      json.Row(Fmt("{\"model\": \"%s\", \"dtype\": \"%s\", \"separate_ms\": %.3f, \"fused_ms\": %.3f, \"gbps\": %.2f}",
                   model.name, attic::DTypeName(dt), s[0] * 1e3, s[1] * 1e3, bytes / s[1] / 1e9));
    }
  }
  json.End();
}

// GEMV vs GEMM for small m: where Linear should switch (KernelTable::gemv_max_m).
void BenchCrossover(ThreadPool& pool, Json& json) {
  json.Begin("crossover");
  const auto& t = cpu::ActiveKernels();
  printf("\n== GEMV vs GEMM by m (us/call, cold weights: gemv/gemm, and /gemm on prepacked weights where the ISA's GEMM has them), isa=%s ==\n", t.name);
  printf("%-13s %-5s %-8s", "model", "dtype", "matrix");
  const int ms[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64};
  for (int m : ms) printf(" %11d", m);
  printf("\n");
  for (const ModelMatrices& model : Models()) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32, DType::kQ8_0}) {
      if (Skip(model.name, dt)) continue;
      for (const Mat& mat : model.mats) {
        if (std::string(mat.name) != "w_up" && std::string(mat.name) != "wk") continue;
        const double bytes = static_cast<double>(attic::DTypeBytes(dt, static_cast<size_t>(mat.n * mat.k)));
        const int copies = std::max(2, static_cast<int>(256e6 / bytes));
        WeightSet ws(dt, mat.n, mat.k, copies);
        WeightSet packed(dt, mat.n, mat.k, copies);  // the same matrices, prepacked
        const bool has_packed = packed.Prepack(pool);
        printf("%-13s %-5s %-8s", model.name, attic::DTypeName(dt), mat.name);
        for (int m : ms) {
          std::vector<float> x = RandomF32(m * mat.k), y(static_cast<size_t>(m * mat.n));
          double s[3] = {0, 0, 0};
          for (int path = 0; path < (has_packed ? 3 : 2); ++path) {
            const WeightSet& set = path == 2 ? packed : ws;
            s[path] = TimePerCall([&](int i) {
              cpu::LinearWithPath(t, path ? cpu::LinearPath::kGemm : cpu::LinearPath::kGemv, pool, x.data(), m,
                                  set.w[i % copies], nullptr, y.data());
            }, 0.05, std::min(copies, 20));
          }
          if (has_packed) {
            printf(" %4.0f/%4.0f/%-4.0f", s[0] * 1e6, s[1] * 1e6, s[2] * 1e6);
          } else {
            printf(" %5.0f/%-5.0f", s[0] * 1e6, s[1] * 1e6);
          }
          json.Row(Fmt("{\"model\": \"%s\", \"dtype\": \"%s\", \"matrix\": \"%s\", \"m\": %d, \"gemv_us\": %.2f, "
                       "\"gemm_us\": %.2f, \"gemm_prepacked_us\": %.2f}",
                       model.name, attic::DTypeName(dt), mat.name, m, s[0] * 1e6, s[1] * 1e6, s[2] * 1e6));
        }
        printf("\n");
      }
    }
  }
  json.End();
}

// An A/B contestant: a weight dtype, for bf16 optionally with the f32-FMA GEMV form.
struct AbForm {
  DType dt;
  bool fma = false;
  bool ffn1 = false;
  std::string name() const { return std::string(attic::DTypeName(dt)) + (fma ? "-fma" : "") + (ffn1 ? "-ffn1" : ""); }
};

// Interleaved A/B of one decode step (--m rows, default 1; every layer's own weights,
// fused q/k/v and gate/up as the engine calls them) for several contestants: each round
// times one step per contestant, in rotating order, so slow phases of a shared machine
// hit all alike. Prints per-contestant medians (whole step and per matrix kind) and the
// median per-round ratio of each one's step time to the first one's.
void BenchAb(ThreadPool& pool, int rounds, const std::vector<AbForm>& forms, Json& json) {
  json.Begin("ab");
  const std::vector<ModelMatrices> models = Models();
  const ModelMatrices* model = nullptr;
  for (const ModelMatrices& m : models)
    if (g_model_filter.empty() ? std::string(m.name) == "llama-1b" : g_model_filter == m.name) model = &m;
  if (model == nullptr) return;
  const int n_mats = static_cast<int>(model->mats.size());  // 7 per layer + lm_head
  const int64_t m = g_m_filter > 0 ? g_m_filter : 1;
  struct Set {
    AbForm form;
    std::vector<std::unique_ptr<WeightSet>> owned;
    std::vector<WeightTensor> w;  // [layer * 7 + matrix], then lm_head
    double bytes = 0;
    std::vector<double> step_ms;
    std::vector<std::vector<double>> mat_ms;  // [matrix kind][round]
  };
  std::vector<Set> sets(forms.size());
  for (size_t d = 0; d < forms.size(); ++d) {
    Set& set = sets[d];
    set.form = forms[d];
    for (int l = 0; l <= model->n_layers; ++l) {
      for (const Mat& mat : model->mats) {
        if ((l < model->n_layers) != (mat.per_layer != 0)) continue;
        const bool down = set.form.ffn1 && &mat == &model->mats[6];  // bf16-ffn1: down as [ffn, hidden]
        set.owned.push_back(std::make_unique<WeightSet>(set.form.dt, down ? mat.k : mat.n, down ? mat.n : mat.k, 1));
        set.w.push_back(set.owned.back()->w[0]);
        set.bytes += static_cast<double>(attic::DTypeBytes(set.form.dt, static_cast<size_t>(mat.n * mat.k)));
      }
    }
    set.mat_ms.resize(static_cast<size_t>(n_mats) - 2);  // q/k/v fused, gate/up fused
  }
  const int64_t hidden = model->mats[0].k, ffn = model->mats[4].n, vocab = model->mats.back().n;
  std::vector<float> x = RandomF32(std::max(hidden, ffn) * m), q(hidden * 4 * m), kv(hidden * 4 * m), g(ffn * m),
                     u(ffn * m), logits(vocab * m);
  const char* kinds[] = {"qkv", "wo", "gate_up", "w_down", "lm_head"};
  auto step = [&](Set& set, std::vector<double>* kind_s) {
    attic::backend::cpu::avx512::SetBf16GemvDotDisabledForTesting(set.form.fma);
    auto timed = [&](int kind, const std::function<void()>& fn) {
      const double t0 = NowSeconds();
      fn();
      (*kind_s)[static_cast<size_t>(kind)] += NowSeconds() - t0;
    };
    for (int l = 0; l < model->n_layers; ++l) {
      const WeightTensor* lw = &set.w[static_cast<size_t>(l) * 7];
      timed(0, [&] {
        attic::backend::LinearOutput qkv[3] = {{&lw[0], nullptr, q.data()}, {&lw[1], nullptr, kv.data()},
                                               {&lw[2], nullptr, kv.data() + hidden * m}};
        attic::backend::LinearMulti(pool, x.data(), m, qkv, 3);
      });
      timed(1, [&] { attic::backend::Linear(pool, q.data(), m, lw[3], nullptr, x.data()); });
      // bf16-ffn1: down joins gate and up in one call (its output is not a real FFN's,
      // only its bytes are).
      timed(2, [&] {
        attic::backend::LinearOutput gu[3] = {
            {&lw[4], nullptr, g.data()}, {&lw[5], nullptr, u.data()}, {&lw[6], nullptr, q.data()}};
        attic::backend::LinearMulti(pool, x.data(), m, gu, set.form.ffn1 ? 3 : 2);
      });
      if (!set.form.ffn1) timed(3, [&] { attic::backend::Linear(pool, g.data(), m, lw[6], nullptr, x.data()); });
    }
    timed(4, [&] { attic::backend::Linear(pool, x.data(), m, set.w.back(), nullptr, logits.data()); });
    attic::backend::cpu::avx512::SetBf16GemvDotDisabledForTesting(false);
  };
  for (Set& set : sets) {  // warm-up: first touch, page faults
    std::vector<double> k(5);
    step(set, &k);
  }
  printf("\n== A/B decode step (%s, m=%lld, fused, distinct weights, %d threads, misalign %d), %d rounds ==\n",
         model->name, static_cast<long long>(m), pool.n_threads(), g_misalign, rounds);
  std::vector<std::vector<double>> ratios(sets.size());
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> t(sets.size());
    for (size_t o = 0; o < sets.size(); ++o) {
      const size_t d = (o + static_cast<size_t>(r)) % sets.size();
      std::vector<double> k(5);
      const double t0 = NowSeconds();
      step(sets[d], &k);
      t[d] = NowSeconds() - t0;
      sets[d].step_ms.push_back(t[d] * 1e3);
      for (size_t i = 0; i < 5; ++i) sets[d].mat_ms[i].push_back(k[i] * 1e3);
    }
    for (size_t d = 0; d < sets.size(); ++d) ratios[d].push_back(t[d] / t[0]);
  }
  printf("%-8s %9s %7s %9s", "dtype", "step_ms", "GB/s", "vs_first");
  for (const char* kname : kinds) printf(" %9s", kname);
  printf("   (medians; per-kind ms summed over layers)\n");
  for (size_t d = 0; d < sets.size(); ++d) {
    const double ms = Median(sets[d].step_ms);
    printf("%-8s %9.2f %7.1f %9.3f", sets[d].form.name().c_str(), ms, sets[d].bytes / ms / 1e6, Median(ratios[d]));
    std::string kj;
    for (size_t i = 0; i < 5; ++i) {
      printf(" %9.2f", Median(sets[d].mat_ms[i]));
      kj += Fmt(", \"%s_ms\": %.3f", kinds[i], Median(sets[d].mat_ms[i]));
    }
    printf("\n");
    json.Row(Fmt("{\"model\": \"%s\", \"dtype\": \"%s\", \"m\": %lld, \"rounds\": %d, \"step_ms\": %.3f, "
                 "\"gbps\": %.2f, \"time_ratio_vs_first\": %.4f%s}",
                 model->name, sets[d].form.name().c_str(), static_cast<long long>(m), rounds, ms, sets[d].bytes / ms / 1e6,
                 Median(ratios[d]), kj.c_str()));
  }
  json.End();
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, rounds = 15;
  bool quick = false;
  std::vector<AbForm> ab_forms = {{DType::kBF16}, {DType::kF16}};
  std::string json_path, only;
  bool no_baselines = false;
  attic::bench::FlagParser flags(
      "kernels_bench",
      "[--threads N] [--quick] [--no-baselines] [--huge-pages] [--misalign B] [--json FILE]\n"
      "         [--only pool|gemv|step|crossover|gemm|ab] [--model NAME] [--dtype DT] [--m M] [--ab DT,DT,...] "
      "[--rounds N]");
  flags.Int("--threads", &threads);
  flags.Switch("--quick", &quick);
  flags.Switch("--huge-pages", &g_huge_pages);
  flags.Int("--misalign", &g_misalign);
  flags.Switch("--no-baselines", &no_baselines);
  flags.String("--json", &json_path);
  flags.String("--only", &only);
  flags.String("--model", &g_model_filter);
  flags.String("--dtype", &g_dtype_filter);
  flags.Int("--m", &g_m_filter);
  flags.Int("--rounds", &rounds);
  flags.Custom("--ab", [&](const std::string& list) -> attic::Status {
    ab_forms.clear();
    for (const std::string& name : attic::bench::SplitList(list)) {
      if (name == "bf16-ffn1") {
        ab_forms.push_back({DType::kBF16, false, true});
      } else if (name == "bf16-fma") {
        ab_forms.push_back({DType::kBF16, true});
      } else if (auto dt = attic::ParseDType(name); dt.ok()) {
        ab_forms.push_back({*dt});
      } else {
        return attic::InvalidArgumentError("unknown weight type '" + name + "'");
      }
    }
    return attic::OkStatus();
  });
  flags.ParseOrExit(argc, argv);
  const bool baselines = !no_baselines;
  attic::bench::CheckOutput("kernels_bench", json_path);
  openblas_set_num_threads(1);
  ThreadPool pool(threads);
  Json json;
  if (only.empty() || only == "pool") BenchPool(pool, json);
  if (only.empty() || only == "gemv") BenchGemv(pool, quick, json);
  if (only.empty() || only == "step") BenchStep(pool, json);
  if (only.empty() || only == "crossover") BenchCrossover(pool, json);
  if (only.empty() || only == "gemm") BenchGemm(pool, quick, baselines, json);
  if (only == "ab") BenchAb(pool, rounds, ab_forms, json);
  const std::string doc = json.Done();
  if (json_path.empty()) printf("\n%s", doc.c_str());
  attic::bench::WriteOutput("kernels_bench", json_path, doc);
  return 0;
}
