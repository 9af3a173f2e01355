// Sparse decoding (attic/pq/sparse.h): options and budget, each selector against an
// independent naive reference on a synthetic paged KV (hooks driven directly), and
// ratio 1.0 against the hookless forward pass of a real model (stories260K).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>

#include "attic/attention/kv_q8.h"
#include "attic/backend/convert.h"
#include "attic/core/file.h"
#include "attic/engine/engine.h"
#include "attic/pq/sparse.h"
#include "attic/tensor/dtype.h"
#include "pq/sparse_internal.h"
#include "stories.h"
#include "test_util.h"

namespace attic::pq {
namespace {

using attic::testing::SharedDir;

// ---------------------------------------------------------------------------------------
// Options and budget.

TEST(SparseOptions, ParseToStringRoundTrip) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"full", "full"},
      {"pq-0.2", "pq-0.2"},
      {"pq-1.0", "pq-1.0"},
      {"oracle-0.1", "oracle-0.1"},
      {"streaming-2048", "streaming-2048"},
      {"h2o-0.2@local=64,initial=4", "h2o-0.2@local=64"},
      {"pq-0.1@iters=8", "pq-0.1@iters=8"},
      {"pq-0.2@m=4,bits=8,combine=max,min=2048", "pq-0.2@min=2048,combine=max,m=4,bits=8"},
      {"oracle-0.05@initial=0,share=0.1", "oracle-0.05@initial=0,share=0.1"},
      {"pq", "pq-0.2"},
      {"pq-0.1@offload=32", "pq-0.1@offload=32"},
      {"streaming-0.2@cache=lfu,offload=0", "streaming-0.2@offload=0,cache=lfu"},
  };
  for (const auto& [text, canonical] : cases) {
    auto o = ParseSparseOptions(text);
    ASSERT_TRUE(o.ok()) << text << ": " << o.status().ToString();
    EXPECT_EQ(o->ToString(), canonical) << text;
    auto back = ParseSparseOptions(o->ToString());
    ASSERT_TRUE(back.ok()) << canonical;
    EXPECT_EQ(back->ToString(), canonical);
    EXPECT_EQ(back->method, o->method);
    EXPECT_EQ(back->ratio, o->ratio);
    EXPECT_EQ(back->count, o->count);
    EXPECT_EQ(back->n_initial, o->n_initial);
    EXPECT_EQ(back->n_local, o->n_local);
    EXPECT_EQ(back->min_slots, o->min_slots);
    EXPECT_EQ(back->combine, o->combine);
    EXPECT_EQ(back->pq.m, o->pq.m);
    EXPECT_EQ(back->pq.bits, o->pq.bits);
    EXPECT_EQ(back->fixed_iterations, o->fixed_iterations);
    EXPECT_EQ(back->pq.iterations, o->pq.iterations);
    EXPECT_EQ(back->cluster_share, o->cluster_share);
    EXPECT_EQ(back->offload_cache_blocks, o->offload_cache_blocks);
    EXPECT_EQ(back->offload_policy, o->offload_policy);
  }
  auto o = ParseSparseOptions("oracle-512@combine=max,initial=2,local=16,min=100");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->method, SparseMethod::kOracle);
  EXPECT_EQ(o->count, 512);
  EXPECT_EQ(o->combine, GqaCombine::kMax);
  EXPECT_EQ(o->n_initial, 2);
  EXPECT_EQ(o->n_local, 16);
  EXPECT_EQ(o->min_slots, 100);
  EXPECT_FALSE(o->fixed_iterations);
}

