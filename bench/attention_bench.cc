// attention_bench: throughput of attic::attention::Attend on the model shapes Attic
// targets. Prefill is causal over N tokens (n_q = n_kv = N, one layer, compute-bound);
// decode is one query over N slots, cycling through n_layers distinct KV layers so the
// KV comes from DRAM as in a real decode step.
//
// FLOPs count the work the causal mask leaves: 4 * head_dim * n_heads * sum_i visible(i)
// (QK^T and PV, 2 FLOPs per multiply-add). Decode also reports KV bytes read per second.
// batchB is continuous batching's decode: B sequences, one query each over 2048 slots of
// its own, in one AttendBatch call.
// chunkQ is a turn's prefill over stored history: Q new queries after 2048 slots, cycling
// through n_layers KV layers (the shape of a returning conversation's step).
// sparseR is PQCache's decode step (docs/sparse.md): one query over --sparse-context
// slots (default 8192) where each KV head sees its own ascending index list of R x the
// slots: 4 initial slots, a local window of a quarter of the budget at the end, and the
// rest drawn uniformly from the middle (as a random-weight model's selection scatters);
// "sparse1.0" is the same step with no lists (full attention), the baseline to divide by.
// KV bytes count the rows the lists select.
// Every case runs with f32, f16 and q8_0 KV storage (the compute buffer's dtypes), or with
// --kv's: one type (f32, f16, q8_0, q4_0) or K's and V's (q8_0/q4_0), laid out by
// kv::BlockPool as the engine's are.
//
// Blocks of --block-size tokens (default: the engine's, attic::kv::kDefaultBlockSize).
//
// Usage: attention_bench [--threads N] [--reps N] [--block-size N]
//                        [--only prefill|decode|batch|chunk|sparse] [--history N]
//                        [--sparse-context N] [--decode-context N] [--kv T|K/V]
//                        [--evict MiB] [--json-only]
// --history sets the stored slots the chunk cases follow (default 2048); --decode-context
// the slots of the decode case (default: 512 and 2048). --evict M (decode and sparse
// cases): before each layer the threads read M MiB of other memory, untimed, as the
// weights of a decode step evict the KV between layers (40 for a 32 MiB L3), so that KV
// comes from DRAM even where all layers' KV would fit in the cache.
// ATTIC_ISA=generic|avx2 caps the kernels used, as everywhere in Attic.
// Output: a human table, then one JSON object on the last line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attic/attention/attention.h"
#include "attic/backend/cpu_features.h"
#include "attic/backend/thread_pool.h"
#include "attic/kv/block_pool.h"
#include "attic/pq/sparse.h"
#include "attic/tensor/dtype.h"
#include "bench/common/flags.h"
#include "bench/common/measure.h"
#include "bench/common/model_shapes.h"

namespace {

using attic::DType;
using attic::DTypeName;
using attic::attention::AttentionShape;
using attic::attention::KvLayerView;
using attic::bench::ModelShape;
using attic::bench::NowSeconds;

// One layer's paged KV in a block pool of its own (the engine's layout for any K and V
// types), its blocks in shuffled order (as a pool hands them out over time).
struct Layer {
  std::unique_ptr<attic::kv::BlockPool> pool;
  std::vector<int32_t> table;
  KvLayerView view;
};

int g_block_size = attic::kv::kDefaultBlockSize;
int g_evict_mib = 0;  // --evict

// K's and V's storage types.
struct KvTypes {
  DType k, v;
};
std::string KvName(KvTypes t) {
  return t.k == t.v ? DTypeName(t.k) : std::string(DTypeName(t.k)) + "/" + DTypeName(t.v);
}
// Bytes of one K row plus one V row of head_dim elements, scales included.
double KvRowBytes(KvTypes t, int head_dim) {
  attic::kv::KvShape s;
  s.n_kv_heads = 1;
  s.block_size = 1;
  s.head_dim = head_dim;
  return static_cast<double>(s.LayerBytes(t.k) + s.LayerBytes(t.v));
}

Layer MakeLayer(const ModelShape& m, int n_slots, KvTypes kv, std::mt19937& rng) {
  Layer l;
  attic::kv::KvShape shape;
  shape.n_layers = 1;
  shape.n_kv_heads = m.n_kv_heads;
  shape.head_dim = m.head_dim;
  shape.block_size = g_block_size;
  shape.k_dtype = kv.k;
  shape.v_dtype = kv.v;
  const int n_blocks = (n_slots + g_block_size - 1) / g_block_size;
  l.pool = std::make_unique<attic::kv::BlockPool>(shape, n_blocks);
  l.table.resize(n_blocks);
  for (int i = 0; i < n_blocks; ++i) l.table[i] = i;
  std::shuffle(l.table.begin(), l.table.end(), rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(n_slots) * shape.kv_dim()), v(k.size());
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  l.pool->WriteRows(0, l.table.data(), 0, n_slots, k.data(), v.data());
  l.view = attic::kv::LayerView(shape, l.pool->k_data(0), l.pool->v_data(0));
  l.view.block_table = l.table.data();
  l.view.n_slots = n_slots;
  return l;
}

struct Result {
  std::string model, mode, kv;
  int n = 0;
  double ms = 0, gflops = 0, gbps = 0;
};

AttentionShape ShapeOf(const ModelShape& m) {
  return AttentionShape{m.n_heads, m.n_kv_heads, m.head_dim, 1.0f / std::sqrt(static_cast<float>(m.head_dim))};
}

// n_rows rows of queries, [n_rows][n_heads][head_dim], uniform in [-1, 1).
std::vector<float> RandomQueries(const ModelShape& m, int n_rows, std::mt19937& rng) {
  std::vector<float> q(static_cast<size_t>(n_rows) * m.n_heads * m.head_dim);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : q) x = u(rng);
  return q;
}

