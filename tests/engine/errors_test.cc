// Bad input gets a clear error, never a crash: prompts beyond the context window,
// invalid UTF-8, out-of-vocabulary ids, missing models.
#include <gtest/gtest.h>

#include "attic/engine/engine.h"
#include "test_util.h"

namespace attic::engine {
namespace {

using attic::testing::SharedDir;

std::unique_ptr<Engine> Load(int ctx = 0) {
  EngineOptions o;
  o.model_path = SharedDir() + "/models/stories260K-hf";
  o.n_threads = 1;
  o.context_length = ctx;
  auto e = Engine::Load(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

TEST(Errors, PromptLongerThanContextIsOutOfRange) {
  auto e = Load();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->context_length(), 512);
  std::vector<int32_t> prompt(513, 300);
  Session s(*e);
  auto r = s.Generate(prompt, SamplingParams{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(r.status().message().find("context window"), std::string::npos);
  // The session is still usable afterwards.
  auto ok = s.Generate({1, 403}, SamplingParams{});
  EXPECT_TRUE(ok.ok());
}

TEST(Errors, GenerationStopsAtTheWindowWithLength) {
  auto e = Load(32);
  ASSERT_NE(e, nullptr);
  Session s(*e);
  SamplingParams p;
  p.max_tokens = 100;
  auto r = s.Generate({1, 403, 407}, p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, "length");
  EXPECT_LE(static_cast<int>(r->tokens.size()), 32 - 3 + 1);
}

TEST(Errors, InvalidUtf8PromptIsInvalidArgument) {
  auto e = Load();
  ASSERT_NE(e, nullptr);
  for (std::string bad : {std::string("abc\xff"), std::string("\xc3"), std::string("\xed\xa0\x80"),
                          std::string("\xc0\xaf")}) {
    auto ids = e->Tokenize(bad, true);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(Errors, OutOfVocabularyIdIsInvalidArgument) {
  auto e = Load();
  ASSERT_NE(e, nullptr);
  Session s(*e);
  auto r = s.Prefill({1, 99999});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.kv().n_slots(), 0);
}

TEST(Errors, MissingModelIsNotFound) {
  EngineOptions o;
  o.model_path = "/nonexistent/model-dir";
  auto e = Engine::Load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
}

TEST(Errors, ChatWithoutTemplateNamesTheFlag) {
  auto e = Load();
  ASSERT_NE(e, nullptr);
  auto r = e->RenderChat({{"user", "hi", {}, {}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--chat-template"), std::string::npos);
}

}  // namespace
}  // namespace attic::engine