TEST(SparseOptions, ParseErrors) {
  for (const char* bad : {"", "bogus-0.2", "pq-1.5", "pq-0.0", "pq-0", "pq--3", "pq-", "pq-0.2@", "pq-0.2@foo=1",
                          "pq-0.2@combine=avg", "pq-0.2@m=x", "pq-0.2@initial=-1", "pq-0.2@local=-2",
                          "pq-0.2@bits=9", "pq-0.2@iters=0", "pq-0.2@share=0", "full-0.2", "pq-0.2@m=2,",
                          "pq-abc", "pq-0.2@local", "pq-0.2@offload=-2", "pq-0.2@cache=mru",
                          "oracle-0.2@offload=8", "h2o-0.2@offload=0"}) {
    auto o = ParseSparseOptions(bad);
    EXPECT_FALSE(o.ok()) << "'" << bad << "' parsed";
    if (!o.ok()) {
      EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

TEST(SparseOptions, Validate) {
  SparseOptions o;
  EXPECT_TRUE(o.Validate(64).ok());
  o.pq.m = 3;
  EXPECT_FALSE(o.Validate(64).ok());  // m must divide head_dim
  o.method = SparseMethod::kOracle;
  EXPECT_TRUE(o.Validate(64).ok());   // ... only for pq
  o.ratio = 0;
  EXPECT_FALSE(o.Validate(64).ok());
  o.ratio = 0.5;
  o.count = -1;
  EXPECT_FALSE(o.Validate(64).ok());
}

TEST(SplitBudget, PartsSumToTheBudget) {
  for (SparseMethod m : {SparseMethod::kPq, SparseMethod::kOracle, SparseMethod::kStreaming, SparseMethod::kH2o}) {
    for (double ratio : {0.01, 0.1, 0.2, 0.5, 1.0}) {
      for (int local : {-1, 0, 7}) {
        SparseOptions o;
        o.method = m;
        o.ratio = ratio;
        o.n_local = local;
        for (int n = 1; n <= 3000; n += (n < 100 ? 1 : 37)) {
          const Budget b = SplitBudget(o, n);
          const int64_t want = std::clamp<int64_t>(std::llround(ratio * n), 1, n);
          EXPECT_EQ(b.initial + b.local + b.top, want) << ratio << " " << n;
          EXPECT_GE(b.initial, 0);
          EXPECT_GE(b.top, 0);
          EXPECT_GE(b.local, 1);  // the decoding token's own slot
          EXPECT_LE(b.initial, o.n_initial);
          if (m == SparseMethod::kStreaming) {
            EXPECT_EQ(b.top, 0);
          }
          if (m != SparseMethod::kStreaming && local == -1 && want >= 8) {
            EXPECT_EQ(b.local, static_cast<int>(std::floor(want / 4.0 + 0.5)));  // a quarter, rounded
          }
          if (m != SparseMethod::kStreaming && local == 7 && want >= 11) {
            EXPECT_EQ(b.local, 7);
          }
        }
      }
    }
  }
  SparseOptions o;
  o.count = 100;
  EXPECT_EQ(SplitBudget(o, 50).initial + SplitBudget(o, 50).local + SplitBudget(o, 50).top, 50);
  const Budget b = SplitBudget(o, 1000);
  EXPECT_EQ(b.initial, 4);
  EXPECT_EQ(b.local, 25);
  EXPECT_EQ(b.top, 71);
  o.ratio = 1.0;
  o.count = 0;
  EXPECT_EQ(SplitBudget(o, 500).top, 500 - 4 - 125);
}

// ---------------------------------------------------------------------------------------
// Selectors on a synthetic paged KV: the hooks are called as the forward pass calls them.

// One layer's K of one sequence, both dense (for the references) and paged with a
// shuffled block table (for the hooks).
struct FakeKv {
  int n_kv_heads, head_dim, block_size = 16, max_slots;
  std::vector<float> dense;  // [slot][kv_head][head_dim]
  std::vector<float> pool;   // blocks
  std::vector<int32_t> table;
  attention::KvLayerView view;

  // The pool's element type: f32 (pool); f16 (pool16) or q8_0 (pool8) hold K, and the
  // dense copy holds its widened / dequantized values.
  DType dtype = DType::kF32;
  std::vector<uint16_t> pool16;
  // q8_0 (attention.h, KvLayerView): a block is its rows' int8 values
  // [n_kv_heads][block_size][head_dim], then their f16 scales, one per group of values.
  std::vector<int8_t> pool8;
  int64_t q8_block_bytes = 0;

  FakeKv(int h, int d, int max, DType type = DType::kF32) : n_kv_heads(h), head_dim(d), max_slots(max), dtype(type) {
    const int n_blocks = (max + block_size - 1) / block_size;
    pool.assign(static_cast<size_t>(n_blocks) * h * block_size * d, 0.f);
    if (dtype == DType::kF16) pool16.assign(pool.size(), 0);
    const int64_t values = static_cast<int64_t>(h) * block_size * d;
    q8_block_bytes = values + values / attention::KvQ8Group(d) * 2;
    if (dtype == DType::kQ8_0) pool8.assign(static_cast<size_t>(n_blocks * q8_block_bytes), 0);
    table.resize(static_cast<size_t>(n_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::mt19937 rng(7);
    std::shuffle(table.begin(), table.end(), rng);
    view.k_pool = dtype == DType::kF32 ? pool.data() : nullptr;
    view.v_pool = view.k_pool;
    view.k_f16 = dtype == DType::kF16 ? pool16.data() : nullptr;
    view.v_f16 = view.k_f16;
    view.k_q8 = dtype == DType::kQ8_0 ? pool8.data() : nullptr;
    view.v_q8 = view.k_q8;
    view.q8_scales = values;
    view.block_size = block_size;
    view.block_stride = dtype == DType::kQ8_0 ? q8_block_bytes : values;
    view.block_table = table.data();
  }
  void Append(const float* k) {  // [n_kv_heads, head_dim]
    const int s = view.n_slots++;
    const size_t first = dense.size();
    dense.insert(dense.end(), k, k + n_kv_heads * head_dim);
    for (int h = 0; h < n_kv_heads; ++h) {
      const int64_t row = static_cast<int64_t>(h) * block_size + s % block_size;  // in its block
      const int64_t off = table[s / block_size] * static_cast<int64_t>(n_kv_heads) * block_size * head_dim +
                          row * head_dim;
      std::copy(k + h * head_dim, k + (h + 1) * head_dim, pool.data() + off);
      float* widened = dense.data() + first + h * head_dim;
      if (dtype == DType::kF16) {
        backend::ConvertF32ToF16(k + h * head_dim, pool16.data() + off, head_dim);
        for (int t = 0; t < head_dim; ++t) widened[t] = F16ToF32(pool16[off + t]);
      } else if (dtype == DType::kQ8_0) {
        const int64_t block = table[s / block_size] * q8_block_bytes;
        const int groups = head_dim / attention::KvQ8Group(head_dim);
        int8_t* q = pool8.data() + block + row * head_dim;
        auto* scales = reinterpret_cast<uint16_t*>(pool8.data() + block + view.q8_scales + row * groups * 2);
        attention::QuantizeKvRowQ8(k + h * head_dim, head_dim, q, scales);
        attention::DequantizeKvRowQ8(q, scales, head_dim, widened);
      }
    }
  }
  const float* K(int s, int h) const { return dense.data() + (static_cast<size_t>(s) * n_kv_heads + h) * head_dim; }
};

struct Synthetic {
  attention::AttentionShape shape;
  std::mt19937 rng{42};
  std::normal_distribution<float> normal{0.f, 1.f};
  FakeKv kv;
  Synthetic(int n_heads, int n_kv, int hd, int max, DType dtype = DType::kF32) : kv(n_kv, hd, max, dtype) {
    shape.n_heads = n_heads;
    shape.n_kv_heads = n_kv;
    shape.head_dim = hd;
    shape.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  }
  std::vector<float> Random(size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  }
  // Appends n slots of random K as one step of n rows and calls the hook (layer 0).
  // Returns the step's queries [n, n_heads, head_dim].
  std::vector<float> Step(kv::LayerHooks* hooks, int n, int layer = 0) {
    std::vector<int32_t> rows(n), slots(n), pos(n), kv_end(n);
    for (int i = 0; i < n; ++i) {
      auto k = Random(static_cast<size_t>(shape.n_kv_heads) * shape.head_dim);
      rows[i] = i;
      slots[i] = pos[i] = kv.view.n_slots;
      kv.Append(k.data());
      kv_end[i] = slots[i] + 1;
    }
    auto q = Random(static_cast<size_t>(n) * shape.n_heads * shape.head_dim);
    kv::EntryRows er{0, n, rows.data(), slots.data(), pos.data()};
    kv::Visibility vis;
    vis.kv_end = kv_end.data();
    vis.n_slots = kv.view.n_slots;
    vis.q = q.data();
    vis.kv = &kv.view;
    hooks->BeforeAttention(layer, er, &vis);
    last_vis_heads = vis.head_indices != nullptr;
    return q;
  }
  bool last_vis_heads = false;
};

std::vector<int32_t> Range(int a, int b) {
  std::vector<int32_t> v;
  for (int s = a; s < b; ++s) v.push_back(s);
  return v;
}

// The selectors' top-k (radix selection) against a full sort, on distinct scores, heavy
// ties (PQ-like: few distinct values), negatives, and every k.
TEST(TopK, EqualsASortedReference) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 6; ++trial) {
    const int n = trial < 3 ? 3000 : 40000;
    std::vector<float> scores(static_cast<size_t>(n));
    std::normal_distribution<float> normal(0.f, trial % 2 ? 1e-3f : 10.f);
    std::uniform_int_distribution<int> few(0, 40);
    for (float& x : scores) x = trial % 3 == 2 ? static_cast<float>(few(rng)) - 20.f : normal(rng);
    if (trial == 4) scores[17] = NAN, scores[99] = INFINITY, scores[100] = -INFINITY;
    for (int64_t k : {int64_t{1}, int64_t{7}, int64_t{n / 10}, int64_t{n / 2}, int64_t{n - 1}, int64_t{n}}) {
      std::vector<int32_t> idx = Range(0, n);
      auto rank = [&](int32_t i) { return std::isnan(scores[i]) ? -INFINITY : scores[i]; };  // NaN lowest
      std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return rank(a) > rank(b); });
      idx.resize(static_cast<size_t>(k));
      std::sort(idx.begin(), idx.end());
      for (int32_t& i : idx) i += 5;
      std::vector<int32_t> got = {-1};
      internal::TopKAppend(scores.data(), n, k, 5, &got);
      ASSERT_EQ(got.front(), -1);
      got.erase(got.begin());
      EXPECT_EQ(got, idx) << "trial " << trial << " k " << k;
    }
  }
}

TEST(Streaming, SelectsExactlyInitialAndLocal) {
  Synthetic syn(4, 2, 16, 600);
  backend::ThreadPool pool(2);
  auto o = ParseSparseOptions("streaming-0.1@min=100");
  ASSERT_TRUE(o.ok());
  auto sa = MakeSparseAttention(*o, syn.shape, 1, pool);
  syn.Step(sa.get(), 90);
  EXPECT_TRUE(sa->last_selection(0, 0).empty());
  for (int step = 0; step < 300; ++step) {
    syn.Step(sa.get(), 1);
    const int n = syn.kv.view.n_slots;
    if (n < 100) {
      EXPECT_FALSE(syn.last_vis_heads);
      continue;
    }
    ASSERT_TRUE(syn.last_vis_heads);
    const int total = static_cast<int>(std::lround(0.1 * n));
    std::vector<int32_t> want = Range(0, 4);
    for (int32_t s : Range(n - (total - 4), n)) want.push_back(s);
    for (int h = 0; h < 2; ++h) EXPECT_EQ(sa->last_selection(0, h), want) << n;
  }
  EXPECT_EQ(sa->stats().sparse_steps, 291);  // n_slots 100 .. 390
  EXPECT_EQ(sa->stats().full_steps, 9);      // n_slots 91 .. 99
}

// Oracle: the top middle slots by q . k (sum or max over the group) in double precision.
void CheckOracle(GqaCombine combine, DType dtype = DType::kF32) {
  Synthetic syn(6, 2, 32, 3000, dtype);
  backend::ThreadPool pool(2);
  SparseOptions o;
  o.method = SparseMethod::kOracle;
  o.ratio = 0.1;
  o.min_slots = 64;
  o.combine = combine;
  auto sa = MakeSparseAttention(o, syn.shape, 1, pool);
  syn.Step(sa.get(), 2500);
  const int g = 3, hd = 32;
  int near_ties = 0;
  for (int step = 0; step < 20; ++step) {
    auto q = syn.Step(sa.get(), 1);
    const int n = syn.kv.view.n_slots;
    const Budget b = SplitBudget(o, n);
    for (int h = 0; h < 2; ++h) {
      std::vector<double> score(static_cast<size_t>(n));
      double max_abs = 0;  // the largest sum of |q_t k_t| over a slot's group
      for (int s = b.initial; s < n - b.local; ++s) {
        double c = combine == GqaCombine::kSum ? 0 : -INFINITY, a = 0;
        for (int j = 0; j < g; ++j) {
          double d = 0;
          for (int t = 0; t < hd; ++t) {
            const double x = static_cast<double>(q[(h * g + j) * hd + t]) * syn.kv.K(s, h)[t];
            d += x, a += std::fabs(x);
          }
          c = combine == GqaCombine::kSum ? c + d : std::max(c, d);
        }
        score[s] = c;
        max_abs = std::max(max_abs, a);
      }
      std::vector<int32_t> mid = Range(b.initial, n - b.local);
      std::stable_sort(mid.begin(), mid.end(), [&](int32_t a, int32_t c) { return score[a] > score[c]; });
      mid.resize(static_cast<size_t>(b.top));
      std::sort(mid.begin(), mid.end());
      std::vector<int32_t> want = Range(0, b.initial);
      want.insert(want.end(), mid.begin(), mid.end());
      for (int32_t s : Range(n - b.local, n)) want.push_back(s);
      const auto& got = sa->last_selection(0, h);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + b.initial), Range(0, b.initial));
      EXPECT_EQ(std::vector<int32_t>(got.end() - b.local, got.end()), Range(n - b.local, n));
      // The selector ranks float scores, each within delta = gamma(hd + g) * max_abs of the
      // exact one (hd products summed, then g - 1 sums or a max over the group; gamma(n) =
      // n u / (1 - n u), u = 2^-24). The i-th largest exact score of the slots it kept is
      // then within 2 delta of the i-th largest exact score of all (order statistics move
      // at most as far as the values): a wrong pick beyond a float-precision tie fails.
      const double u = std::ldexp(1.0, -24), delta = (hd + g) * u / (1 - (hd + g) * u) * max_abs;
      std::vector<double> kept, best;
      for (size_t i = static_cast<size_t>(b.initial); i < got.size() - static_cast<size_t>(b.local); ++i)
        kept.push_back(score[got[i]]);
      for (int i = 0; i < b.top; ++i) best.push_back(score[mid[i]]);
      std::sort(kept.rbegin(), kept.rend());
      std::sort(best.rbegin(), best.rend());
      ASSERT_EQ(kept.size(), best.size());
      for (size_t i = 0; i < kept.size(); ++i) EXPECT_NEAR(kept[i], best[i], 2 * delta) << "step " << step << " head " << h;
      if (got != want) ++near_ties;
    }
  }
  std::printf("[ oracle   ] %d of 40 selections differ from the float64 ranking at a near tie\n", near_ties);
  EXPECT_EQ(sa->stats().sparse_steps, 20);
}

