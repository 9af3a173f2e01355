// Offloading a sparse sequence's KV below the compute buffer (attic/pq/offload.h), on a
// real model (stories260K) with small blocks so that a 480-token sequence has 30 of
// them: the offloaded sequence must decode exactly as the same selector with every
// block resident (the reference: the same slots, so the same attention), while most of
// its blocks live in the tier.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "attic/engine/engine.h"
#include "attic/attention/kv_q8.h"
#include "attic/pq/offload.h"
#include "attic/store/memory_tier.h"
#include "engine/tiny_llama.h"
#include "store/store_test_util.h"
#include "stories.h"
#include "test_util.h"

namespace attic::pq {
namespace {

using attic::testing::StoryTokens;
using attic::testing::TempDir;
using attic::testing::TinyModel;
using attic::testing::TinySpec;

constexpr int kBlock = 16;

// stories260K with 16-slot blocks, the 480 tokens every test decodes (a 400-token prompt,
// then 80 steps), and the hooks the tests build over them.
struct Stories {
  explicit Stories(DType kv_dtype) {
    engine::EngineOptions o;
    o.kv_block_size = kBlock;
    o.kv_dtype = kv_dtype;
    e = attic::testing::LoadStories(o);
    if (e == nullptr) return;
    tokens = StoryTokens(*e, 480);
    rope = std::make_unique<attention::RopeTable>(e->model().config());
  }
  const model::ModelConfig& cfg() const { return e->model().config(); }
  std::unique_ptr<SparseAttention> Selector(const SparseOptions& o) const {
    return MakeSparseAttention(o, engine::AttentionShapeOf(cfg()), cfg().n_layers, e->threads());
  }
  StatusOr<std::unique_ptr<OffloadedSparseAttention>> Offloaded(const SparseOptions& o, const OffloadOptions& oo,
                                                                kv::SequenceKv* seq, store::Tier* tier) const {
    return MakeOffloadedSparseAttention(Selector(o), oo, seq, *rope, tier, cfg().n_layers, e->threads());
  }

  std::unique_ptr<engine::Engine> e;
  std::vector<int32_t> tokens;
  std::unique_ptr<attention::RopeTable> rope;
};

struct DecodeRun {
  std::vector<float> logits;  // the decode steps'
  int resident_blocks = 0;    // at the end
};

// Prefills `prompt` tokens of `tokens` into `seq` in chunks of 64, then teacher-forced
// decodes the rest one token per step; returns the decode steps' logits.
std::vector<float> Feed(engine::Transformer& tf, kv::SequenceKv* seq, const std::vector<int32_t>& tokens,
                        size_t prompt, kv::LayerHooks* hooks) {
  std::vector<float> logits, out;
  for (size_t pos = 0; pos < tokens.size();) {
    const size_t end = pos < prompt ? std::min(prompt, pos + 64) : pos + 1;
    std::vector<engine::BatchEntry> batch(1);
    batch[0].seq = seq;
    batch[0].tokens.assign(tokens.begin() + pos, tokens.begin() + end);
    const Status st = tf.Forward(batch, &logits, hooks);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (end > prompt) out.insert(out.end(), logits.begin(), logits.end());
    pos = end;
  }
  return out;
}

// Feed with the hooks `make` builds for a fresh sequence of `pool` (null: no hooks).
template <class Make>
DecodeRun Decode(engine::Transformer& tf, kv::BlockPool& pool, const std::vector<int32_t>& tokens, size_t prompt,
                 Make make) {
  kv::SequenceKv seq(&pool);
  std::unique_ptr<kv::LayerHooks> hooks = make(&seq);
  DecodeRun run;
  run.logits = Feed(tf, &seq, tokens, prompt, hooks.get());
  run.resident_blocks = seq.n_resident_blocks();
  return run;
}
template <class Make>
DecodeRun Decode(engine::Engine& e, const std::vector<int32_t>& tokens, size_t prompt, Make make) {
  return Decode(e.transformer(), e.kv_pool(), tokens, prompt, make);
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::abs(double(a[i]) - b[i]));
  return d;
}

struct Case {
  const char* method;
  DType kv_dtype;
  CachePolicy policy;
  int cache_blocks;
  int max_resident;  // blocks resident at the end: first + local window + one before + the one written
};

class OffloadTest : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadTest, DecodesAsTheSameSelectorWithEveryBlockResident) {
  const Case c = GetParam();
  const Stories st(c.kv_dtype);
  ASSERT_NE(st.e, nullptr);
  engine::Engine* e = st.e.get();
  auto o = ParseSparseOptions(c.method);  // fixed iterations: both runs train the same codebooks
  ASSERT_TRUE(o.ok());
  const DecodeRun want = Decode(*e, st.tokens, 400, [&](kv::SequenceKv*) -> std::unique_ptr<kv::LayerHooks> {
    return st.Selector(*o);
  });
  ASSERT_EQ(want.resident_blocks, 30);

