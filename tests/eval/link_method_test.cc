// Linked methods on the methods axis (eval/link_method.h) against full attention, on the
// trained stories260K and held-out TinyStories text. The expectations come from what the
// methods are, not from the code under test:
//  * exactness cases: AttnLink with k >= every chunk's length recomputes every cached
//    token, and so does CacheBlend with ratio 1, so both give full's logits (and greedy
//    tokens); Naive with one chunk prefilled exactly as full prefills those tokens (the
//    chunk at slot 0 holding the BOS itself, or at slot 1 prefilled after a BOS) leaves
//    nothing to differ. Tolerance: relative 1e-4 of the largest logit, as the other eval
//    tests (f32 sums in another order: the linked rows run in other step shapes).
//  * a sanity check that linking happened: Naive with several chunks, each prefilled
//    from position 0, moves the logits far beyond that tolerance;
//  * how many cached tokens each method recomputes, from the chunk lengths;
//  * chunks outside the context are an InvalidArgument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "attic/core/file.h"
#include "attic/engine/engine.h"
#include "attic/eval/link_method.h"
#include "attic/eval/method.h"
#include "test_util.h"

namespace attic::eval {
namespace {

using attic::testing::SharedDir;

class LinkMethodTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    engine::EngineOptions o;
    o.model_path = SharedDir() + "/models/stories260K-hf";
    o.n_threads = 2;
    o.context_length = 256;
    o.max_batch_tokens = GetParam();  // 512: one step; 16: linking and decoding span several
    auto e = engine::Engine::Load(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
    auto text = ReadFileToString(SharedDir() + "/datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
    ASSERT_TRUE(text.ok());
    auto t = engine_->Tokenize(*text, false);
    ASSERT_TRUE(t.ok());
    bos_ = engine_->tokenizer().bos_id();
    ASSERT_GE(bos_, 0);
    // BOS, three chunks of 20, 31 and 25 tokens from different places of the text, then
    // 24 tokens of continuation.
    tokens_ = {bos_};
    for (auto [at, n] : {std::pair{100, 20}, std::pair{2000, 31}, std::pair{5000, 25}}) {
      chunks_.push_back({static_cast<int>(tokens_.size()), n});
      tokens_.insert(tokens_.end(), t->begin() + at, t->begin() + at + n);
    }
    first_scored_ = static_cast<int>(tokens_.size());
    tokens_.insert(tokens_.end(), t->begin() + 5025, t->begin() + 5049);
    vocab_ = engine_->model().config().vocab_size;
    FullAttention full(*engine_);
    ASSERT_TRUE(full.Score(tokens_, first_scored_, &full_logits_).ok());
  }

  std::unique_ptr<Method> Make(const std::string& name) {
    auto m = MakeMethod(name, *engine_);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }

  // Largest |a - b| over the rows, relative to the largest |b|.
  static double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    }
    return diff / scale;
  }

  // RelDiff, printed (the measured figures are quoted in docs/eval.md).
  static double Measured(const std::string& what, const std::vector<float>& a, const std::vector<float>& b) {
    const double d = RelDiff(a, b);
    std::printf("  %s: largest logit difference from full %.3g (relative)\n", what.c_str(), d);
    return d;
  }

  std::vector<float> Score(Method& m, const std::vector<ContextChunk>& chunks) {
    m.set_chunks(chunks);
    std::vector<float> logits;
    Status st = m.Score(tokens_, first_scored_, &logits);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return logits;
  }

  std::unique_ptr<engine::Engine> engine_;
  int32_t bos_ = -1;
  int vocab_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<ContextChunk> chunks_;
  int first_scored_ = 0;
  std::vector<float> full_logits_;
};

constexpr double kTolerance = 1e-4;

TEST_P(LinkMethodTest, AttnLinkWithKAtLeastTheChunkLengthIsFull) {
  for (const char* name : {"attnlink-32", "attnlink-32+bos", "attnlink-31"}) {
    auto m = Make(name);
    const std::vector<float> logits = Score(*m, chunks_);
    ASSERT_EQ(logits.size(), full_logits_.size()) << name;
    EXPECT_LT(Measured(name, logits, full_logits_), kTolerance) << name;
    auto* lm = static_cast<LinkedMethod*>(m.get());
    EXPECT_EQ(lm->last_linked(), 20 + 31 + 25) << name;
    EXPECT_EQ(lm->last_recomputed(), 20 + 31 + 25) << name;
  }
}

