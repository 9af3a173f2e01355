// sparse_bench: sparse decoding (paper 004, PQCache, section 4.3) on this machine,
// in-process through the real forward pass (Transformer steps with the SparseAttention
// layer hooks the scheduler attaches), on a random-weight model of a real shape.
//
//   tpot    time per output token against context length: for each length of --lengths
//           (ascending; one sequence of random tokens is prefilled once, each length
//           continuing the previous one) and each batch size of --batch (copies of that
//           sequence decoding together, as continuous batching runs them), each method
//           of --methods decodes --warmup untimed steps (PQ clusters at its first one)
//           then --steps timed ones. Per (length, batch, method): TPOT (median step
//           time), attention time per step (the attention kernel re-run on each layer's
//           recorded visibility -- the same AttendBatch call, the same KV and index
//           lists -- plus the selector's own time: scoring and top-k), the share of the
//           context attended, and the KV bytes a step reads (attended K and V rows, plus
//           the PQ codes scored); and the first decode step, where PQ clusters: TT2T =
//           the prefill of that length (the chain's prefill so far: the same chunks as a
//           prefill from scratch) + that step, adaptive clustering told the prefill time.
//   tt2t    time to the second token (the paper's TT2T, Fig. 10a): prefill (with the
//           selectors attached, as a server runs it: adaptive clustering times it) then
//           the first decode step, where PQ clusters every layer. Variants: full, PQ with
//           adaptive iterations, PQ with fixed iterations (--iterations).
//   blocks  the block cache's hit rate against its size (Fig. 10d): one sequence
//           (random tokens, or the text of --text) decodes --steps steps with --method;
//           each step's selection of every (layer, KV head), less its initial and local
//           slots (always resident), goes through a BlockCache of each size of --blocks
//           blocks of --block-tokens slots, LRU and LFU (pq/block_cache.h says exactly
//           what is counted). Hit rate = selected slots found cached / selected slots,
//           over every step, layer and KV head.
//   offload the longest context that decodes with a compute buffer of a given share of
//           its KV, with PQ offload (pq/offload.h; bench/sparse_offload.cc says what is
//           measured).
//
// Usage: sparse_bench tpot --model PATH [--lengths 2048,4096,8192,16384,32768] [--batch 1,8]
//          [--methods full,pq-0.2,pq-0.1] [--steps 16] [--warmup 2] [--plot FILE.svg]
//        sparse_bench tt2t --model PATH [--lengths 8192,32768] [--method pq-0.2]
//          [--iterations 10,25]
//        sparse_bench blocks --model PATH [--context 32768] [--text FILE] [--method pq-0.1]
//          [--steps 64] [--blocks 4,8,16,32,64,128] [--block-tokens 128] [--plot FILE.svg]
//        sparse_bench offload --model PATH [--context 65536] [--buffer-share 0.125]
//          [--method pq-0.1] [--cache-blocks N] [--policy lru|lfu] [--steps 16] [--warmup 2]
//          [--replay-blocks 8,16,32,64,128]
//        common: [--threads 2] [--kv-dtype f16|f32|q8_0] [--chunk 1024] [--seed 1] [--json FILE]
// Output: tables on stdout, then one JSON line (also to --json).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attic/engine/engine.h"
#include "attic/pq/block_cache.h"
#include "attic/pq/sparse.h"
#include "bench/common/flags.h"
#include "bench/common/format.h"
#include "bench/common/measure.h"
#include "bench/common/output.h"
#include "bench/common/plot.h"
#include "bench/common/stats.h"
#include "bench/sparse_bench.h"

using namespace attic;
using namespace attic::engine;
using bench::Fmt;

namespace sparse_bench {

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "%s: error: %s\n", kProgram, message.c_str());
  std::exit(1);
}

std::vector<int> ParseIntList(const std::string& s) {
  auto list = bench::ParseIntList(s);
  if (!list.ok()) Die("not a positive integer list: " + s);
  return *list;
}

void AddCommonFlags(bench::FlagParser& flags, Common* c) {
  flags.String("--model", &c->model);
  flags.String("--json", &c->json);
  flags.String("--kv-dtype", &c->kv_dtype);
  flags.Int("--threads", &c->threads);
  flags.Int("--chunk", &c->chunk);
  flags.Custom("--seed", [c](const std::string& v) -> Status {
    ATTIC_ASSIGN_OR_RETURN(int s, bench::ParseInt(v));
    c->seed = static_cast<uint64_t>(s);
    return OkStatus();
  });
}