TEST(Oracle, EqualsBruteForceSum) { CheckOracle(GqaCombine::kSum); }
TEST(Oracle, EqualsBruteForceMax) { CheckOracle(GqaCombine::kMax); }
TEST(Oracle, EqualsBruteForceF16Kv) { CheckOracle(GqaCombine::kSum, DType::kF16); }  // K widened from f16
TEST(Oracle, EqualsBruteForceQ8Kv) { CheckOracle(GqaCombine::kSum, DType::kQ8_0); }  // K dequantized from q8_0

// A naive H2O on the dense K, written from the contract: accumulate softmax
// probabilities of every query (prefill rows over [0, own slot]); at a decode step keep
// initial + local + the `top` heaviest middle slots never dropped, drop the other middle
// slots for good, then add the decode query's probabilities over what it attended.
TEST(H2o, EqualsNaiveSimulation) {
  const int n_heads = 4, n_kv = 2, hd = 16, g = 2;
  Synthetic syn(n_heads, n_kv, hd, 1200);
  backend::ThreadPool pool(2);
  auto o = ParseSparseOptions("h2o-0.2@min=150,local=8");
  ASSERT_TRUE(o.ok());
  auto sa = MakeSparseAttention(*o, syn.shape, 1, pool);
  std::vector<std::vector<double>> acc(n_kv);
  std::vector<std::set<int>> dropped(n_kv);
  auto add = [&](const float* q_row, int h, const std::vector<int32_t>& slots) {
    for (int j = 0; j < g; ++j) {
      std::vector<double> l;
      double mx = -INFINITY;
      for (int s : slots) {
        double d = 0;
        for (int t = 0; t < hd; ++t) d += static_cast<double>(q_row[(h * g + j) * hd + t]) * syn.kv.K(s, h)[t];
        l.push_back(d / std::sqrt(static_cast<double>(hd)));
        mx = std::max(mx, l.back());
      }
      double z = 0;
      for (double& x : l) z += (x = std::exp(x - mx));
      for (size_t i = 0; i < slots.size(); ++i) acc[h][slots[i]] += l[i] / z;
    }
  };
  auto prefill = [&](int n) {
    const int first = syn.kv.view.n_slots;
    auto q = syn.Step(sa.get(), n);
    for (int h = 0; h < n_kv; ++h) {
      acc[h].resize(syn.kv.view.n_slots, 0.0);
      for (int i = 0; i < n; ++i) add(q.data() + static_cast<size_t>(i) * n_heads * hd, h, Range(0, first + i + 1));
    }
  };
  prefill(100);
  prefill(40);  // two chunks
  for (int step = 0; step < 200; ++step) {
    auto q = syn.Step(sa.get(), 1);
    const int n = syn.kv.view.n_slots;
    for (int h = 0; h < n_kv; ++h) {
      acc[h].resize(n, 0.0);
      if (n < 150) {
        add(q.data(), h, Range(0, n));
        continue;
      }
      const Budget b = SplitBudget(*o, n);
      std::vector<int32_t> alive;
      for (int s = b.initial; s < n - b.local; ++s)
        if (!dropped[h].count(s)) alive.push_back(s);
      std::stable_sort(alive.begin(), alive.end(), [&](int32_t a, int32_t c) { return acc[h][a] > acc[h][c]; });
      for (size_t i = static_cast<size_t>(b.top); i < alive.size(); ++i) dropped[h].insert(alive[i]);
      if (alive.size() > static_cast<size_t>(b.top)) alive.resize(static_cast<size_t>(b.top));
      std::sort(alive.begin(), alive.end());
      std::vector<int32_t> want = Range(0, b.initial);
      want.insert(want.end(), alive.begin(), alive.end());
      for (int32_t s : Range(n - b.local, n)) want.push_back(s);
      ASSERT_EQ(sa->last_selection(0, h), want) << "step " << step << " head " << h;
      add(q.data(), h, want);
    }
  }
  EXPECT_EQ(sa->stats().sparse_steps, 191);  // n_slots 150 .. 340
  // Dropped slots never come back.
  EXPECT_GT(dropped[0].size(), 0u);
}