  store::DramTier tier(uint64_t{1} << 30);
  const int free_before = e->kv_pool().n_free();
  {
    const DecodeRun got = Decode(*e, st.tokens, 400, [&](kv::SequenceKv* seq) -> std::unique_ptr<kv::LayerHooks> {
      OffloadOptions oo;
      oo.cache_blocks = c.cache_blocks;
      oo.policy = c.policy;
      auto made = st.Offloaded(*o, oo, seq, &tier);
      EXPECT_TRUE(made.ok()) << made.status().ToString();
      return std::move(*made);
    });
    // The hooks are gone with the sequence; what they reported before is checked below
    // through `got`, and the tier and the pool must be back to empty.
    EXPECT_EQ(got.logits, want.logits) << c.method << ": max |diff| " << MaxDiff(got.logits, want.logits);
    EXPECT_LE(got.resident_blocks, c.max_resident) << c.method;
    EXPECT_GE(got.resident_blocks, 2);
  }
  EXPECT_EQ(tier.bytes(), 0u);  // erased with the hooks
  EXPECT_EQ(e->kv_pool().n_free(), free_before);
}

TEST(Offload, StatsCountWhatMovedAndTheCacheHelps) {
  const Stories st(DType::kF32);
  ASSERT_NE(st.e, nullptr);
  store::DramTier tier(uint64_t{1} << 30);
  auto o = ParseSparseOptions("pq-0.2@min=64,iters=4");
  ASSERT_TRUE(o.ok());
  for (int cache_blocks : {0, 8}) {
    kv::SequenceKv seq(&st.e->kv_pool());
    OffloadOptions oo;
    oo.cache_blocks = cache_blocks;
    auto off = st.Offloaded(*o, oo, &seq, &tier);
    ASSERT_TRUE(off.ok());
    Feed(st.e->transformer(), &seq, st.tokens, 400, off->get());
    const OffloadStats& s = (*off)->offload_stats();
    const int64_t block_bytes = seq.pool()->shape().block_bytes();
    EXPECT_GE(s.offloaded_blocks, 25) << cache_blocks;
    EXPECT_EQ(s.backing_bytes, 30 * block_bytes) << "every block complete, f32 K and V as in the f32 pool";
    EXPECT_EQ(s.backing_errors, 0);
    EXPECT_GT(s.full_stagings, 0);
    EXPECT_GT(s.fetched_bytes, 0);
    EXPECT_GT(s.resident_reads, 0);
    EXPECT_GT(s.cache_hits + s.cache_misses, 0);
    if (cache_blocks == 0) {
      EXPECT_EQ(s.cache_hits, 0);
    } else {
      EXPECT_GT(s.cache_hits, 0);
    }
    EXPECT_LT(s.peak_buffer_bytes, 30 * block_bytes);
    EXPECT_GT(s.buffer_bytes, 0);
  }
}