std::unique_ptr<Engine> LoadEngine(const Common& c, int context, int n_sequences, const PoolBlocks& pool_blocks) {
  EngineOptions eo;
  eo.model_path = c.model;
  eo.n_threads = c.threads;
  eo.context_length = context;
  eo.max_batch_tokens = c.chunk;
  eo.kv_block_size = c.block_size;
  auto dt = ParseDType(c.kv_dtype);
  if (!dt.ok() || (*dt != DType::kF16 && *dt != DType::kF32 && *dt != DType::kQ8_0)) {
    Die("--kv-dtype must be f16, f32 or q8_0");
  }
  eo.kv_dtype = *dt;
  auto probe = Engine::Load([&] {
    EngineOptions p = eo;
    p.kv_cache_bytes = 1 << 20;
    p.prepack_max_bytes = 0;
    return p;
  }());
  if (!probe.ok()) Die(probe.status().ToString());
  kv::KvShape shape = (*probe)->transformer().kv_shape(eo.kv_block_size);
  shape.set_dtype(eo.kv_dtype);
  const int64_t per_seq = (static_cast<int64_t>(context) / shape.block_size + 2) * shape.block_bytes();
  const int n_layers = (*probe)->model().config().n_layers;
  probe->reset();
  eo.kv_cache_bytes = pool_blocks ? pool_blocks(shape, n_layers) * shape.block_bytes() : per_seq * n_sequences;
  auto e = Engine::Load(eo);
  if (!e.ok()) Die(e.status().ToString());
  return std::move(*e);
}

std::vector<int32_t> BenchTokens(Engine& engine, const std::string& text, int n, uint64_t seed) {
  if (text.empty()) return bench::RandomTokens(n, seed, 100, engine.model().config().vocab_size);
  std::ifstream f(text);
  if (!f) Die("cannot read --text " + text);
  std::stringstream ss;
  ss << f.rdbuf();
  auto t = engine.Tokenize(ss.str(), /*add_bos=*/true);
  if (!t.ok()) Die(t.status().ToString());
  if (static_cast<int>(t->size()) < n) Die(Fmt("--text has %zu tokens; %d needed", t->size(), n));
  t->resize(n);
  return std::move(*t);
}

void Prefill(Engine& engine, kv::SequenceKv* seq, const std::vector<int32_t>& tokens, int n, kv::LayerHooks* hooks) {
  Transformer& tf = engine.transformer();
  std::vector<float> logits;
  while (seq->n_slots() < n) {
    const int from = seq->n_slots(), m = std::min(n - from, tf.max_batch_tokens());
    std::vector<BatchEntry> b(1);
    b[0].seq = seq;
    b[0].tokens.assign(tokens.begin() + from, tokens.begin() + from + m);
    b[0].want_logits = from + m == n;
    Status st = tf.Forward(b, &logits, hooks);
    if (!st.ok()) Die("prefill: " + st.ToString());
    if (from == 0 || (from / tf.max_batch_tokens()) % 8 == 0)
      std::fprintf(stderr, "\r  prefill %d / %d", from + m, n);
  }
  std::fprintf(stderr, "\n");
}

}  // namespace sparse_bench

namespace {

using namespace sparse_bench;

// A copy of src's slots [0, n) (tokens, positions and every layer's KV) in `dst` (empty).
void CopySequence(const kv::SequenceKv& src, int n, int kv_dim, int n_layers, kv::SequenceKv* dst) {
  Status st = dst->Append(src.tokens().data(), src.positions().data(), n);
  if (!st.ok()) Die("copy: " + st.ToString());
  const int step = 2048;
  std::vector<float> k(static_cast<size_t>(step) * kv_dim), v(k.size());
  for (int l = 0; l < n_layers; ++l) {
    for (int s = 0; s < n; s += step) {
      const int m = std::min(step, n - s);
      src.ReadKv(l, s, m, k.data(), v.data());
      dst->WriteKv(l, s, m, k.data(), v.data());
    }
  }
}

// Routes each batch entry's hook calls to that sequence's hooks (null: none), and keeps a
// copy of what every entry's decode row attended to at every layer (the KV view and the
// per-KV-head lists), so the attention kernel can be re-run on it alone.
class BatchHooks : public kv::LayerHooks {
 public:
  struct Seen {
    attention::KvLayerView kv;
    std::vector<int32_t> kv_end;
    bool lists = false;
    std::vector<std::vector<int32_t>> head;  // per KV head
  };
  BatchHooks(std::vector<kv::LayerHooks*> per_entry, int n_layers, int n_kv_heads)
      : per_entry_(std::move(per_entry)), n_kv_heads_(n_kv_heads),
        seen_(per_entry_.size(), std::vector<Seen>(n_layers)) {}
  void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kv) override {
    if (kv::LayerHooks* h = per_entry_[rows.entry]) h->OnKv(layer, rows, kv);
  }
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    if (kv::LayerHooks* h = per_entry_[rows.entry]) h->BeforeAttention(layer, rows, vis);
    if (!record_) return;
    Seen& s = seen_[rows.entry][layer];
    s.kv = *vis->kv;
    s.kv_end.assign(vis->kv_end, vis->kv_end + rows.n_rows);
    s.lists = vis->head_indices != nullptr;
    s.head.assign(n_kv_heads_, {});
    if (s.lists) {
      for (int h = 0; h < n_kv_heads_; ++h) s.head[h].assign(vis->head_indices[h], vis->head_indices[h] + vis->n_head_indices[h]);
    }
  }
  void AfterLayer(int layer, const kv::EntryRows& rows, uint8_t* keep) override {
    if (kv::LayerHooks* h = per_entry_[rows.entry]) h->AfterLayer(layer, rows, keep);
  }
  void set_record(bool r) { record_ = r; }
  const std::vector<std::vector<Seen>>& seen() const { return seen_; }

 private:
  std::vector<kv::LayerHooks*> per_entry_;
  int n_kv_heads_;
  std::vector<std::vector<Seen>> seen_;  // [entry][layer]
  bool record_ = false;
};