std::vector<Layer> MakeLayers(const ModelShape& m, int n_layers, int n_slots, KvTypes kv, std::mt19937& rng) {
  std::vector<Layer> layers;
  for (int l = 0; l < n_layers; ++l) layers.push_back(MakeLayer(m, n_slots, kv, rng));
  return layers;
}

Result BenchPrefill(attic::backend::ThreadPool& pool, const ModelShape& m, int n, KvTypes kv, int reps,
                    std::mt19937& rng) {
  Layer layer = MakeLayer(m, n, kv, rng);
  const AttentionShape shape = ShapeOf(m);
  const std::vector<float> q = RandomQueries(m, n, rng);
  std::vector<float> out(q.size());
  std::vector<int32_t> kv_end(n);
  for (int i = 0; i < n; ++i) kv_end[i] = i + 1;
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // first run warms up
    const double t0 = NowSeconds();
    attic::attention::Attend(pool, shape, q.data(), n, kv_end.data(), nullptr, 0, layer.view, out.data());
    if (r > 0) best = std::min(best, NowSeconds() - t0);
  }
  const double flops = 4.0 * m.head_dim * m.n_heads * (static_cast<double>(n) * (n + 1) / 2);
  return Result{m.name, "prefill", KvName(kv), n, best * 1e3, flops / best * 1e-9, 0};
}