// pq: every coded slot's code is its nearest centroid (brute force, double), slots are
// coded exactly up to the local window, and the selection is the top of the scores the
// codebook's centroids give (computed here from centroid(), in double).
void CheckPq(GqaCombine combine, DType dtype = DType::kF32) {
  const int n_heads = 4, n_kv = 2, hd = 16, g = 2;
  Synthetic syn(n_heads, n_kv, hd, 1000, dtype);
  backend::ThreadPool pool(2);
  auto o = ParseSparseOptions(std::string("pq-0.2@min=100,m=4,bits=4,iters=3") +
                              (combine == GqaCombine::kMax ? ",combine=max" : ""));
  ASSERT_TRUE(o.ok());
  auto sa = MakeSparseAttention(*o, syn.shape, 1, pool);
  syn.Step(sa.get(), 400);
  EXPECT_EQ(sa->codebook(0, 0), nullptr);
  int64_t near_ties = 0, checked = 0;
  for (int step = 0; step < 60; ++step) {
    auto q = syn.Step(sa.get(), 1);
    const int n = syn.kv.view.n_slots;
    const Budget b = SplitBudget(*o, n);
    for (int h = 0; h < n_kv; ++h) {
      const PqCodebook* book = sa->codebook(0, h);
      const std::vector<uint8_t>* codes = sa->codes(0, h);
      ASSERT_NE(book, nullptr);
      ASSERT_NE(codes, nullptr);
      ASSERT_EQ(book->m(), 4);
      ASSERT_EQ(book->n_centroids(), 16);
      const int sd = book->sub_dim();
      ASSERT_EQ(static_cast<int>(codes->size()), (n - b.local) * 4) << "coded up to the local window";
      // Codes: nearest centroid. At the first step every coded slot, later the new ones.
      for (int slot = step == 0 ? 0 : n - b.local - 1; slot < n - b.local; ++slot) {
        for (int s = 0; s < 4; ++s) {
          double best = INFINITY;
          int best_c = -1;
          std::vector<double> d(16);
          for (int c = 0; c < 16; ++c) {
            d[c] = 0;
            for (int t = 0; t < sd; ++t) {
              const double x = static_cast<double>(syn.kv.K(slot, h)[s * sd + t]) - book->centroid(s, c)[t];
              d[c] += x * x;
            }
            if (d[c] < best) best = d[c], best_c = c;
          }
          const int got = (*codes)[static_cast<size_t>(slot) * 4 + s];
          ++checked;
          if (got != best_c) {
            ++near_ties;
            // Encode chose `got` by f32 distances, each within gamma(sd + 2) of itself (a
            // sum of non-negative terms, each carrying the rounding of x - c twice, of its
            // square once, of at most sd - 1 sums); one more u covers the double sums here:
            // gamma(n) = n u / (1 - n u), u = 2^-24.
            const double u = std::ldexp(1.0, -24), gamma = (sd + 3) * u / (1 - (sd + 3) * u);
            EXPECT_LE(d[got] - best, gamma * (d[got] + best)) << "slot " << slot << " sub-space " << s;
          }
        }
      }
      // Selection: the top middle slots by the PQ scores.
      std::vector<double> score(static_cast<size_t>(n));
      double max_abs = 0;  // the largest sum of |q_t c_t| over a slot's group
      for (int slot = b.initial; slot < n - b.local; ++slot) {
        double c = combine == GqaCombine::kSum ? 0 : -INFINITY, a = 0;
        for (int j = 0; j < g; ++j) {
          double d = 0;
          for (int s = 0; s < 4; ++s) {
            const float* cen = book->centroid(s, (*codes)[static_cast<size_t>(slot) * 4 + s]);
            for (int t = 0; t < sd; ++t) {
              const double x = static_cast<double>(q[(h * g + j) * hd + s * sd + t]) * cen[t];
              d += x, a += std::fabs(x);
            }
          }
          c = combine == GqaCombine::kSum ? c + d : std::max(c, d);
        }
        score[slot] = c;
        max_abs = std::max(max_abs, a);
      }
      std::vector<int32_t> mid = Range(b.initial, n - b.local);
      std::stable_sort(mid.begin(), mid.end(), [&](int32_t a, int32_t c) { return score[a] > score[c]; });
      // PQ scores tie often (slots sharing every code): compare the kept scores as a multiset
      const auto& got = sa->last_selection(0, h);
      ASSERT_EQ(static_cast<int>(got.size()), b.initial + b.top + b.local);
      std::vector<double> want_scores, got_scores;
      for (int i = 0; i < b.top; ++i) want_scores.push_back(score[mid[i]]);
      for (int i = b.initial; i < b.initial + b.top; ++i) got_scores.push_back(score[got[i]]);
      std::sort(want_scores.begin(), want_scores.end());
      std::sort(got_scores.begin(), got_scores.end());
      // The selector's float scores are q . centroid tables (sd-term dots, g queries added
      // into one table for sum) summed over 4 sub-spaces: each within delta = gamma(sd + g +
      // 4) * max_abs of the exact score (gamma(n) = n u / (1 - n u), u = 2^-24), so the
      // sorted kept scores are within 2 delta of the best ones (order statistics move at
      // most as far as the values).
      const double u = std::ldexp(1.0, -24), delta = (sd + g + 4) * u / (1 - (sd + g + 4) * u) * max_abs;
      for (int i = 0; i < b.top; ++i) EXPECT_NEAR(got_scores[i], want_scores[i], 2 * delta) << "step " << step;
      EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + b.initial), Range(0, b.initial));
      EXPECT_EQ(std::vector<int32_t>(got.end() - b.local, got.end()), Range(n - b.local, n));
    }
  }
  // Each code that differs from the float64 nearest centroid was checked to be a near tie.
  std::printf("[ pq codes ] %lld of %lld codes differ from the float64 nearest centroid at a near tie\n",
              static_cast<long long>(near_ties), static_cast<long long>(checked));
  EXPECT_EQ(sa->stats().clustered_keys, 2 * 400);  // slots [0, n_slots - 1) at the first step
  EXPECT_EQ(sa->stats().iterations, 3);
  EXPECT_GT(sa->stats().encoded_keys, 0);
  EXPECT_GT(sa->stats().index_bytes, 0);
}