// Seconds of one decode step's attention kernels (every layer, every entry batched as the
// forward does), re-run on the recorded visibility with random queries: the median of
// `reps` runs.
double AttentionSeconds(Engine& engine, const BatchHooks& hooks, int reps) {
  const auto& c = engine.model().config();
  const attention::AttentionShape shape = AttentionShapeOf(c);
  const auto& seen = hooks.seen();
  const int n_entries = static_cast<int>(seen.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(n_entries) * c.q_dim()), out(q.size());
  for (float& x : q) x = nd(rng);
  std::vector<std::vector<attention::AttendRequest>> per_layer(c.n_layers);
  std::vector<std::vector<std::vector<const int32_t*>>> ptrs(c.n_layers);
  std::vector<std::vector<std::vector<int32_t>>> counts(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    ptrs[l].resize(n_entries);
    counts[l].resize(n_entries);
    for (int e = 0; e < n_entries; ++e) {
      const auto& s = seen[e][l];
      attention::AttendRequest r;
      r.q = q.data() + static_cast<size_t>(e) * c.q_dim();
      r.n_q = 1;
      r.kv_end = s.kv_end.data();
      r.kv = s.kv;
      r.out = out.data() + static_cast<size_t>(e) * c.q_dim();
      if (s.lists) {
        for (const auto& list : s.head) {
          ptrs[l][e].push_back(list.data());
          counts[l][e].push_back(static_cast<int32_t>(list.size()));
        }
        r.head_indices = ptrs[l][e].data();
        r.n_head_indices = counts[l][e].data();
      }
      per_layer[l].push_back(r);
    }
  }
  std::vector<double> t;
  for (int rep = 0; rep < reps; ++rep) {
    const double t0 = bench::NowSeconds();
    for (int l = 0; l < c.n_layers; ++l)
      attention::AttendBatch(engine.threads(), shape, per_layer[l].data(), n_entries);
    t.push_back(bench::NowSeconds() - t0);
  }
  return bench::Median(t);
}

// ---------------------------------------------------------------------------------------
// tpot

struct TpotCell {
  int length = 0, batch = 0;
  std::string method;
  double tpot_s = 0, attention_s = 0, select_s = 0, attended_share = 1, bytes_per_step = 0;
  // The first decode step (PQ clusters there), and TT2T = prefill + that step.
  double first_step_s = 0, prefill_s = 0, cluster_s = 0;
  int iterations = 0;
  std::vector<double> step_s;
};