// One decode step (one query over n slots) through every layer, timed best-of and
// reported per layer. lists[l][h]: KV head h's ascending index list at layer l; with no
// lists every KV head attends to all n slots. KV GB/s counts the rows attended.
Result TimeDecodeStep(attic::backend::ThreadPool& pool, const ModelShape& m, const std::vector<Layer>& layers, int n,
                      const std::vector<std::vector<std::vector<int32_t>>>& lists, KvTypes kv, int reps,
                      std::mt19937& rng, const std::string& mode) {
  const AttentionShape shape = ShapeOf(m);
  const std::vector<float> q = RandomQueries(m, 1, rng);
  std::vector<float> out(q.size());
  const int32_t kv_end = n;
  std::vector<std::vector<const int32_t*>> ptrs(lists.size());
  std::vector<std::vector<int32_t>> lens(lists.size());
  int64_t rows = lists.empty() ? static_cast<int64_t>(m.n_kv_heads) * n * static_cast<int64_t>(layers.size()) : 0;
  for (size_t l = 0; l < lists.size(); ++l) {
    for (const std::vector<int32_t>& list : lists[l]) {
      ptrs[l].push_back(list.data());
      lens[l].push_back(static_cast<int32_t>(list.size()));
      rows += static_cast<int64_t>(list.size());
    }
  }
  // --evict: before each layer the pool's threads read g_evict_mib MiB of other memory,
  // untimed, as a decode step's weights pass through the caches between two layers'
  // attention; each layer's attention is then timed on its own.
  static std::vector<uint64_t> evict(static_cast<size_t>(g_evict_mib) << 17, 1);
  std::vector<uint64_t> evict_sink(static_cast<size_t>(pool.n_threads()));
  auto evict_caches = [&] {
    const int64_t parts = pool.n_threads(), per = static_cast<int64_t>(evict.size()) / parts;
    pool.ParallelFor(parts, [&](int64_t t, int) {
      uint64_t a = 0;
      for (int64_t i = t * per; i < (t + 1) * per; i += 8) a += evict[static_cast<size_t>(i)];  // a line each
      evict_sink[static_cast<size_t>(t)] += a;
    });
  };
  double best = 1e30;
  for (int r = 0; r < reps * 4 + 1; ++r) {
    double seconds = 0;
    double t0 = NowSeconds();
    for (size_t l = 0; l < layers.size(); ++l) {
      if (!evict.empty()) {
        evict_caches();
        t0 = NowSeconds();
      }
      attic::attention::AttendRequest req{q.data(), 1, &kv_end, nullptr, 0, layers[l].view, out.data()};
      if (!lists.empty()) {
        req.head_indices = ptrs[l].data();
        req.n_head_indices = lens[l].data();
      }
      attic::attention::AttendBatch(pool, shape, &req, 1);
      if (!evict.empty()) seconds += NowSeconds() - t0;
    }
    if (evict.empty()) seconds = NowSeconds() - t0;
    if (r > 0) best = std::min(best, seconds);
  }
  const double per_layer = best / static_cast<double>(layers.size());
  const double rows_per_layer = static_cast<double>(rows) / static_cast<double>(layers.size());
  const double flops = 4.0 * m.head_dim * (m.n_heads / m.n_kv_heads) * rows_per_layer;
  const double bytes = rows_per_layer * KvRowBytes(kv, m.head_dim);
  return Result{m.name, mode, KvName(kv), n, per_layer * 1e3, flops / per_layer * 1e-9, bytes / per_layer * 1e-9};
}

// One decode step over all layers (reported per layer).
Result BenchDecode(attic::backend::ThreadPool& pool, const ModelShape& m, int n, KvTypes kv, int reps,
                   std::mt19937& rng) {
  const std::vector<Layer> layers = MakeLayers(m, m.n_layers, n, kv, rng);
  return TimeDecodeStep(pool, m, layers, n, {}, kv, reps, rng, "decode");
}

// Continuous batching's decode step: `batch` sequences, each one query over its own n
// slots, in one AttendBatch call per layer, cycling through a few layers (enough KV to
// come from DRAM). Reported per layer; KV GB/s counts every sequence's rows.
Result BenchDecodeBatch(attic::backend::ThreadPool& pool, const ModelShape& m, int n, int batch, KvTypes kv, int reps,
                        std::mt19937& rng) {
  const int n_layers = std::min(m.n_layers, 4);
  std::vector<std::vector<Layer>> layers(n_layers);
  for (auto& l : layers)
    for (int b = 0; b < batch; ++b) l.push_back(MakeLayer(m, n, kv, rng));
  const AttentionShape shape = ShapeOf(m);
  const size_t row = static_cast<size_t>(m.n_heads) * m.head_dim;
  const std::vector<float> q = RandomQueries(m, batch, rng);
  std::vector<float> out(q.size());
  const int32_t kv_end = n;
  std::vector<attic::attention::AttendRequest> reqs(batch);
  double best = 1e30;
  for (int r = 0; r < reps * 4 + 1; ++r) {
    const double t0 = NowSeconds();
    for (const auto& l : layers) {
      for (int b = 0; b < batch; ++b)
        reqs[b] = attic::attention::AttendRequest{q.data() + b * row, 1, &kv_end, nullptr, 0, l[b].view, out.data() + b * row};
      attic::attention::AttendBatch(pool, shape, reqs.data(), batch);
    }
    if (r > 0) best = std::min(best, NowSeconds() - t0);
  }
  const double per_layer = best / n_layers;
  const double flops = 4.0 * m.head_dim * m.n_heads * n * batch;
  const double bytes = static_cast<double>(m.n_kv_heads) * n * KvRowBytes(kv, m.head_dim) * batch;
  return Result{m.name, "batch" + std::to_string(batch), KvName(kv), n, per_layer * 1e3,
                flops / per_layer * 1e-9, bytes / per_layer * 1e-9};
}

