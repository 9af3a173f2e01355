// `attic eval link`'s parts (eval/link_eval.h): the splits cut where their definitions
// say (checked on token sequences and texts built by hand with stories260K's tokenizer), orders
// are permutations, and a run's figures for the exact cases are full's (KL 0 within
// rounding, top-1 and greedy agreement 1), for a linked method that is not exact they are not.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "attic/core/file.h"
#include "attic/engine/engine.h"
#include "attic/eval/link_eval.h"
#include "attic/eval/method.h"
#include "test_util.h"

namespace attic::eval {
namespace {

using attic::testing::SharedDir;

class LinkEvalTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine::EngineOptions o;
    o.model_path = SharedDir() + "/models/stories260K-hf";
    o.n_threads = 2;
    auto e = engine::Engine::Load(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e).release();
  }
  static void TearDownTestSuite() { delete engine_; }

  std::vector<int32_t> Encode(const std::string& s) const {
    tokenizer::EncodeOptions eo;
    eo.add_bos = false;
    return *engine_->tokenizer().Encode(s, eo);
  }

  static engine::Engine* engine_;
};
engine::Engine* LinkEvalTest::engine_ = nullptr;

TEST_F(LinkEvalTest, FixedCutsRunsOfChunkTokens) {
  LinkPrompt p;
  p.context.assign(50, 7);
  p.passage_starts = {0, 20};
  const auto cut = SplitContext(p, engine_->tokenizer(), LinkSplit::kFixed, 16);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->tokens, p.context);
  const auto& c = cut->chunks;
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].begin, 0);
  EXPECT_EQ(c[3].begin, 48);
  EXPECT_EQ(c[3].n, 2);
}

TEST_F(LinkEvalTest, SentenceCutsAtPassagesThenSentences) {
  // Three sentences; a passage starts with the third.
  const std::vector<int32_t> a = Encode("Tom saw a big red ball.");
  const std::vector<int32_t> b = Encode("He ran to get it and he was happy!");
  const std::vector<int32_t> d = Encode("The sun was warm and the birds sang in the tall green trees all day long");
  LinkPrompt p;
  p.context = a;
  p.context.insert(p.context.end(), b.begin(), b.end());
  const int third = static_cast<int>(p.context.size());
  p.context.insert(p.context.end(), d.begin(), d.end());
  p.passage_starts = {0, third};
  const int n = static_cast<int>(p.context.size());
  auto cut = [&](int budget) {
    auto r = SplitContext(p, engine_->tokenizer(), LinkSplit::kSentence, budget);
    EXPECT_TRUE(r.ok());
    EXPECT_EQ(r->tokens, p.context);
    return r->chunks;
  };
  // A budget that reaches past the passage start: the cut is at the passage.
  auto c = cut(third + 3);
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(c[0].n, third);
  // A budget that reaches into the second sentence only: the cut is after the first.
  c = cut(static_cast<int>(a.size()) + 3);
  EXPECT_EQ(c[0].n, static_cast<int>(a.size()));
  // No boundary within reach: a fixed cut. Chunks tile the context.
  c = cut(4);
  EXPECT_EQ(c[0].n, 4);
  int covered = 0;
  for (const auto& ch : c) {
    EXPECT_EQ(ch.begin, covered);
    EXPECT_LE(ch.n, 4);
    covered += ch.n;
  }
  EXPECT_EQ(covered, n);
}

TEST_F(LinkEvalTest, SemanticIsSplitDocumentOfTheText) {
  // Two paragraphs that fit one budget each: semantic cuts between them, and the chunks'
  // tokens are the text's own encoding (the prompt is the text, token for token).
  LinkPrompt p;
  p.context_text = "Tom saw a big red ball. He ran to get it.\n\nThe sun was warm and the birds sang.";
  const auto r = SplitContext(p, engine_->tokenizer(), LinkSplit::kSemantic, 24);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->chunks.size(), 2u);
  const std::vector<int32_t> whole = Encode(p.context_text);
  EXPECT_EQ(r->tokens, whole);
  // The first paragraph with its blank line encodes to a prefix of the whole ("\n" is a
  // token of its own here, and "The" after it has no space to carry): the first chunk.
  const std::vector<int32_t> first = Encode("Tom saw a big red ball. He ran to get it.\n\n");
  ASSERT_TRUE(std::equal(first.begin(), first.end(), whole.begin()));
  EXPECT_EQ(r->chunks[0].n, static_cast<int>(first.size()));
  EXPECT_EQ(r->chunks[1].begin, r->chunks[0].n);
  EXPECT_EQ(r->chunks[1].begin + r->chunks[1].n, static_cast<int>(r->tokens.size()));
}