int RunTpot(int argc, char** argv) {
  Common c;
  std::string lengths_flag = "2048,4096,8192,16384,32768", batch_flag = "1,8", methods_flag = "full,pq-0.2,pq-0.1", plot;
  int steps = 16, warmup = 2;
  bench::FlagParser flags(std::string(kProgram) + " tpot",
                          "--model PATH [--lengths 2048,4096,8192,16384,32768] [--batch 1,8]\n"
                          "         [--methods full,pq-0.2,pq-0.1] [--steps 16] [--warmup 2] [--plot FILE.svg]\n"
                          "         [--threads 2] [--kv-dtype f16|f32|q8_0] [--chunk 1024] [--seed 1] [--json FILE]");
  AddCommonFlags(flags, &c);
  flags.String("--lengths", &lengths_flag);
  flags.String("--batch", &batch_flag);
  flags.String("--methods", &methods_flag);
  flags.Int("--steps", &steps);
  flags.Int("--warmup", &warmup);
  flags.String("--plot", &plot);
  flags.ParseOrExit(argc - 1, argv + 1);
  std::vector<int> lengths = ParseIntList(lengths_flag), batches = ParseIntList(batch_flag);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  std::vector<std::string> method_names = bench::SplitList(methods_flag);
  if (c.model.empty() || lengths.empty() || batches.empty() || method_names.empty() || steps < 1 || warmup < 1)
    flags.UsageError("--model is required; --steps and --warmup >= 1; non-empty lists");
  std::vector<pq::SparseOptions> methods;
  for (const auto& m : method_names) {
    if (m == "full") {
      pq::SparseOptions o;
      o.method = pq::SparseMethod::kFull;
      methods.push_back(o);
      continue;
    }
    auto o = pq::ParseSparseOptions(m);
    if (!o.ok()) flags.UsageError("--methods: " + o.status().message());
    methods.push_back(*o);
  }
  bench::CheckOutput(kProgram, c.json);
  bench::CheckOutput(kProgram, plot);
  const std::string load_start = bench::LoadAverage();
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int context = lengths.back() + warmup + steps + 8;
  auto engine = LoadEngine(c, context, max_batch + 1);
  const auto& cfg = engine->model().config();
  for (const auto& m : methods) {
    Status st = m.Validate(cfg.head_dim);
    if (!st.ok()) Die(st.ToString());
  }
  const std::vector<int32_t> tokens = bench::RandomTokens(context, c.seed, 100, cfg.vocab_size);
  // Bytes of one K (or V) row of one KV head as stored (q8_0: its int8 values and scales).
  const kv::KvShape& kv_shape = engine->kv_pool().shape();
  const double slots = static_cast<double>(kv_shape.n_kv_heads) * kv_shape.block_size;
  const double stored_row_bytes = kv_shape.k_layer_bytes() / slots;
  const double stored_kv_row_bytes = (kv_shape.k_layer_bytes() + kv_shape.v_layer_bytes()) / slots;
  std::printf("# sparse_bench tpot: %s, %d layers, %d/%d heads, head_dim %d, %s KV, %d threads; CPU %s\n\n",
              c.model.c_str(), cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, c.kv_dtype.c_str(), c.threads,
              bench::CpuName().c_str());
  std::printf("%s", bench::TableHeader({"context", "batch", "method", "TPOT ms", "vs full", "attention ms/step",
                                        "attn vs full", "select ms", "attended", "MB read/step", "1st step s",
                                        "TT2T vs full", "clustering s", "iterations"})
                        .c_str());
  std::vector<TpotCell> cells;
  kv::SequenceKv base(&engine->kv_pool());
  double prefill_s = 0;  // the chain's prefill so far: a prefill of L from scratch (same chunks)
  for (int L : lengths) {
    std::fprintf(stderr, "context %d:\n", L);
    const double p0 = bench::NowSeconds();
    Prefill(*engine, &base, tokens, L, nullptr);
    prefill_s += bench::NowSeconds() - p0;
    for (int B : batches) {
      std::vector<std::unique_ptr<kv::SequenceKv>> seqs;
      for (int i = 0; i < B; ++i) {
        seqs.push_back(std::make_unique<kv::SequenceKv>(&engine->kv_pool()));
        CopySequence(base, L, cfg.kv_dim(), cfg.n_layers, seqs.back().get());
      }
      double full_tpot = 0, full_attn = 0, full_tt2t = 0;
      for (const auto& m : methods) {
        std::vector<std::unique_ptr<pq::SparseAttention>> sparse;
        std::vector<kv::LayerHooks*> per_entry(B, nullptr);
        if (m.method != pq::SparseMethod::kFull) {
          for (int i = 0; i < B; ++i) {
            sparse.push_back(pq::MakeSparseAttention(m, AttentionShapeOf(cfg), cfg.n_layers, engine->threads()));
            // The copies' prefill happened outside the hooks: adaptive clustering gets its time.
            sparse.back()->set_prefill_seconds(prefill_s);
            per_entry[i] = sparse.back().get();
          }
        }
        BatchHooks hooks(per_entry, cfg.n_layers, cfg.n_kv_heads);
        kv::LayerHooks* hp = m.method == pq::SparseMethod::kFull ? nullptr : &hooks;
        TpotCell cell;
        cell.length = L, cell.batch = B, cell.method = m.method == pq::SparseMethod::kFull ? "full" : m.ToString();
        std::vector<float> logits;
        auto step = [&](int i) {
          std::vector<BatchEntry> b(B);
          for (int e = 0; e < B; ++e) {
            b[e].seq = seqs[e].get();
            b[e].tokens = {tokens[(L + i + e) % tokens.size()]};
          }
          const double t0 = bench::NowSeconds();
          Status st = engine->transformer().Forward(b, &logits, hp);
          if (!st.ok()) Die("decode: " + st.ToString());
          return bench::NowSeconds() - t0;
        };
        cell.prefill_s = prefill_s;
        for (int i = 0; i < warmup; ++i) {
          const double s = step(i);
          if (i == 0) cell.first_step_s = s;
        }
        for (const auto& sp : sparse) {
          cell.cluster_s += sp->stats().cluster_seconds / B;
          cell.iterations = sp->stats().iterations;
        }
        pq::SparseStats before;
        for (const auto& s : sparse) {
          before.select_seconds += s->stats().select_seconds;
          before.attended_slots += s->stats().attended_slots;
          before.context_slots += s->stats().context_slots;
        }
        for (int i = 0; i < steps; ++i) {
          if (i == steps - 1) hooks.set_record(true);
          cell.step_s.push_back(step(warmup + i));
        }
        hooks.set_record(false);
        cell.tpot_s = bench::Median(cell.step_s);
        pq::SparseStats after;
        for (const auto& s : sparse) {
          after.select_seconds += s->stats().select_seconds;
          after.attended_slots += s->stats().attended_slots;
          after.context_slots += s->stats().context_slots;
        }
        cell.select_s = (after.select_seconds - before.select_seconds) / steps;
        const double n_ctx = L + warmup + steps / 2.0;  // the timed steps' mean context
        const double heads = static_cast<double>(cfg.n_layers) * cfg.n_kv_heads;
        const double row_bytes = stored_kv_row_bytes;  // K and V of one slot, one KV head
        if (m.method == pq::SparseMethod::kFull) {
          cell.attended_share = 1;
          cell.bytes_per_step = B * n_ctx * heads * row_bytes;
        } else {
          const double att = static_cast<double>(after.attended_slots - before.attended_slots) / steps;
          const double ctx = static_cast<double>(after.context_slots - before.context_slots) / steps;
          cell.attended_share = ctx > 0 ? att / ctx : 1;
          cell.bytes_per_step = att * row_bytes;
          if (m.method == pq::SparseMethod::kPq) cell.bytes_per_step += ctx * m.pq.m;  // one code byte per sub-space
          if (m.method == pq::SparseMethod::kOracle) cell.bytes_per_step += ctx * stored_row_bytes;  // every K
        }
        if (m.method == pq::SparseMethod::kFull) {
          // The forward ran without hooks: record the full visibility with an empty router.
          BatchHooks rec(std::vector<kv::LayerHooks*>(B, nullptr), cfg.n_layers, cfg.n_kv_heads);
          rec.set_record(true);
          std::vector<BatchEntry> b(B);
          for (int e = 0; e < B; ++e) {
            b[e].seq = seqs[e].get();
            b[e].tokens = {tokens[e]};
          }
          Status st = engine->transformer().Forward(b, &logits, &rec);
          if (!st.ok()) Die("decode: " + st.ToString());
          cell.attention_s = AttentionSeconds(*engine, rec, 5);
        } else {
          cell.attention_s = AttentionSeconds(*engine, hooks, 5) + cell.select_s;
        }
        const double tt2t = prefill_s + cell.first_step_s;
        if (m.method == pq::SparseMethod::kFull) full_tpot = cell.tpot_s, full_attn = cell.attention_s, full_tt2t = tt2t;
        std::printf("%s", bench::TableRow({std::to_string(L), std::to_string(B), cell.method, Fmt("%.2f", cell.tpot_s * 1e3),
                                           full_tpot > 0 ? Fmt("%.2f", cell.tpot_s / full_tpot) : "-",
                                           Fmt("%.2f", cell.attention_s * 1e3),
                                           full_attn > 0 ? Fmt("%.2f", cell.attention_s / full_attn) : "-",
                                           Fmt("%.2f", cell.select_s * 1e3), Fmt("%.3f", cell.attended_share),
                                           Fmt("%.1f", cell.bytes_per_step / 1e6), Fmt("%.2f", cell.first_step_s),
                                           full_tt2t > 0 ? Fmt("%.3f", tt2t / full_tt2t) : "-",
                                           Fmt("%.2f", cell.cluster_s),
                                           cell.iterations > 0 ? std::to_string(cell.iterations) : "-"})
                              .c_str());
        std::fflush(stdout);
        cells.push_back(cell);
        for (auto& s : seqs) s->Truncate(L);
      }
      for (auto& s : seqs) s->Release();
    }
  }
  nlohmann::json out;
  out["program"] = std::string(kProgram) + " tpot";
  out["model"] = c.model;
  out["cpu"] = bench::CpuName();
  out["threads"] = c.threads;
  out["kv_dtype"] = c.kv_dtype;
  out["steps"] = steps;
  out["warmup"] = warmup;
  out["load_average"] = {load_start, bench::LoadAverage()};
  for (const auto& cell : cells) {
    nlohmann::json j;
    j["context"] = cell.length;
    j["batch"] = cell.batch;
    j["method"] = cell.method;
    j["tpot_s"] = cell.tpot_s;
    j["attention_s"] = cell.attention_s;
    j["select_s"] = cell.select_s;
    j["attended_share"] = cell.attended_share;
    j["bytes_per_step"] = cell.bytes_per_step;
    j["step_s"] = cell.step_s;
    j["first_step_s"] = cell.first_step_s;
    j["prefill_s"] = cell.prefill_s;
    j["tt2t_s"] = cell.prefill_s + cell.first_step_s;
    j["cluster_s"] = cell.cluster_s;
    j["iterations"] = cell.iterations;
    out["cells"].push_back(j);
  }
  if (!plot.empty()) {
    // TPOT against context, a line per (method, batch).
    std::vector<std::string> names;
    std::vector<std::vector<double>> y;
    std::vector<double> x(lengths.begin(), lengths.end());
    for (int B : batches) {
      for (const auto& m : method_names) {
        std::vector<double> row;
        for (int L : lengths) {
          double v = std::nan("");
          for (const auto& cell : cells) {
            if (cell.length == L && cell.batch == B && (cell.method == m || (m != "full" && cell.method.rfind(m, 0) == 0)))
              v = cell.tpot_s * 1e3;
          }
          row.push_back(v);
        }
        names.push_back(Fmt("%s, batch %d", m.c_str(), B));
        y.push_back(row);
      }
    }
    bench::WriteOutput(kProgram, plot,
                       bench::LogLogPlotSvg(names, x, y, Fmt("TPOT vs context (%d threads)", c.threads),
                                            "context tokens (log)", "TPOT (log)", "ms"));
  }
  std::printf("\nCPU %s; load average %s at the start, %s at the end; peak RSS %.0f MiB\n", bench::CpuName().c_str(),
              load_start.c_str(), bench::LoadAverage().c_str(), bench::PeakRssMiB());
  const std::string line = out.dump();
  std::printf("\n%s\n", line.c_str());
  bench::WriteOutput(kProgram, c.json, line + "\n");
  return 0;
}