// A turn's chunk: n_q new queries after `history` stored slots (query i sees history + i + 1
// slots), cycling through n_layers distinct KV layers as a forward step does. `n` in the
// table is history + n_q.
Result BenchChunk(attic::backend::ThreadPool& pool, const ModelShape& m, int history, int n_q, KvTypes kv, int reps,
                  std::mt19937& rng) {
  const int n = history + n_q;
  const std::vector<Layer> layers = MakeLayers(m, m.n_layers, n, kv, rng);
  const AttentionShape shape = ShapeOf(m);
  const std::vector<float> q = RandomQueries(m, n_q, rng);
  std::vector<float> out(q.size());
  std::vector<int32_t> kv_end(n_q);
  for (int i = 0; i < n_q; ++i) kv_end[i] = history + i + 1;
  double best = 1e30;
  for (int r = 0; r < reps * 2 + 1; ++r) {
    const double t0 = NowSeconds();
    for (const Layer& layer : layers)
      attic::attention::Attend(pool, shape, q.data(), n_q, kv_end.data(), nullptr, 0, layer.view, out.data());
    if (r > 0) best = std::min(best, NowSeconds() - t0);
  }
  const double per_layer = best / m.n_layers;
  const double visible = static_cast<double>(n_q) * history + static_cast<double>(n_q) * (n_q + 1) / 2;
  const double flops = 4.0 * m.head_dim * m.n_heads * visible;
  return Result{m.name, "chunk" + std::to_string(n_q), KvName(kv), n, per_layer * 1e3, flops / per_layer * 1e-9, 0};
}

