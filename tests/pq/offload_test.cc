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
#include "attic/pq/offload.h"
#include "attic/store/memory_tier.h"
#include "engine/tiny_llama.h"
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