TEST_F(LinkEvalTest, OrdersArePermutations) {
  EXPECT_EQ(OrderChunks(4, ChunkOrder::kOriginal, 1), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(OrderChunks(4, ChunkOrder::kReversed, 1), (std::vector<int>{3, 2, 1, 0}));
  std::vector<int> s = OrderChunks(9, ChunkOrder::kShuffled, 5);
  EXPECT_EQ(s, OrderChunks(9, ChunkOrder::kShuffled, 5));  // reproducible
  EXPECT_NE(s, OrderChunks(9, ChunkOrder::kOriginal, 5));
  std::sort(s.begin(), s.end());
  EXPECT_EQ(s, OrderChunks(9, ChunkOrder::kOriginal, 5));
}

TEST_F(LinkEvalTest, ARunOfTheExactCasesMatchesFull) {
  auto text = ReadFileToString(SharedDir() + "/datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
  ASSERT_TRUE(text.ok());
  const std::vector<int32_t> tokens = Encode(*text);
  const auto prompts = TextPrompts(tokens, engine_->tokenizer(), 4 * 24, 16, 2);
  ASSERT_EQ(prompts.size(), 2u);
  EXPECT_EQ(prompts[1].context[0], tokens[4 * 24 + 16]);  // consecutive, without overlap
  std::vector<std::unique_ptr<Method>> owned;
  std::vector<Method*> methods;
  for (const char* name : {"full", "attnlink-24", "cacheblend-1+bos", "naive"}) {
    owned.push_back(std::move(*MakeMethod(name, *engine_)));
    methods.push_back(owned.back().get());
  }
  LinkEvalOptions o;
  o.chunk_tokens = 24;
  o.greedy_tokens = 8;
  auto run = RunLinkEval(methods, engine_->tokenizer(), engine_->tokenizer().bos_id(), prompts, o);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  // Per split: the aggregate, then one cell per order, for each method.
  ASSERT_EQ(run->cells.size(), 4u * (1 + 3));
  for (const LinkCell& c : run->cells) {
    EXPECT_EQ(c.n_prompts, c.order == "all" ? 6 : 2);
    EXPECT_EQ(c.scores.n_tokens(), c.n_prompts * 16);
    if (c.method == "naive") {
      EXPECT_GT(c.scores.mean_kl(), 1e-4) << c.order;
      continue;
    }
    EXPECT_LT(c.scores.mean_kl(), 1e-8) << c.method << " " << c.order;
    EXPECT_EQ(c.scores.top1_agreement(), 1.0) << c.method << " " << c.order;
    EXPECT_EQ(c.greedy_agreement, 1.0) << c.method << " " << c.order;
  }
  const std::string md = ToMarkdown(*run);
  EXPECT_NE(md.find("| attnlink-24 |"), std::string::npos) << md;
  EXPECT_EQ(ToJson(*run)["cells"].size(), run->cells.size());
  EXPECT_EQ(ToSvg(*run).rfind("<svg", 0), 0u);
}

// With the chunks kept as kivi4 entries (set_chunk_store_dtype), a linked method reads
// the chunks' KV as such an entry gives it back: naive linking, which recomputes no
// cached token, scores differently than over the chunks' f32 KV, while a method that
// recomputes every chunk token (attnlink-24 over 24-token chunks) still matches full.
TEST_F(LinkEvalTest, ChunksKeptInAStoreTypeAreReadAsItsEntries) {
  auto text = ReadFileToString(SharedDir() + "/datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
  ASSERT_TRUE(text.ok());
  const auto prompts = TextPrompts(Encode(*text), engine_->tokenizer(), 4 * 24, 16, 2);
  LinkEvalOptions o;
  o.chunk_tokens = 24;
  o.greedy_tokens = 8;
  o.orders = {ChunkOrder::kOriginal};
  double naive_kl[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    std::vector<std::unique_ptr<Method>> owned;
    std::vector<Method*> methods;
    for (const char* name : {"full", "attnlink-24", "naive"}) {
      owned.push_back(std::move(*MakeMethod(name, *engine_)));
      if (i == 1) owned.back()->set_chunk_store_dtype(store::KvDtype::kKivi4);
      methods.push_back(owned.back().get());
    }
    auto run = RunLinkEval(methods, engine_->tokenizer(), engine_->tokenizer().bos_id(), prompts, o);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    for (const LinkCell& c : run->cells) {
      if (c.order != "all") continue;
      if (c.method == "naive") naive_kl[i] = c.scores.mean_kl();
      if (c.method == "attnlink-24") {
        EXPECT_LT(c.scores.mean_kl(), 1e-8) << i;
      }
    }
  }
  EXPECT_GT(naive_kl[0], 1e-4);
  EXPECT_GT(naive_kl[1], 1e-4);
  EXPECT_NE(naive_kl[0], naive_kl[1]);
}

}  // namespace
}  // namespace attic::eval