// One decode step over every layer, each KV head attending to its own index list of
// `ratio` x n slots (ratio 1: no lists, full attention); reported per layer.
Result BenchSparse(attic::backend::ThreadPool& pool, const ModelShape& m, int n, double ratio, KvTypes kv, int reps,
                   std::vector<Layer>& layers, std::mt19937& rng) {
  if (layers.empty()) layers = MakeLayers(m, m.n_layers, n, kv, rng);
  const bool full = ratio >= 1;
  char mode[32];
  std::snprintf(mode, sizeof mode, "sparse%.1f", full ? 1.0 : ratio);
  if (full) return TimeDecodeStep(pool, m, layers, n, {}, kv, reps, rng, mode);
  // The lists cut as the pq selector's budget (4 initial, a quarter local, the rest top).
  attic::pq::SparseOptions o;
  o.ratio = ratio;
  const auto [initial, local, top] = attic::pq::SplitBudget(o, n);
  std::vector<std::vector<std::vector<int32_t>>> lists(layers.size(), std::vector<std::vector<int32_t>>(m.n_kv_heads));
  std::vector<int32_t> middle(std::max(0, n - local - initial));
  for (auto& layer_lists : lists) {
    for (std::vector<int32_t>& list : layer_lists) {
      for (int s = 0; s < initial; ++s) list.push_back(s);
      for (size_t i = 0; i < middle.size(); ++i) middle[i] = initial + static_cast<int32_t>(i);
      for (int i = 0; i < top; ++i) std::swap(middle[i], middle[i + rng() % (middle.size() - i)]);
      std::sort(middle.begin(), middle.begin() + top);
      list.insert(list.end(), middle.begin(), middle.begin() + top);
      for (int s = n - local; s < n; ++s) list.push_back(s);
    }
  }
  return TimeDecodeStep(pool, m, layers, n, lists, kv, reps, rng, mode);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 3, history = 2048, sparse_context = 8192, decode_context = 0;
  bool json_only = false;
  std::string only, kv_only;
  attic::bench::FlagParser flags("attention_bench",
                                 "[--threads N] [--reps N] [--block-size N] [--only prefill|decode|batch|chunk|sparse] "
                                 "[--history N]\n         [--sparse-context N] [--decode-context N] [--kv T|K/V] "
                                 "[--evict MiB] [--json-only]");
  flags.Int("--threads", &threads);
  flags.Int("--reps", &reps);
  flags.Int("--block-size", &g_block_size);
  flags.String("--only", &only);
  flags.Int("--history", &history);
  flags.Int("--sparse-context", &sparse_context);
  flags.Int("--decode-context", &decode_context);
  flags.String("--kv", &kv_only);
  flags.Int("--evict", &g_evict_mib);
  flags.Switch("--json-only", &json_only);
  flags.ParseOrExit(argc, argv);
  reps = std::max(1, reps);
  g_block_size = std::max(1, g_block_size);
  g_evict_mib = std::max(0, g_evict_mib);
  history = std::max(1, history);
  sparse_context = std::max(16, sparse_context);
  // Each case's KV types: f32, f16 and q8_0 for both tensors, or --kv's.
  std::vector<KvTypes> kv_types = {
      {DType::kF32, DType::kF32}, {DType::kF16, DType::kF16}, {DType::kQ8_0, DType::kQ8_0}};
  if (!kv_only.empty()) {
    const size_t slash = kv_only.find('/');
    auto kt = attic::ParseDType(kv_only.substr(0, slash));
    auto vt = attic::ParseDType(slash == std::string::npos ? kv_only : kv_only.substr(slash + 1));
    auto ok = [](const attic::StatusOr<DType>& t) {
      return t.ok() && (*t == DType::kF32 || *t == DType::kF16 || *t == DType::kQ8_0 || *t == DType::kQ4_0);
    };
    if (!ok(kt) || !ok(vt)) {
      std::fprintf(stderr, "attention_bench: --kv: '%s' is not f32, f16, q8_0, q4_0 or K/V such as q8_0/q4_0\n",
                   kv_only.c_str());
      return 2;
    }
    kv_types = {{*kt, *vt}};
  }
  attic::backend::ThreadPool pool(threads);
  std::mt19937 rng(1);
  const std::vector<ModelShape>& shapes = attic::bench::BenchModelShapes();
  std::vector<Result> results;
  for (const ModelShape& m : shapes) {
    for (KvTypes kv : kv_types) {
      auto want = [&](const char* mode) { return only.empty() || only == mode; };
      if (want("prefill"))
        for (int n : {512, 2048}) results.push_back(BenchPrefill(pool, m, n, kv, reps, rng));
      if (want("decode"))
        for (int n : decode_context > 0 ? std::vector<int>{decode_context} : std::vector<int>{512, 2048})
          results.push_back(BenchDecode(pool, m, n, kv, reps, rng));
      if (want("batch"))
        for (int batch : {4, 16}) results.push_back(BenchDecodeBatch(pool, m, 2048, batch, kv, reps, rng));
      if (want("chunk"))
        for (int n_q : {8, 24, 64}) results.push_back(BenchChunk(pool, m, history, n_q, kv, reps, rng));
      if (want("sparse")) {
        std::vector<Layer> layers;  // one KV for every ratio
        for (double ratio : {1.0, 0.2, 0.1})
          results.push_back(BenchSparse(pool, m, sparse_context, ratio, kv, reps, layers, rng));
      }
    }
  }
  const char* isa = attic::backend::IsaName(attic::backend::ActiveIsa());
  if (!json_only) {
    std::printf("attention_bench  isa=%s threads=%d block_size=%d evict=%d MiB (best of %d)\n", isa, threads, g_block_size,
                g_evict_mib, reps);
    std::printf("%-14s %-8s %-4s %6s %12s %10s %10s\n", "model", "mode", "kv", "n", "ms/layer", "GFLOP/s", "KV GB/s");
    for (const Result& r : results) {
      std::printf("%-14s %-8s %-4s %6d %12.4f %10.1f %10s\n", r.model.c_str(), r.mode.c_str(), r.kv.c_str(), r.n, r.ms, r.gflops,
                  r.gbps > 0 ? std::to_string(r.gbps).substr(0, 6).c_str() : "-");
    }
  }
  std::printf("{\"bench\":\"attention\",\"isa\":\"%s\",\"threads\":%d,\"block_size\":%d,\"evict_mib\":%d,\"results\":[", isa,
              threads, g_block_size, g_evict_mib);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::printf("%s{\"model\":\"%s\",\"mode\":\"%s\",\"kv\":\"%s\",\"n\":%d,\"ms_per_layer\":%.5f,\"gflops\":%.2f,\"kv_gbps\":%.2f}",
                i ? "," : "", r.model.c_str(), r.mode.c_str(), r.kv.c_str(), r.n, r.ms, r.gflops, r.gbps);
  }
  std::printf("]}\n");
  return 0;
}