// ---------------------------------------------------------------------------------------
// tt2t

// Hands every hook call to each of several hooks (the same prefill, seen by every variant).
class TeeHooks : public kv::LayerHooks {
 public:
  explicit TeeHooks(std::vector<kv::LayerHooks*> hooks) : hooks_(std::move(hooks)) {}
  void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kv) override {
    for (kv::LayerHooks* h : hooks_) h->OnKv(layer, rows, kv);
  }
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    for (kv::LayerHooks* h : hooks_) h->BeforeAttention(layer, rows, vis);
  }
  void AfterLayer(int layer, const kv::EntryRows& rows, uint8_t* keep) override {
    for (kv::LayerHooks* h : hooks_) h->AfterLayer(layer, rows, keep);
  }

 private:
  std::vector<kv::LayerHooks*> hooks_;
};

int RunTt2t(int argc, char** argv) {
  Common c;
  std::string lengths_flag = "8192,32768", method_flag = "pq-0.2", iterations_flag = "10,25";
  bench::FlagParser flags(std::string(kProgram) + " tt2t",
                          "--model PATH [--lengths 8192,32768] [--method pq-0.2] [--iterations 10,25]\n"
                          "         [--threads 2] [--kv-dtype f16|f32|q8_0] [--chunk 1024] [--seed 1] [--json FILE]");
  AddCommonFlags(flags, &c);
  flags.String("--lengths", &lengths_flag);
  flags.String("--method", &method_flag);
  flags.String("--iterations", &iterations_flag);
  flags.ParseOrExit(argc - 1, argv + 1);
  std::vector<int> lengths = ParseIntList(lengths_flag), iterations = ParseIntList(iterations_flag);
  auto parsed = pq::ParseSparseOptions(method_flag);
  if (c.model.empty() || lengths.empty()) flags.UsageError("--model is required; --lengths non-empty");
  if (!parsed.ok()) flags.UsageError("--method: " + parsed.status().message());
  if (parsed->method != pq::SparseMethod::kPq) flags.UsageError("--method must be a pq method");
  bench::CheckOutput(kProgram, c.json);
  const std::string load_start = bench::LoadAverage();
  // Variants: adaptive, then each fixed iteration count.
  std::vector<pq::SparseOptions> variants;
  std::vector<std::string> names;
  pq::SparseOptions adaptive = *parsed;
  adaptive.fixed_iterations = false;
  variants.push_back(adaptive);
  names.push_back("adaptive");
  for (int it : iterations) {
    pq::SparseOptions o = *parsed;
    o.fixed_iterations = true;
    o.pq.iterations = it;
    variants.push_back(o);
    names.push_back(Fmt("%d iterations", it));
  }
  const int max_len = *std::max_element(lengths.begin(), lengths.end());
  auto engine = LoadEngine(c, max_len + 8, 2);
  const auto& cfg = engine->model().config();
  for (const auto& v : variants) {
    Status st = v.Validate(cfg.head_dim);
    if (!st.ok()) Die(st.ToString());
  }
  std::printf("# sparse_bench tt2t: %s, %s KV, %d threads; CPU %s\n\n", c.model.c_str(), c.kv_dtype.c_str(), c.threads,
              bench::CpuName().c_str());
  std::printf("%s", bench::TableHeader({"context", "variant", "prefill s", "2nd-token step s", "TT2T s", "vs full",
                                        "clustering s", "iterations"})
                        .c_str());
  nlohmann::json out;
  out["program"] = std::string(kProgram) + " tt2t";
  out["model"] = c.model;
  out["cpu"] = bench::CpuName();
  out["threads"] = c.threads;
  for (int L : lengths) {
    const std::vector<int32_t> tokens = bench::RandomTokens(L + 1, c.seed + L, 100, cfg.vocab_size);
    std::vector<std::unique_ptr<pq::SparseAttention>> sparse;
    std::vector<kv::LayerHooks*> all;
    for (const auto& v : variants) {
      sparse.push_back(pq::MakeSparseAttention(v, AttentionShapeOf(cfg), cfg.n_layers, engine->threads()));
      all.push_back(sparse.back().get());
    }
    TeeHooks tee(all);
    kv::SequenceKv base(&engine->kv_pool());
    std::fprintf(stderr, "context %d:\n", L);
    const double t0 = bench::NowSeconds();
    Prefill(*engine, &base, tokens, L, &tee);
    const double prefill_s = bench::NowSeconds() - t0;
    std::vector<float> logits;
    // The decode step that yields the second token, on a copy per variant (the copy is
    // not timed). Full first.
    auto second = [&](kv::LayerHooks* hooks) {
      kv::SequenceKv copy(&engine->kv_pool());
      CopySequence(base, L, cfg.kv_dim(), cfg.n_layers, &copy);
      std::vector<BatchEntry> b(1);
      b[0].seq = &copy;
      b[0].tokens = {tokens[L]};
      const double s0 = bench::NowSeconds();
      Status st = engine->transformer().Forward(b, &logits, hooks);
      if (!st.ok()) Die("decode: " + st.ToString());
      const double s = bench::NowSeconds() - s0;
      copy.Release();
      return s;
    };
    const double full_step = second(nullptr);
    const double full_tt2t = prefill_s + full_step;
    auto row = [&](const std::string& name, double step, double cluster, int iters) {
      std::printf("%s", bench::TableRow({std::to_string(L), name, Fmt("%.2f", prefill_s), Fmt("%.3f", step),
                                         Fmt("%.2f", prefill_s + step), Fmt("%.3f", (prefill_s + step) / full_tt2t),
                                         Fmt("%.3f", cluster), iters > 0 ? std::to_string(iters) : "-"})
                            .c_str());
      std::fflush(stdout);
      nlohmann::json j;
      j["context"] = L;
      j["variant"] = name;
      j["prefill_s"] = prefill_s;
      j["second_token_step_s"] = step;
      j["tt2t_s"] = prefill_s + step;
      j["tt2t_over_full"] = (prefill_s + step) / full_tt2t;
      j["cluster_s"] = cluster;
      j["iterations"] = iters;
      out["rows"].push_back(j);
    };
    row("full", full_step, 0, 0);
    for (size_t v = 0; v < variants.size(); ++v) {
      const double step = second(sparse[v].get());
      row(names[v], step, sparse[v]->stats().cluster_seconds, sparse[v]->stats().iterations);
    }
    base.Release();
  }
  out["load_average"] = {load_start, bench::LoadAverage()};
  std::printf("\nCPU %s; load average %s at the start, %s at the end\n", bench::CpuName().c_str(), load_start.c_str(),
              bench::LoadAverage().c_str());
  const std::string line = out.dump();
  std::printf("\n%s\n", line.c_str());
  bench::WriteOutput(kProgram, c.json, line + "\n");
  return 0;
}

