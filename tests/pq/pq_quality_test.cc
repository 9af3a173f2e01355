// PQ's selection quality on real models' KV (stories260K and retriever-1m), against
// references computed here in double: recall@k of the slots PQ keeps against the Oracle
// top-k (exact q . k over the KV attention reads), and the KL divergence of the next-token
// distribution from full attention's, which must be below that of a random selection of
// the same budget (initial, local and top counts alike).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "attic/engine/engine.h"
#include "attic/kv/layer_hooks.h"
#include "attic/pq/sparse.h"
#include "attic/tensor/dtype.h"
#include "stories.h"
#include "test_util.h"

namespace attic::pq {
namespace {

using attic::testing::SharedDir;
using attic::testing::StoryTokens;

constexpr int kPrompt = 300, kDecode = 40;
// Fixed iterations: adaptive clustering sizes k-means by the measured prefill time, which
// would make the codebooks (and recall) depend on the machine's load.
constexpr const char* kMethod = "pq-0.1@min=64,iters=6";

std::unique_ptr<engine::Engine> Load(const std::string& model) {
  engine::EngineOptions o;
  o.model_path = SharedDir() + "/models/" + model;
  o.n_threads = 2;
  auto e = engine::Engine::Load(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

// K of (slot, kv head) as attention reads it, widened to double.
double KAt(const attention::KvLayerView& kv, int n_kv_heads, int hd, int slot, int h, int t) {
  const int64_t off = kv.block_table[slot / kv.block_size] * kv.block_stride +
                      (static_cast<int64_t>(h) * kv.block_size + slot % kv.block_size) * hd + t;
  (void)n_kv_heads;
  return kv.k_f16 != nullptr ? static_cast<double>(F16ToF32(kv.k_f16[off])) : static_cast<double>(kv.k_pool[off]);
}

// Runs the selector and, at each decode step (one row) where it selects, compares its top
// middle slots with the Oracle's: the `top` middle slots (between the initial and local
// windows) of highest exact score, summed over the KV head's query group (the selector's
// default combine), in double. With `randomize`, it then replaces each head's top with as
// many middle slots drawn at random (the same budget, chosen blind).
struct Probe : kv::LayerHooks {
  SparseAttention* sa;
  SparseOptions o;
  attention::AttentionShape shape;
  bool randomize;
  std::mt19937 rng{20250601};
  int64_t hits = 0, kept = 0;     // recall@k: Oracle top slots PQ kept / slots kept
  int64_t chance_num = 0, chance_den = 0;  // a blind pick's expected recall: top / middle
  std::vector<std::vector<int32_t>> lists;
  std::vector<const int32_t*> ptrs;
  std::vector<int32_t> lens;

  Probe(SparseAttention* s, const SparseOptions& opt, const attention::AttentionShape& sh, bool rnd)
      : sa(s), o(opt), shape(sh), randomize(rnd) {}

  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    sa->BeforeAttention(layer, rows, vis);
    if (rows.n_rows != 1 || vis->head_indices == nullptr) return;  // prefill, or a full step
    const int n = vis->n_slots, hd = shape.head_dim, g = shape.n_heads / shape.n_kv_heads;
    const Budget b = SplitBudget(o, n);
    lists.assign(shape.n_kv_heads, {});
    for (int h = 0; h < shape.n_kv_heads; ++h) {
      const std::vector<int32_t>& got = sa->last_selection(layer, h);
      EXPECT_EQ(static_cast<int>(got.size()), b.initial + b.top + b.local);
      std::vector<int32_t> mid(static_cast<size_t>(n - b.local - b.initial));
      std::iota(mid.begin(), mid.end(), b.initial);
      std::vector<double> score(static_cast<size_t>(n));
      for (int32_t s : mid) {
        double c = 0;
        for (int j = 0; j < g; ++j)
          for (int t = 0; t < hd; ++t)
            c += static_cast<double>(vis->q[(h * g + j) * hd + t]) * KAt(*vis->kv, shape.n_kv_heads, hd, s, h, t);
        score[s] = c;
      }
      std::vector<int32_t> oracle = mid;
      std::stable_sort(oracle.begin(), oracle.end(), [&](int32_t a, int32_t c) { return score[a] > score[c]; });
      oracle.resize(static_cast<size_t>(b.top));
      std::sort(oracle.begin(), oracle.end());
      std::vector<int32_t> top(got.begin() + b.initial, got.begin() + b.initial + b.top);
      std::vector<int32_t> both;
      std::set_intersection(top.begin(), top.end(), oracle.begin(), oracle.end(), std::back_inserter(both));
      hits += static_cast<int64_t>(both.size());
      kept += b.top;
      chance_num += b.top;
      chance_den += static_cast<int64_t>(mid.size());
      if (randomize) {
        std::shuffle(mid.begin(), mid.end(), rng);
        mid.resize(static_cast<size_t>(b.top));
        std::sort(mid.begin(), mid.end());
        std::vector<int32_t>& l = lists[h];
        l.assign(got.begin(), got.begin() + b.initial);
        l.insert(l.end(), mid.begin(), mid.end());
        l.insert(l.end(), got.end() - b.local, got.end());
      }
    }
    if (!randomize) return;
    ptrs.clear();
    lens.clear();
    for (const auto& l : lists) ptrs.push_back(l.data()), lens.push_back(static_cast<int32_t>(l.size()));
    vis->head_indices = ptrs.data();
    vis->n_head_indices = lens.data();
  }
  double recall() const { return static_cast<double>(hits) / static_cast<double>(kept); }
  double chance() const { return static_cast<double>(chance_num) / static_cast<double>(chance_den); }
};

using attic::testing::TeacherForcedDecode;

// Mean over the decode steps of KL(p_full || p) of the softmaxed logits, in double.
double MeanKl(const std::vector<float>& full, const std::vector<float>& got, int vocab) {
  double sum = 0;
  const int steps = static_cast<int>(full.size() / vocab);
  for (int i = 0; i < steps; ++i) {
    const float* a = full.data() + static_cast<size_t>(i) * vocab;
    const float* b = got.data() + static_cast<size_t>(i) * vocab;
    const double ma = *std::max_element(a, a + vocab), mb = *std::max_element(b, b + vocab);
    double za = 0, zb = 0;
    for (int v = 0; v < vocab; ++v) za += std::exp(a[v] - ma), zb += std::exp(b[v] - mb);
    double kl = 0;
    for (int v = 0; v < vocab; ++v) {
      const double la = a[v] - ma - std::log(za), lb = b[v] - mb - std::log(zb);
      kl += std::exp(la) * (la - lb);
    }
    sum += kl;
  }
  return sum / steps;
}

// A model and PQ's recall@k measured on it (kMethod, the prompt and decode below), the
// same to every digit on the AVX-512, AVX2 and generic kernels: 0.6554 for stories260K,
// 0.5341 for retriever-1m.
struct Model {
  std::string name;
  double measured_recall;
};
void PrintTo(const Model& m, std::ostream* os) { *os << m.name; }

class PqQuality : public ::testing::TestWithParam<Model> {};

TEST_P(PqQuality, RecallAgainstOracleAndKlBelowARandomSelection) {
  const Model& model = GetParam();
  auto e = Load(model.name);
  ASSERT_NE(e, nullptr);
  const auto tokens = StoryTokens(*e, kPrompt + kDecode);
  const auto& c = e->model().config();
  const attention::AttentionShape shape = engine::AttentionShapeOf(c);
  const SparseOptions o = *ParseSparseOptions(kMethod);
  const auto full = TeacherForcedDecode(*e, tokens, kPrompt, nullptr);

  auto pq = MakeSparseAttention(o, shape, c.n_layers, e->threads());
  Probe probe(pq.get(), o, shape, false);
  const auto with_pq = TeacherForcedDecode(*e, tokens, kPrompt, &probe);
  auto blind = MakeSparseAttention(o, shape, c.n_layers, e->threads());
  Probe random(blind.get(), o, shape, true);
  const auto with_random = TeacherForcedDecode(*e, tokens, kPrompt, &random);
  ASSERT_EQ(pq->stats().sparse_steps, kDecode);
  ASSERT_EQ(blind->stats().sparse_steps, kDecode);
  ASSERT_GT(probe.kept, 0);

  const double recall = probe.recall(), chance = probe.chance();
  const double kl_pq = MeanKl(full, with_pq, c.vocab_size), kl_random = MeanKl(full, with_random, c.vocab_size);
  std::printf("%s %s: recall@k vs Oracle %.4f (%lld of %lld; a blind pick %.4f), mean KL from full: pq %.5f, "
              "random %.5f\n",
              model.name.c_str(), kMethod, recall, static_cast<long long>(probe.hits),
              static_cast<long long>(probe.kept), chance, kl_pq, kl_random);
  // The run is deterministic; what could move recall is other arithmetic flipping near
  // ties of the scores (other kernels, other codebooks): codebooks trained for as many
  // iterations as the prefill time allowed (adaptive, before kMethod fixed them) moved it
  // by 0.010 at most. The bound is the measurement less five times that, 0.05 (0.605 for
  // stories260K, 0.484 for retriever-1m), far above a blind pick's top / middle (0.0647):
  // a selector that scores with the group's first query head only (measured 0.588, 0.419)
  // or ranks lowest first (0) fails.
  const double bound = model.measured_recall - 5 * 0.010;
  EXPECT_GT(recall, bound) << "recall@k " << recall << ", chance " << chance;
  // Measured: stories260K 0.0149 (pq) vs 0.114 (random); retriever-1m 0.101 vs 0.412.
  EXPECT_LT(kl_pq, kl_random);
}

INSTANTIATE_TEST_SUITE_P(Models, PqQuality,
                         ::testing::Values(Model{"stories260K-hf", 0.6554}, Model{"retriever-1m", 0.5341}),
                         [](const auto& info) {
                           std::string s = info.param.name;
                           for (auto& ch : s) if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace attic::pq