TEST(Pq, CodesAreNearestCentroidsAndSelectionIsTopPqScoreSum) { CheckPq(GqaCombine::kSum); }
TEST(Pq, CodesAreNearestCentroidsAndSelectionIsTopPqScoreMax) { CheckPq(GqaCombine::kMax); }
TEST(Pq, CodesAreNearestCentroidsF16Kv) { CheckPq(GqaCombine::kSum, DType::kF16); }
TEST(Pq, CodesAreNearestCentroidsQ8Kv) { CheckPq(GqaCombine::kSum, DType::kQ8_0); }

// Without a multi-row step through the hooks (KV from a store) there is no prefill time
// to share: adaptive clustering uses the documented fixed count (6).
TEST(Pq, NoPrefillUsesTheFixedDefault) {
  Synthetic syn(4, 2, 16, 300);
  backend::ThreadPool pool(2);
  auto o = ParseSparseOptions("pq-0.2@min=100");
  ASSERT_TRUE(o.ok());
  auto sa = MakeSparseAttention(*o, syn.shape, 1, pool);
  for (int i = 0; i < 120; ++i) syn.Step(sa.get(), 1);
  EXPECT_EQ(sa->stats().iterations, 6);
  EXPECT_EQ(sa->stats().sparse_steps, 21);
}