// ---------------------------------------------------------------------------------------
// blocks

int RunBlocks(int argc, char** argv) {
  Common c;
  std::string method_flag = "pq-0.1", blocks_flag = "4,8,16,32,64,128", text, plot;
  int context = 32768, steps = 64, block_tokens = 128;
  bench::FlagParser flags(std::string(kProgram) + " blocks",
                          "--model PATH [--context 32768] [--text FILE] [--method pq-0.1] [--steps 64]\n"
                          "         [--blocks 4,8,16,32,64,128] [--block-tokens 128] [--plot FILE.svg]\n"
                          "         [--threads 2] [--kv-dtype f16|f32|q8_0] [--chunk 1024] [--seed 1] [--json FILE]");
  AddCommonFlags(flags, &c);
  flags.Int("--context", &context);
  flags.String("--text", &text);
  flags.String("--method", &method_flag);
  flags.Int("--steps", &steps);
  flags.String("--blocks", &blocks_flag);
  flags.Int("--block-tokens", &block_tokens);
  flags.String("--plot", &plot);
  flags.ParseOrExit(argc - 1, argv + 1);
  const std::vector<int> capacities = ParseIntList(blocks_flag);
  auto parsed = pq::ParseSparseOptions(method_flag);
  if (c.model.empty() || context < 16 || steps < 1 || block_tokens < 1)
    flags.UsageError("--model is required; --context >= 16, --steps >= 1, --block-tokens >= 1");
  if (!parsed.ok()) flags.UsageError("--method: " + parsed.status().message());
  if (parsed->method == pq::SparseMethod::kFull) flags.UsageError("--method must select (pq, oracle, h2o, streaming)");
  bench::CheckOutput(kProgram, c.json);
  bench::CheckOutput(kProgram, plot);
  const std::string load_start = bench::LoadAverage();
  auto engine = LoadEngine(c, context + steps + 8, 1);
  const auto& cfg = engine->model().config();
  Status vst = parsed->Validate(cfg.head_dim);
  if (!vst.ok()) Die(vst.ToString());
  const std::vector<int32_t> tokens = BenchTokens(*engine, text, context + steps, c.seed);
  auto sparse = pq::MakeSparseAttention(*parsed, AttentionShapeOf(cfg), cfg.n_layers, engine->threads());
  kv::SequenceKv seq(&engine->kv_pool());
  std::fprintf(stderr, "context %d:\n", context);
  Prefill(*engine, &seq, tokens, context, sparse.get());
  // caches[capacity][policy][layer * n_kv_heads + head]
  const pq::CachePolicy policies[] = {pq::CachePolicy::kLru, pq::CachePolicy::kLfu};
  std::vector<std::vector<std::vector<pq::BlockCache>>> caches(capacities.size());
  for (size_t ci = 0; ci < capacities.size(); ++ci) {
    caches[ci].resize(2);
    for (int p = 0; p < 2; ++p)
      for (int i = 0; i < cfg.n_layers * cfg.n_kv_heads; ++i) caches[ci][p].emplace_back(capacities[ci], policies[p], block_tokens);
  }
  int64_t selected_total = 0;
  std::vector<float> logits;
  std::vector<int32_t> middle;
  for (int i = 0; i < steps; ++i) {
    std::vector<BatchEntry> b(1);
    b[0].seq = &seq;
    b[0].tokens = {tokens[context + i]};
    Status st = engine->transformer().Forward(b, &logits, sparse.get());
    if (!st.ok()) Die("decode: " + st.ToString());
    const int n_slots = seq.n_slots();
    const pq::Budget budget = pq::SplitBudget(*parsed, n_slots);
    for (int l = 0; l < cfg.n_layers; ++l) {
      for (int h = 0; h < cfg.n_kv_heads; ++h) {
        middle.clear();
        for (int32_t s : sparse->last_selection(l, h))
          if (s >= budget.initial && s < n_slots - budget.local) middle.push_back(s);
        selected_total += static_cast<int64_t>(middle.size());
        for (auto& per_capacity : caches)
          for (auto& per_policy : per_capacity)
            per_policy[l * cfg.n_kv_heads + h].Access(middle.data(), static_cast<int>(middle.size()));
      }
    }
    if (i % 8 == 7) std::fprintf(stderr, "\r  step %d / %d", i + 1, steps);
  }
  std::fprintf(stderr, "\n");
  std::printf("# sparse_bench blocks: %s, context %d (%s), %s, %d steps, %d-slot blocks; CPU %s\n\n", c.model.c_str(),
              context, text.empty() ? "random tokens" : text.c_str(), parsed->ToString().c_str(), steps, block_tokens,
              bench::CpuName().c_str());
  std::printf("%s", bench::TableHeader({"blocks", "cached share of context", "LRU hit rate", "LFU hit rate"}).c_str());
  nlohmann::json out;
  out["program"] = std::string(kProgram) + " blocks";
  out["model"] = c.model;
  out["cpu"] = bench::CpuName();
  out["context"] = context;
  out["text"] = text;
  out["method"] = parsed->ToString();
  out["steps"] = steps;
  out["block_tokens"] = block_tokens;
  out["selected_slots_per_head_step"] =
      static_cast<double>(selected_total) / (static_cast<double>(steps) * cfg.n_layers * cfg.n_kv_heads);
  std::vector<std::vector<double>> y(2);
  for (size_t ci = 0; ci < capacities.size(); ++ci) {
    double rate[2];
    nlohmann::json j;
    j["blocks"] = capacities[ci];
    for (int p = 0; p < 2; ++p) {
      int64_t hits = 0, misses = 0, inserted = 0, evicted = 0;
      for (const auto& cache : caches[ci][p]) {
        hits += cache.stats().token_hits;
        misses += cache.stats().token_misses;
        inserted += cache.stats().block_insertions;
        evicted += cache.stats().block_evictions;
      }
      rate[p] = hits + misses > 0 ? static_cast<double>(hits) / (hits + misses) : 0;
      y[p].push_back(std::max(rate[p], 1e-3));
      nlohmann::json jp;
      jp["hit_rate"] = rate[p];
      jp["token_hits"] = hits;
      jp["token_misses"] = misses;
      jp["block_insertions"] = inserted;
      jp["block_evictions"] = evicted;
      j[pq::CachePolicyName(policies[p])] = jp;
    }
    std::printf("%s", bench::TableRow({std::to_string(capacities[ci]),
                                       Fmt("%.3f", std::min(1.0, static_cast<double>(capacities[ci]) * block_tokens / context)),
                                       Fmt("%.3f", rate[0]), Fmt("%.3f", rate[1])})
                          .c_str());
    out["capacities"].push_back(j);
  }
  if (!plot.empty()) {
    std::vector<double> x(capacities.begin(), capacities.end());
    bench::WriteOutput(kProgram, plot,
                       bench::LogLogPlotSvg({"LRU", "LFU"}, x, y,
                                            Fmt("Block cache hit rate (%s, context %d)", parsed->ToString().c_str(), context),
                                            "cache blocks (log)", "hit rate (log)", ""));
  }
  out["load_average"] = {load_start, bench::LoadAverage()};
  std::printf("\nCPU %s; load average %s at the start, %s at the end\n", bench::CpuName().c_str(), load_start.c_str(),
              bench::LoadAverage().c_str());
  const std::string line = out.dump();
  std::printf("\n%s\n", line.c_str());
  bench::WriteOutput(kProgram, c.json, line + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = std::string("usage: ") + kProgram + " tpot|tt2t|blocks|offload --model PATH [flags] (--help per command)\n";
  if (argc < 2) {
    std::fprintf(stderr, "%s", usage.c_str());
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "tpot") return RunTpot(argc, argv);
  if (cmd == "tt2t") return RunTt2t(argc, argv);
  if (cmd == "blocks") return RunBlocks(argc, argv);
  if (cmd == "offload") return sparse_bench::RunOffload(argc, argv);
  if (cmd == "--help" || cmd == "-h") {
    std::printf("%s", usage.c_str());
    return 0;
  }
  std::fprintf(stderr, "%s: error: unknown command '%s'\n%s", kProgram, cmd.c_str(), usage.c_str());
  return 2;
}