TEST_P(LinkMethodTest, CacheBlendWithRatioOneIsFull) {
  for (const char* name : {"cacheblend-1", "cacheblend-1.0+bos", "cacheblend-1@0"}) {
    auto m = Make(name);
    EXPECT_LT(Measured(name, Score(*m, chunks_), full_logits_), kTolerance) << name;
    EXPECT_EQ(static_cast<LinkedMethod*>(m.get())->last_recomputed(), 20 + 31 + 25 - 1) << name
        << " (every chunk token but the prompt's last, which is always computed and not counted as selected)";
  }
}

TEST_P(LinkMethodTest, NaiveWithOneChunkPrefilledAsFullIsFull) {
  // The BOS and the first chunk as one chunk at slot 0, prefilled from position 0.
  auto plain = Make("naive");
  EXPECT_LT(Measured("naive, one chunk at 0", Score(*plain, {{0, first_scored_}}), full_logits_), kTolerance);
  // The context after the prompt's BOS as one chunk, prefilled after a BOS of its own.
  auto bos = Make("naive+bos");
  EXPECT_LT(Measured("naive+bos, one chunk at 1", Score(*bos, {{1, first_scored_ - 1}}), full_logits_), kTolerance);
  EXPECT_EQ(static_cast<LinkedMethod*>(bos.get())->last_recomputed(), 1);  // the last slot only
}

TEST_P(LinkMethodTest, NaiveWithSeveralChunksDiffersFromFull) {
  for (const char* name : {"naive", "naive+bos", "attnlink-2", "cacheblend-0.15"}) {
    auto m = Make(name);
    const double d = Measured(name, Score(*m, chunks_), full_logits_);
    EXPECT_GT(d, 100 * kTolerance) << name << ": linked chunks should not look like one causal prefill";
  }
}

TEST_P(LinkMethodTest, RecomputedTokensFollowTheMethod) {
  auto m = Make("attnlink-4");
  Score(*m, chunks_);
  EXPECT_EQ(static_cast<LinkedMethod*>(m.get())->last_recomputed(), 3 * 4);  // 2 + 2 per chunk
  auto naive = Make("naive");
  Score(*naive, chunks_);
  EXPECT_EQ(static_cast<LinkedMethod*>(naive.get())->last_recomputed(), 1);  // the prompt's last slot
}

TEST_P(LinkMethodTest, GreedyOfTheExactCasesIsFulls) {
  FullAttention full(*engine_);
  const std::vector<int32_t> prompt(tokens_.begin(), tokens_.begin() + first_scored_);
  auto want = full.Greedy(prompt, 12);
  ASSERT_TRUE(want.ok());
  ASSERT_FALSE(want->empty());
  for (const char* name : {"attnlink-32+bos", "cacheblend-1"}) {
    auto m = Make(name);
    m->set_chunks(chunks_);
    auto got = m->Greedy(prompt, 12);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, *want) << name;
  }
}

TEST_P(LinkMethodTest, ChunksOutsideTheContextAreRejected) {
  auto m = Make("attnlink-8");
  m->set_chunks({{1, first_scored_}});  // one token past the context
  std::vector<float> logits;
  EXPECT_EQ(m->Score(tokens_, first_scored_, &logits).code(), StatusCode::kInvalidArgument);
  m->set_chunks({{5, 10}, {10, 10}});  // overlapping
  EXPECT_EQ(m->Score(tokens_, first_scored_, &logits).code(), StatusCode::kInvalidArgument);
  m->set_chunks({});  // the default cut
  EXPECT_TRUE(m->Score(tokens_, first_scored_, &logits).ok());
}

TEST_P(LinkMethodTest, NamesAreChecked) {
  EXPECT_TRUE(MakeMethod("cacheblend-0.3@1+bos", *engine_).ok());
  EXPECT_EQ(MakeMethod("attnlink-x", *engine_).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeMethod("cacheblend-0.1@9", *engine_).status().code(), StatusCode::kInvalidArgument);  // 5 layers
  EXPECT_FALSE(MethodsAxis({"full+bos"}).ok());
  auto axis = MethodsAxis({"naive", "attnlink-16+bos"});
  ASSERT_TRUE(axis.ok());
  EXPECT_EQ(*axis, (std::vector<std::string>{"full", "naive", "attnlink-16+bos"}));
}

INSTANTIATE_TEST_SUITE_P(StepSizes, LinkMethodTest, ::testing::Values(512, 16));

}  // namespace
}  // namespace attic::eval
