// Sparse decoding on the methods axis (eval/sparse_method.h), on the trained stories260K
// and held-out TinyStories text. Expectations from what the methods are:
//  * a budget of every slot (ratio 1.0) attends to what full attention attends to, so
//    the logits equal full's (tolerance: relative 1e-4 of the largest logit, as the other
//    eval tests: decode rows run in other step shapes than full's prefill) and so do the
//    greedy tokens;
//  * StreamingLLM at a tenth of a long context drops most of it: far beyond that tolerance;
//  * the names parse (and bad ones are InvalidArgument), min_slots is kEvalMinSlots unless
//    the name sets it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "attic/core/file.h"
#include "attic/engine/engine.h"
#include "attic/eval/method.h"
#include "attic/eval/sparse_method.h"
#include "test_util.h"

namespace attic::eval {
namespace {

using attic::testing::SharedDir;

class SparseMethodTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine::EngineOptions o;
    o.model_path = SharedDir() + "/models/stories260K-hf";
    o.n_threads = 2;
    o.context_length = 512;
    o.max_batch_tokens = 96;  // the context spans several prefill chunks
    auto e = engine::Engine::Load(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
    auto text = ReadFileToString(SharedDir() + "/datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
    ASSERT_TRUE(text.ok());
    auto t = engine_->Tokenize(*text, true);
    ASSERT_TRUE(t.ok());
    tokens_.assign(t->begin(), t->begin() + 360);
    FullAttention full(*engine_);
    ASSERT_TRUE(full.Score(tokens_, kFirst, &full_).ok());
  }

  double MaxRelDiff(const std::vector<float>& got) const {
    EXPECT_EQ(got.size(), full_.size());
    double diff = 0, peak = 0;
    for (size_t i = 0; i < std::min(got.size(), full_.size()); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(got[i]) - full_[i]));
      peak = std::max(peak, std::abs(static_cast<double>(full_[i])));
    }
    return diff / peak;
  }

  static constexpr int kFirst = 200;
  std::unique_ptr<engine::Engine> engine_;
  std::vector<int32_t> tokens_;
  std::vector<float> full_;
};

TEST_F(SparseMethodTest, WholeBudgetEqualsFull) {
  for (const char* name : {"pq-1.0", "pq-1.0@combine=max", "oracle-1.0", "h2o-1.0", "streaming-1.0"}) {
    auto m = MakeMethod(name, *engine_);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().ToString();
    std::vector<float> logits;
    ASSERT_TRUE((*m)->Score(tokens_, kFirst, &logits).ok()) << name;
    EXPECT_LT(MaxRelDiff(logits), 1e-4) << name;
    const auto& st = static_cast<SparseDecodingMethod&>(**m).last_stats();
    EXPECT_EQ(st.sparse_steps, 360 - 1 - kFirst) << name;  // every decode step was a sparse one
    EXPECT_EQ(st.attended_slots, st.context_slots) << name;
  }
}

TEST_F(SparseMethodTest, WholeBudgetGreedyEqualsFull) {
  const std::vector<int32_t> prompt(tokens_.begin(), tokens_.begin() + kFirst);
  FullAttention full(*engine_);
  auto want = full.Greedy(prompt, 40);
  ASSERT_TRUE(want.ok());
  auto m = MakeMethod("pq-1.0", *engine_);
  ASSERT_TRUE(m.ok());
  auto got = (*m)->Greedy(prompt, 40);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, *want);
}

TEST_F(SparseMethodTest, StreamingOnALongContextDiffers) {
  auto m = MakeMethod("streaming-0.1", *engine_);
  ASSERT_TRUE(m.ok());
  std::vector<float> logits;
  ASSERT_TRUE((*m)->Score(tokens_, kFirst, &logits).ok());
  EXPECT_GT(MaxRelDiff(logits), 1e-2);
  const auto& st = static_cast<SparseDecodingMethod&>(**m).last_stats();
  EXPECT_LT(st.attended_slots * 9, st.context_slots);
}

TEST_F(SparseMethodTest, NamesParse) {
  for (const char* name : {"pq-0.2", "pq-0.1", "oracle-0.2", "oracle-0.1", "streaming-0.2", "h2o-0.1", "pq-64",
                           "pq-0.2@combine=max", "h2o-0.2@local=16,initial=2", "pq-0.1@iters=8,min=128"}) {
    EXPECT_TRUE(IsSparseMethodName(name)) << name;
    auto m = MakeMethod(name, *engine_);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().ToString();
    EXPECT_EQ((*m)->name(), name);
    const auto& o = static_cast<SparseDecodingMethod&>(**m).options();
    EXPECT_EQ(o.min_slots, std::string(name).find("min=128") != std::string::npos ? 128 : kEvalMinSlots) << name;
  }
  auto axis = MethodsAxis({"pq-0.2", "h2o-0.1", "streaming-0.2"});
  ASSERT_TRUE(axis.ok());
  EXPECT_EQ(axis->size(), 4u);
  for (const char* bad : {"pq-2.0", "pq-0.2@bogus=1", "pq-0.2@m=3", "oracle-0.0", "h2o-0.2@combine=avg"}) {
    auto m = MakeMethod(bad, *engine_);
    EXPECT_FALSE(m.ok()) << bad;
    if (!m.ok()) {
      EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
  EXPECT_FALSE(IsSparseMethodName("full"));  // the reference, not a sparse method
}

}  // namespace
}  // namespace attic::eval