TEST(Offload, TierFailuresAreCountedNeverFatal) {
  const Stories st(DType::kF32);
  ASSERT_NE(st.e, nullptr);
  engine::Engine* e = st.e.get();
  auto o = ParseSparseOptions("pq-0.2@min=64,iters=4");
  ASSERT_TRUE(o.ok());
  const DecodeRun want = Decode(*e, st.tokens, 400, [&](kv::SequenceKv*) -> std::unique_ptr<kv::LayerHooks> {
    return st.Selector(*o);
  });
  // A tier too small for the sequence: the blocks it refuses stay resident, and the
  // decode is still exact.
  store::MemoryTierOptions small;
  small.capacity = 8 * e->kv_pool().shape().block_bytes();
  store::MemoryTier tiny(small);
  OffloadOptions oo;
  oo.cache_blocks = 2;  // the pool holds one 512-token sequence: most of it stays resident here
  const DecodeRun full = Decode(*e, st.tokens, 400, [&](kv::SequenceKv* seq) -> std::unique_ptr<kv::LayerHooks> {
    return std::move(*st.Offloaded(*o, oo, seq, &tiny));
  });
  EXPECT_EQ(full.logits, want.logits) << "max |diff| " << MaxDiff(full.logits, want.logits);
  EXPECT_GT(full.resident_blocks, 20);
  // Reads failing (a tier timing out): counted, logged, the step goes on without those rows.
  store::MemoryTier flaky(store::MemoryTierOptions{"flaky", uint64_t{1} << 30, {}, {}});
  flaky.FailNextReads(50, UnavailableError("injected"));
  kv::SequenceKv seq(&e->kv_pool());
  auto off = st.Offloaded(*o, oo, &seq, &flaky);
  ASSERT_TRUE(off.ok());
  for (float x : Feed(e->transformer(), &seq, st.tokens, 400, off->get())) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ((*off)->offload_stats().backing_errors, 50);
}

