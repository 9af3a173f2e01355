// stories260K against its independent golden reference (a numpy fp32 forward of the
// original llama2.c checkpoint, ../shared/models/stories260K-hf/golden_reference.json):
// prompt ids, 64 greedy tokens and first-step logits, for the fp32 and fp16 HF
// directories and for the GGUF made by llama.cpp's converter.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "attic/core/file.h"
#include "attic/engine/engine.h"
#include "test_util.h"

namespace attic::engine {
namespace {

using attic::testing::SharedDir;

nlohmann::json Golden() {
  auto text = ReadFileToString(SharedDir() + "/models/stories260K-hf/golden_reference.json");
  EXPECT_TRUE(text.ok());
  return nlohmann::json::parse(*text);
}

std::unique_ptr<Engine> LoadOrDie(const std::string& path, DType kv_dtype = DType::kF32) {
  EngineOptions o;
  o.model_path = path;
  o.n_threads = 2;
  o.kv_dtype = kv_dtype;
  auto e = Engine::Load(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

// Greedy decode of `n` tokens through the engine's generate path.
std::vector<int32_t> Greedy(Engine& e, const std::vector<int32_t>& prompt, int n) {
  Session s(e);
  SamplingParams p;
  p.max_tokens = n;
  p.stop_token_ids.clear();
  auto r = s.Generate(prompt, p);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, PromptIdsAndGreedyTokens) {
  auto golden = Golden();
  auto e = LoadOrDie(SharedDir() + "/models/" + GetParam());
  ASSERT_NE(e, nullptr);
  for (const auto& c : golden["cases"]) {
    std::string prompt = c["prompt"];
    auto ids = e->Tokenize(prompt, true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, c["prompt_ids"].get<std::vector<int32_t>>()) << "prompt '" << prompt << "'";
    auto want = c["greedy_ids"].get<std::vector<int32_t>>();
    auto got = Greedy(*e, *ids, static_cast<int>(want.size()));
    EXPECT_EQ(got, want) << "prompt '" << prompt << "' on " << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(Stories, GoldenTest,
                         ::testing::Values("stories260K-hf", "stories260K-hf-f16", "stories260K-gguf/stories260K.gguf"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& ch : s) if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

// The f16 KV cache (`--kv-dtype f16`) rounds K and V to f16 (~5e-4 relative): the
// reference's greedy tokens must survive that.
TEST(Golden, F16KvCacheKeepsTheGreedyTokens) {
  auto golden = Golden();
  auto e = LoadOrDie(SharedDir() + "/models/stories260K-hf", DType::kF16);
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->kv_pool().shape().k_dtype, DType::kF16);
  ASSERT_EQ(e->kv_pool().shape().v_dtype, DType::kF16);
  for (const auto& c : golden["cases"]) {
    auto want = c["greedy_ids"].get<std::vector<int32_t>>();
    auto got = Greedy(*e, c["prompt_ids"].get<std::vector<int32_t>>(), static_cast<int>(want.size()));
    EXPECT_EQ(got, want) << "prompt '" << c["prompt"].get<std::string>() << "'";
  }
}

TEST(Golden, Fp32FirstStepLogitsWithin1e4) {
  auto golden = Golden();
  auto e = LoadOrDie(SharedDir() + "/models/stories260K-hf");
  ASSERT_NE(e, nullptr);
  for (const auto& c : golden["cases"]) {
    Session s(*e);
    auto logits = s.Prefill(c["prompt_ids"].get<std::vector<int32_t>>());
    ASSERT_TRUE(logits.ok());
    auto want = c["first_step_logits"].get<std::vector<double>>();
    ASSERT_EQ(logits->size(), want.size());
    double max_err = 0;
    for (size_t i = 0; i < want.size(); ++i) max_err = std::max(max_err, std::abs((*logits)[i] - want[i]));
    EXPECT_LT(max_err, 1e-4) << "prompt '" << c["prompt"].get<std::string>() << "'";
  }
}

TEST(Golden, GreedyTextDecodes) {
  auto golden = Golden();
  auto e = LoadOrDie(SharedDir() + "/models/stories260K-hf");
  ASSERT_NE(e, nullptr);
  const auto& c = golden["cases"][1];  // "Zoo"
  Session s(*e);
  SamplingParams p;
  p.max_tokens = 64;
  auto r = s.Generate(c["prompt_ids"].get<std::vector<int32_t>>(), p);
  ASSERT_TRUE(r.ok());
  // The golden text is the decode of the greedy ids; streaming decode must give the same
  // bytes (its leading space is dropped as the first piece of a SentencePiece stream).
  std::string want = c["greedy_text"];
  EXPECT_EQ(r->text, want);
}

}  // namespace
}  // namespace attic::engine