// A prefill time given with set_prefill_seconds (KV prefilled elsewhere) makes clustering
// adaptive: the first layer clustered calibrates with its 2 iterations instead of the
// fixed 6.
TEST(Pq, GivenPrefillTimeMakesClusteringAdaptive) {
  Synthetic syn(4, 2, 16, 300);
  backend::ThreadPool pool(2);
  auto o = ParseSparseOptions("pq-0.2@min=100");
  ASSERT_TRUE(o.ok());
  auto sa = MakeSparseAttention(*o, syn.shape, 1, pool);
  sa->set_prefill_seconds(10.0);
  for (int i = 0; i < 120; ++i) syn.Step(sa.get(), 1);
  EXPECT_EQ(sa->stats().iterations, 2);
  EXPECT_EQ(sa->stats().sparse_steps, 21);
}

// Drives two selectors with the same steps: `b` sees each step first, on its own copy of
// the visibility (its selection is read back through last_selection).
struct Tee : kv::LayerHooks {
  kv::LayerHooks *a, *b;
  Tee(kv::LayerHooks* x, kv::LayerHooks* y) : a(x), b(y) {}
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    kv::Visibility copy = *vis;
    b->BeforeAttention(layer, rows, &copy);
    a->BeforeAttention(layer, rows, vis);
  }
};