TEST(Offload, RefusesWhatItCannotServe) {
  const Stories st(DType::kF32);
  ASSERT_NE(st.e, nullptr);
  engine::Engine* e = st.e.get();
  store::DramTier tier(uint64_t{1} << 30);
  kv::SequenceKv seq(&e->kv_pool());
  for (const char* method : {"oracle-0.2", "h2o-0.2", "full"}) {
    auto off = st.Offloaded(*ParseSparseOptions(method), {}, &seq, &tier);
    EXPECT_EQ(off.status().code(), StatusCode::kInvalidArgument) << method;
  }
  OffloadOptions huge;
  huge.cache_blocks = e->kv_pool().n_free() + 1;
  const int free_before = e->kv_pool().n_free();
  auto off = st.Offloaded(*ParseSparseOptions("pq-0.2"), huge, &seq, &tier);
  EXPECT_EQ(off.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(e->kv_pool().n_free(), free_before);
}

// A q8_0 compute buffer at head_dim 64 (stories260K's is 8, one scale a row): each row
// has two 32-value groups, so two scales to carry through staging, the cache and fetches.
// The same with V in q4_0 (half a byte per value), and with both in q4_0 (K's rows then
// dequantized from 4 bits by the selectors too). A random-weight model of that shape; the
// same exact-match rule as above.
TEST(Offload, Q8AndQ4RowsOfTwoGroupsDecodeAsResident) {
  TempDir dir;
  TinySpec spec;
  spec.hidden = 128, spec.inter = 192, spec.layers = 2, spec.heads = 4, spec.kv_heads = 2, spec.head_dim = 64;
  TinyModel tm;
  attic::testing::MakeTinyModel(spec, dir, &tm);
  ASSERT_FALSE(HasFatalFailure());
  backend::ThreadPool threads(2);
  engine::Transformer tf(*tm.model, threads, 64);
  for (auto [k_dtype, v_dtype] : {std::pair{DType::kQ8_0, DType::kQ8_0}, std::pair{DType::kQ8_0, DType::kQ4_0},
                                  std::pair{DType::kQ4_0, DType::kQ4_0}}) {
    SCOPED_TRACE(std::string("K ") + DTypeName(k_dtype) + ", V " + DTypeName(v_dtype));
    kv::KvShape shape = tf.kv_shape(kBlock);
    shape.k_dtype = k_dtype;
    shape.v_dtype = v_dtype;
    ASSERT_EQ(shape.head_dim / shape.q8_group(), 2);
    kv::BlockPool pool(shape, 40);
    std::mt19937 rng(7);
    std::vector<int32_t> tokens(240);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % spec.vocab);
    const attention::RopeTable rope(tm.model->config());
    for (const char* method : {"pq-0.2@min=64,iters=4", "streaming-0.2@min=64"}) {
      auto o = ParseSparseOptions(method);
      ASSERT_TRUE(o.ok());
      auto selector = [&] {
        return MakeSparseAttention(*o, engine::AttentionShapeOf(tm.model->config()), spec.layers, threads);
      };
      const DecodeRun want = Decode(tf, pool, tokens, 200, [&](kv::SequenceKv*) -> std::unique_ptr<kv::LayerHooks> {
        return selector();
      });
      ASSERT_EQ(want.resident_blocks, 15);
      store::DramTier tier(uint64_t{1} << 30);
      const DecodeRun got = Decode(tf, pool, tokens, 200, [&](kv::SequenceKv* seq) -> std::unique_ptr<kv::LayerHooks> {
        OffloadOptions oo;
        oo.cache_blocks = 3;
        auto made = MakeOffloadedSparseAttention(selector(), oo, seq, rope, &tier, spec.layers, threads);
        EXPECT_TRUE(made.ok()) << made.status().ToString();
        return std::move(*made);
      });
      EXPECT_EQ(got.logits, want.logits) << method << ": max |diff| " << MaxDiff(got.logits, want.logits);
      EXPECT_LT(got.resident_blocks, 10) << method;
      EXPECT_EQ(tier.bytes(), 0u);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Tiers of a store type (OffloadOptions::tier_dtype): an offloaded row re-enters from the
// type's rows, so each of its values is within the type's step of what the forward
// computed. The bounds below are derived from each type's arithmetic (store/entry.h's
// rows; attention/kv_q8.h's and kv_q4.h's groups; kivi4's per-channel groups, here one
// per block), not from the code under test.

// |x - read back| of value i of a kv_dim row `x` stored as row type `t` (f32, f16, q8_0,
// q4_0; `group` values per scale).
double RowValueBound(store::KvDtype t, const float* x, int i, int group) {
  const double tiny = std::ldexp(1.0, -25);  // below f16's normal range
  if (t == store::KvDtype::kF32) return 0;
  if (t == store::KvDtype::kF16) return std::fabs(x[i]) * std::ldexp(1.0, -11) + tiny;
  double amax = 0;
  for (int j = i / group * group; j < (i / group + 1) * group; ++j) amax = std::max(amax, std::fabs(double(x[j])));
  if (t == store::KvDtype::kQ8_0) {
    // d = f16(amax / 127) (one f16 rounding: a relative 2^-11); rounding x / d to the
    // nearest code is within d / 2 (the f32 quotient's own rounding adds |x| 2^-23); a
    // d rounded down may clamp the largest value at 127: at most amax 2^-10.
    const double d = amax / 127 * (1 + std::ldexp(1.0, -11)) + tiny;
    return d / 2 + amax * (std::ldexp(1.0, -10) + std::ldexp(1.0, -23)) + tiny;
  }
  // q4_0: d = max / -8 (the signed largest value); codes 0..15 around 8, so the value of
  // the other sign at amax clamps one step short (|d|); the scale read back is f16(d)
  // (2^-11 relative over at most 8 steps), the f32 code arithmetic 2^-19 steps.
  return amax / 8 * (1 + 8 * std::ldexp(1.0, -11) + std::ldexp(1.0, -19)) + tiny;
}

// Wraps an offloaded selector over an f32 compute buffer: records every row's pre-RoPE K,
// rotated K and V as the forward computed them (OnKv), and after each BeforeAttention that
// staged a view checks the view's rows of released blocks against them -- every slot of a
// whole-layer staging (slot numbering), and every selected slot of a sparse step (head h's
// i-th selected slot at row i).
class TierRowChecker final : public kv::LayerHooks {
 public:
  TierRowChecker(std::unique_ptr<OffloadedSparseAttention> off, const kv::SequenceKv* seq, store::KvDtype tier,
                 int n_layers)
      : off_(std::move(off)), seq_(seq), tier_(tier), shape_(seq->pool()->shape()), x_(n_layers), k_(n_layers),
        v_(n_layers) {}

  void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kv) override {
    const int kvd = shape_.kv_dim();
    for (auto [rows_of, from] : {std::pair{&x_, kv.k_pre_rope}, std::pair{&k_, kv.k}, std::pair{&v_, kv.v}}) {
      std::vector<float>& all = (*rows_of)[layer];
      all.resize(std::max<size_t>(all.size(), static_cast<size_t>(rows.slots[rows.n_rows - 1] + 1) * kvd));
      for (int r = 0; r < rows.n_rows; ++r)
        std::copy(from + static_cast<int64_t>(r) * kvd, from + static_cast<int64_t>(r + 1) * kvd,
                  all.begin() + static_cast<int64_t>(rows.slots[r]) * kvd);
    }
    off_->OnKv(layer, rows, kv);
  }

  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    const OffloadStats before = off_->offload_stats();
    off_->BeforeAttention(layer, rows, vis);
    if (before.offloaded_blocks == 0) return;  // nothing released: no view staged
    ASSERT_NE(vis->view, nullptr);
    const bool whole = off_->offload_stats().full_stagings > before.full_stagings;
    for (int h = 0; h < shape_.n_kv_heads; ++h) {
      if (whole) {
        for (int s = 0; s < vis->n_slots; ++s)
          if (!seq_->resident(s / shape_.block_size)) Check(layer, h, s, *vis->view, s, &whole_rows_);
        continue;
      }
      const std::vector<int32_t>& sel = off_->last_selection(layer, h);
      ASSERT_EQ(vis->n_head_indices[h], static_cast<int32_t>(sel.size()));  // no read failed
      for (size_t i = 0; i < sel.size(); ++i)
        if (!seq_->resident(sel[i] / shape_.block_size))
          Check(layer, h, sel[i], *vis->view, static_cast<int>(i), &selected_rows_);
    }
  }

  void AfterLayer(int layer, const kv::EntryRows& rows, uint8_t* keep) override {
    off_->AfterLayer(layer, rows, keep);
  }

  const OffloadedSparseAttention& offloaded() const { return *off_; }
  int64_t whole_rows() const { return whole_rows_; }
  int64_t selected_rows() const { return selected_rows_; }
  double max_k_error() const { return max_k_error_; }
  double max_v_error() const { return max_v_error_; }

 private:
  // Slot s of KV head h, at row `row` of the staged view, against what the forward
  // computed for it.
  void Check(int layer, int h, int s, const attention::KvLayerView& view, int row, int64_t* checked) {
    const int hd = shape_.head_dim, kvd = shape_.kv_dim(), bs = shape_.block_size;
    const int group = store::KvDtypeQuantized(tier_) ? attention::KvQ8Group(hd) : 0;
    ASSERT_NE(view.k_pool, nullptr);  // an f32 compute buffer
    const int64_t at = view.block_table[row / bs] * view.block_stride + static_cast<int64_t>(h) * bs * hd +
                       static_cast<int64_t>(row % bs) * hd;
    const float* got_k = view.k_pool + at;
    const float* got_v = view.v_pool + (at - view.block_table[row / bs] * view.block_stride) +
                         view.block_table[row / bs] * view.v_block_stride;
    const float* x = x_[layer].data() + static_cast<int64_t>(s) * kvd;
    const float* want_k = k_[layer].data() + static_cast<int64_t>(s) * kvd + h * hd;
    const float* want_v = v_[layer].data() + static_cast<int64_t>(s) * kvd + h * hd;
    // K: rotation mixes the head's values in pairs, so an error e in each of them is at
    // most sqrt(2) max|e| after it; the two rotations of the f32 rows round apart by a
    // few units of 2^-24 of the head's values.
    double e_max = 0, x_max = 0;
    for (int c = h * hd; c < (h + 1) * hd; ++c) {
      double e;
      if (store::KvDtypeGroupedK(tier_)) {
        double lo = x[c], hi = x[c];
        const float* block = x_[layer].data() + static_cast<int64_t>(s / bs) * bs * kvd;
        for (int r = 0; r < bs; ++r) {
          lo = std::min(lo, double(block[r * kvd + c]));
          hi = std::max(hi, double(block[r * kvd + c]));
        }
        e = store::testing::Kivi4KBound(lo, hi);
      } else {
        e = RowValueBound(store::KvTensorDtype(tier_, false), x, c, group);
      }
      e_max = std::max(e_max, e);
      x_max = std::max(x_max, std::fabs(double(x[c])));
    }
    const double k_bound = std::sqrt(2.0) * e_max + (x_max + e_max) * std::ldexp(1.0, -20);
    for (int i = 0; i < hd; ++i) {
      const double err = std::fabs(double(got_k[i]) - want_k[i]);
      max_k_error_ = std::max(max_k_error_, err);
      ASSERT_LE(err, k_bound) << "layer " << layer << " head " << h << " slot " << s << " K[" << i << "]";
    }
    for (int i = 0; i < hd; ++i) {
      const double err = std::fabs(double(got_v[i]) - want_v[i]);
      max_v_error_ = std::max(max_v_error_, err);
      ASSERT_LE(err, RowValueBound(store::KvTensorDtype(tier_, true), v_[layer].data() + static_cast<int64_t>(s) * kvd,
                                   h * hd + i, group))
          << "layer " << layer << " head " << h << " slot " << s << " V[" << i << "]";
    }
    ++*checked;
  }

  std::unique_ptr<OffloadedSparseAttention> off_;
  const kv::SequenceKv* seq_;
  store::KvDtype tier_;
  kv::KvShape shape_;
  std::vector<std::vector<float>> x_, k_, v_;  // [layer]: [slot, kv_dim] pre-RoPE K, rotated K, V
  int64_t whole_rows_ = 0, selected_rows_ = 0;
  double max_k_error_ = 0, max_v_error_ = 0;
};

TEST(OffloadTier, EachTypesRowsEnterWithinItsStepOfWhatTheForwardComputed) {
  const Stories st(DType::kF32);
  ASSERT_NE(st.e, nullptr);
  for (store::KvDtype tier_dtype : store::kKvDtypes) {
    // Whole-layer stagings (prefill chunks, pq's first sparse step) enter every released
    // block; pq's sparse steps select slots of released blocks too, streaming's only
    // resident ones (the first block and the local window).
    for (auto [method, selects_released] : {std::pair{"pq-0.2@min=64,iters=4", true},
                                            std::pair{"streaming-0.2@min=64", false}}) {
      SCOPED_TRACE(std::string("tier ") + store::KvDtypeName(tier_dtype) + ", " + method);
      store::DramTier tier(uint64_t{1} << 30);
      kv::SequenceKv seq(&st.e->kv_pool());
      OffloadOptions oo;
      oo.cache_blocks = 4;
      oo.tier_dtype = tier_dtype;
      auto made = st.Offloaded(*ParseSparseOptions(method), oo, &seq, &tier);
      ASSERT_TRUE(made.ok()) << made.status().ToString();
      TierRowChecker checker(std::move(*made), &seq, tier_dtype, st.cfg().n_layers);
      for (float x : Feed(st.e->transformer(), &seq, st.tokens, 400, &checker)) ASSERT_TRUE(std::isfinite(x));
      if (HasFatalFailure()) return;
      EXPECT_GT(checker.whole_rows(), 0);
      if (selects_released) {
        EXPECT_GT(checker.selected_rows(), 0);
      } else {
        EXPECT_EQ(checker.selected_rows(), 0);
      }
      EXPECT_EQ(checker.offloaded().offload_stats().backing_errors, 0);
      if (tier_dtype == store::KvDtype::kF32) {
        EXPECT_EQ(checker.max_k_error(), 0.0);  // the rows the forward computed, rotated alike
        EXPECT_EQ(checker.max_v_error(), 0.0);
      } else {
        EXPECT_GT(checker.max_k_error(), 0.0);  // the type did round them
        EXPECT_GT(checker.max_v_error(), 0.0);
      }
    }
  }
}

// The tier's bytes per block follow the layout docs/store.md gives for the type (computed
// here from it), whatever the compute buffer's type: every layer's block_size rows of K
// then V (kivi4: K's codes, then one group of kv_dim f16 scales and minimums).
TEST(OffloadTier, BytesPerBlockAreTheTypesRows) {
  for (DType pool_dtype : {DType::kF32, DType::kQ8_0}) {
    const Stories st(pool_dtype);
    ASSERT_NE(st.e, nullptr);
    const kv::KvShape& shape = st.e->kv_pool().shape();
    const int64_t kvd = shape.kv_dim(), bs = shape.block_size, g = attention::KvQ8Group(shape.head_dim);
    const int64_t q8 = kvd + 2 * kvd / g, q4 = kvd / 2 + 2 * kvd / g;
    const std::pair<store::KvDtype, int64_t> layer_bytes[] = {
        {store::KvDtype::kF32, 2 * bs * kvd * 4},     {store::KvDtype::kF16, 2 * bs * kvd * 2},
        {store::KvDtype::kQ8_0, 2 * bs * q8},         {store::KvDtype::kQ4_0, 2 * bs * q4},
        {store::KvDtype::kQ8_0Q4_0, bs * (q8 + q4)}, {store::KvDtype::kKivi4, bs * kvd / 2 + 4 * kvd + bs * q4}};
    for (auto [tier_dtype, per_layer] : layer_bytes) {
      SCOPED_TRACE(std::string("buffer ") + DTypeName(pool_dtype) + ", tier " + store::KvDtypeName(tier_dtype));
      store::DramTier tier(uint64_t{1} << 30);
      kv::SequenceKv seq(&st.e->kv_pool());
      OffloadOptions oo;
      oo.tier_dtype = tier_dtype;
      auto off = st.Offloaded(*ParseSparseOptions("pq-0.2@min=64,iters=4"), oo, &seq, &tier);
      ASSERT_TRUE(off.ok()) << off.status().ToString();
      for (float x : Feed(st.e->transformer(), &seq, st.tokens, 400, off->get())) ASSERT_TRUE(std::isfinite(x));
      const OffloadStats& s = (*off)->offload_stats();
      EXPECT_GE(s.offloaded_blocks, 25);
      EXPECT_EQ(s.backing_bytes, 30 * shape.n_layers * per_layer);
      EXPECT_EQ(OffloadTierBytes(shape, 480, tier_dtype), 30 * shape.n_layers * per_layer);
      EXPECT_EQ(tier.bytes(), static_cast<uint64_t>(s.backing_bytes));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Selectors, OffloadTest,
    // pq-0.2 at 480 slots: a local window of 24 slots (two blocks of 16); pq-0.1: 12;
    // streaming-0.2: the whole budget of 96 (six blocks).
    ::testing::Values(Case{"pq-0.2@min=64,iters=4", DType::kF32, CachePolicy::kLru, 6, 5},
                      Case{"pq-0.2@min=64,iters=4", DType::kF16, CachePolicy::kLfu, 6, 5},
                      Case{"pq-0.2@min=64,iters=4", DType::kQ8_0, CachePolicy::kLru, 6, 5},
                      Case{"pq-0.1@min=64,iters=4,combine=max", DType::kF32, CachePolicy::kLfu, 0, 4},
                      Case{"streaming-0.2@min=64", DType::kF32, CachePolicy::kLru, 4, 9},
                      Case{"streaming-0.2@min=64", DType::kQ8_0, CachePolicy::kLfu, 4, 9}),
    [](const auto& info) {
      std::string s = std::string(info.param.method) + "_" + DTypeName(info.param.kv_dtype) + "_" +
                      CachePolicyName(info.param.policy) + std::to_string(info.param.cache_blocks);
      for (auto& ch : s)
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

}  // namespace
}  // namespace attic::pq