// An index exported after decoding, serialized and imported by a new selector over the
// same keys: the new selector clusters nothing, codes the slots the index leaves out by
// nearest centroid exactly as the first selector does, and selects exactly what it
// selects at every later step (same codebooks, same codes).
TEST(Pq, AnImportedIndexDecodesAsTheSelectorThatBuiltIt) {
  const int n_kv = 2;
  Synthetic syn(4, n_kv, 16, 1000);
  backend::ThreadPool pool(2);
  auto o = ParseSparseOptions("pq-0.2@min=100,m=4,bits=4,iters=3");
  ASSERT_TRUE(o.ok());
  auto first = MakeSparseAttention(*o, syn.shape, 2, pool);
  EXPECT_FALSE(first->ExportIndex().has_value());  // nothing built before a sparse step
  syn.Step(first.get(), 400);
  for (int i = 0; i < 20; ++i) syn.Step(first.get(), 1);
  std::optional<PqIndex> exported = first->ExportIndex();
  ASSERT_TRUE(exported.has_value());
  ASSERT_TRUE(exported->layers[0].built);
  EXPECT_FALSE(exported->layers[1].built);  // the hooks only ever saw layer 0
  const int n_coded = exported->layers[0].n_coded;
  EXPECT_EQ(n_coded, static_cast<int>(first->codes(0, 0)->size()) / 4);
  auto blob = DeserializePqIndex(SerializePqIndex(*exported));
  ASSERT_TRUE(blob.ok());
  // A later sequence reuses the first 300 slots as they were: the index is cut to them.
  ASSERT_GT(n_coded, 300);
  blob->Truncate(300);

  auto second = MakeSparseAttention(*o, syn.shape, 2, pool);
  auto other = *ParseSparseOptions("pq-0.2@min=100,m=2,bits=4");
  EXPECT_EQ(MakeSparseAttention(other, syn.shape, 2, pool)->ImportIndex(*blob).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSparseAttention(*ParseSparseOptions("oracle-0.2"), syn.shape, 2, pool)->ImportIndex(*blob).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(second->ImportIndex(std::move(*blob)).ok());
  Tee both(first.get(), second.get());
  for (int step = 0; step < 40; ++step) {
    syn.Step(&both, 1);
    for (int h = 0; h < n_kv; ++h) {
      SCOPED_TRACE(step);
      ASSERT_NE(second->codes(0, h), nullptr);
      EXPECT_EQ(*second->codes(0, h), *first->codes(0, h));
      EXPECT_EQ(second->last_selection(0, h), first->last_selection(0, h));
      EXPECT_EQ(second->codebook(0, h)->centroids(), first->codebook(0, h)->centroids());
    }
  }
  EXPECT_EQ(second->stats().clustered_keys, 0);
  EXPECT_EQ(second->stats().cluster_seconds, 0.0);
  EXPECT_EQ(second->stats().imported_layers, 1);
  EXPECT_EQ(second->stats().imported_keys, 300 * n_kv);
  EXPECT_EQ(second->stats().sparse_steps, 40);
  EXPECT_GT(second->stats().encoded_keys, 0);  // slots 300.. coded by nearest centroid
  // Importing after the first step is refused.
  EXPECT_EQ(second->ImportIndex(*first->ExportIndex()).code(), StatusCode::kFailedPrecondition);
}

// What the pq selector's top should be at a step: PqCodebook::TopKByCodes counting the
// middle slots' code tuples itself (no kept counts), from the selector's own codebook and
// codes and the step's queries' tables (the group's added, or one per query head).
std::vector<int32_t> TopCountingEachStep(const SparseAttention& sa, const SparseOptions& o, const float* q, int n,
                                         int h, int g, int hd) {
  const Budget b = SplitBudget(o, n);
  const PqCodebook* book = sa.codebook(0, h);
  const std::vector<uint8_t>& codes = *sa.codes(0, h);
  const int m = book->m(), n_coded = static_cast<int>(codes.size()) / m;
  const int first = b.initial, n_mid = std::min(n - b.local, n_coded) - first;
  const bool sum = o.combine == GqaCombine::kSum;
  std::vector<std::vector<float>> tables(sum ? 1 : g, std::vector<float>(static_cast<size_t>(m) * book->n_centroids()));
  for (int j = 0; j < g; ++j) book->AddQueryTable(q + (h * g + j) * hd, 1.f, tables[sum ? 0 : j].data());
  std::vector<const float*> ptrs;
  for (const auto& t : tables) ptrs.push_back(t.data());
  std::vector<int32_t> top;
  book->TopKByCodes(ptrs.data(), static_cast<int>(ptrs.size()), codes.data() + static_cast<int64_t>(first) * m, n_mid,
                    b.top, first, &top);
  return top;
}

// The selector keeps each layer's code-tuple counts as it codes slots (m = 2, 6 bits:
// 4,096 tuples) and hands the middle slots' counts to TopKByCodes: the same slots as
// counting every step. Also through an imported index decoded with a larger budget, whose
// local window then holds coded slots (their counts are taken out).
TEST(Pq, KeptTupleCountsSelectAsCountingEveryStep) {
  const int n_heads = 4, n_kv = 2, hd = 16, g = 2;
  for (const char* method : {"pq-0.2@min=100,iters=2", "pq-0.1@min=100,iters=2,combine=max"}) {
    SCOPED_TRACE(method);
    Synthetic syn(n_heads, n_kv, hd, 3000);
    backend::ThreadPool pool(2);
    const SparseOptions o = *ParseSparseOptions(method);
    auto sa = MakeSparseAttention(o, syn.shape, 1, pool);
    syn.Step(sa.get(), 2000);  // enough middle slots for the tuple path (4,096 tuples <= 4n)
    for (int step = 0; step < 12; ++step) {
      const std::vector<float> q = syn.Step(sa.get(), 1);
      const int n = syn.kv.view.n_slots;
      const Budget b = SplitBudget(o, n);
      for (int h = 0; h < n_kv; ++h) {
        const auto& got = sa->last_selection(0, h);
        ASSERT_EQ(static_cast<int>(got.size()), b.initial + b.top + b.local);
        EXPECT_EQ(std::vector<int32_t>(got.begin() + b.initial, got.begin() + b.initial + b.top),
                  TopCountingEachStep(*sa, o, q.data(), n, h, g, hd))
            << "step " << step << " head " << h;
      }
    }
    // A next turn imports the index and decodes with twice the budget: a larger local
    // window, so the index's last coded slots are inside it.
    SparseOptions wider = o;
    wider.ratio = 2 * o.ratio;
    auto second = MakeSparseAttention(wider, syn.shape, 1, pool);
    ASSERT_TRUE(second->ImportIndex(*sa->ExportIndex()).ok());
    for (int step = 0; step < 6; ++step) {
      const std::vector<float> q = syn.Step(second.get(), 1);
      const int n = syn.kv.view.n_slots;
      const Budget b = SplitBudget(wider, n);
      ASSERT_GT(static_cast<int>(second->codes(0, 0)->size()) / 2, n - b.local) << "coded slots in the window";
      for (int h = 0; h < n_kv; ++h) {
        const auto& got = second->last_selection(0, h);
        EXPECT_EQ(std::vector<int32_t>(got.begin() + b.initial, got.begin() + b.initial + b.top),
                  TopCountingEachStep(*second, wider, q.data(), n, h, g, hd))
            << "imported, step " << step << " head " << h;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// A real model: with a budget of every slot each selector's decode equals full attention.

using attic::testing::LoadStories;
using attic::testing::StoryTokens;

using attic::testing::TeacherForcedDecode;

class FullBudget : public ::testing::TestWithParam<std::string> {};

TEST_P(FullBudget, EqualsFullAttention) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  const auto tokens = StoryTokens(*e, 340);
  const auto want = TeacherForcedDecode(*e, tokens, 300, nullptr);
  auto o = ParseSparseOptions(GetParam());
  ASSERT_TRUE(o.ok());
  const auto& c = e->model().config();
  const attention::AttentionShape shape = engine::AttentionShapeOf(c);
  auto sa = MakeSparseAttention(*o, shape, c.n_layers, e->threads());
  const auto got = TeacherForcedDecode(*e, tokens, 300, sa.get());
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(want.size(), 40u * c.vocab_size);
  double max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) max_diff = std::max(max_diff, std::abs(double(got[i]) - want[i]));
  // Every slot selected is attention over the same slots in the same order: the same
  // arithmetic as no selection, so the same bits.
  EXPECT_EQ(got, want) << GetParam() << ": max |diff| " << max_diff;
  if (o->method != SparseMethod::kFull) {
    EXPECT_EQ(sa->stats().sparse_steps, 40);
    EXPECT_EQ(sa->stats().attended_slots, sa->stats().context_slots);
    EXPECT_EQ(sa->last_selection(c.n_layers - 1, 0).size(), 340u);
  }
  if (o->method == SparseMethod::kPq) {  // trained on the prompt's 300 keys, adaptive iterations
    EXPECT_EQ(sa->stats().clustered_keys, int64_t{300} * c.n_kv_heads * c.n_layers);
    EXPECT_GE(sa->stats().iterations, 1);
    EXPECT_LE(sa->stats().iterations, 25);
    EXPECT_GT(sa->stats().cluster_seconds, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Selectors, FullBudget,
                         ::testing::Values("full", "pq-1.0@min=64", "pq-1.0@min=64,combine=max",
                                           "oracle-1.0@min=64", "oracle-1.0@min=64,combine=max",
                                           "streaming-1.0@min=64", "h2o-1.0@min=64"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& ch : s) if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

// Below the budget the selectors do change the output (the hooks are not inert).
TEST(Sparse, SmallBudgetChangesTheOutput) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  const auto tokens = StoryTokens(*e, 340);
  const auto want = TeacherForcedDecode(*e, tokens, 300, nullptr);
  const auto& c = e->model().config();
  const attention::AttentionShape shape = engine::AttentionShapeOf(c);
  for (const char* name : {"streaming-0.1@min=64", "oracle-0.1@min=64", "h2o-0.1@min=64", "pq-0.1@min=64"}) {
    auto sa = MakeSparseAttention(*ParseSparseOptions(name), shape, c.n_layers, e->threads());
    const auto got = TeacherForcedDecode(*e, tokens, 300, sa.get());
    double max_diff = 0;
    for (size_t i = 0; i < want.size(); ++i) max_diff = std::max(max_diff, std::abs(double(got[i]) - want[i]));
    EXPECT_GT(max_diff, 1e-3) << name;
    EXPECT_LT(sa->stats().attended_slots, sa->stats().context_slots / 5) << name;
  }
}

}  // namespace
}  // namespace attic::pq
