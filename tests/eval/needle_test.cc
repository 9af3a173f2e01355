// The needle-in-a-haystack grid: prompts of the asked length with the needle where it was
// asked for, exact match, the grid's bookkeeping (an oracle method that reads the needle
// out of the prompt scores 1 everywhere, a blind one 0), and one real check: the trained
// retriever-1m finds pass keys in 256-token prompts, stories260K does not.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <regex>

#include "attic/engine/engine.h"
#include "attic/eval/needle.h"
#include "test_util.h"

namespace attic::eval {
namespace {

using attic::testing::SharedDir;
using attic::testing::TempDir;

std::unique_ptr<tokenizer::Tokenizer> StoriesTokenizer() {
  auto t = tokenizer::Tokenizer::FromDirectory(SharedDir() + "/models/stories260K-hf");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<std::string> Essays() {
  auto h = LoadHaystack(SharedDir() + "/datasets/paul_graham_essays");
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  return h.ok() ? *h : std::vector<std::string>{};
}

// Greedy answers without a model: reads the needle's number out of the prompt (so it
// fails wherever a prompt lacks its needle), or always says 12345.
class FakeMethod : public Method {
 public:
  FakeMethod(const tokenizer::Tokenizer& tok, bool oracle) : tok_(tok), oracle_(oracle) {}
  std::string name() const override { return oracle_ ? "oracle" : "blind"; }
  Status Score(const std::vector<int32_t>&, int, std::vector<float>*) override { return UnimplementedError("-"); }
  StatusOr<std::vector<int32_t>> Greedy(const std::vector<int32_t>& prompt, int max_new) override {
    std::string answer = "12345";
    if (oracle_) {
      const std::string text = tok_.Decode(prompt, true);
      std::smatch m;
      if (std::regex_search(text, m, std::regex(R"((pass key is|number is) (\d+)\.)"))) answer = m[2];
    }
    tokenizer::EncodeOptions eo;
    eo.add_bos = false;
    auto ids = tok_.Encode(" " + answer + ".", eo);
    if (!ids.ok()) return ids.status();
    ids->resize(std::min<size_t>(ids->size(), static_cast<size_t>(max_new)));
    return *ids;
  }

 private:
  const tokenizer::Tokenizer& tok_;
  bool oracle_;
};

TEST(Needle, ExactMatchOnTheDigits) {
  EXPECT_TRUE(ExactMatch(" 48213.", "48213"));
  EXPECT_TRUE(ExactMatch("48213", "48213"));
  EXPECT_TRUE(ExactMatch("\n 48213 is it", "48213"));
  EXPECT_FALSE(ExactMatch(" 482130.", "48213"));  // one digit too many
  EXPECT_FALSE(ExactMatch(" 4821.", "48213"));
  EXPECT_FALSE(ExactMatch(" 48223.", "48213"));
  EXPECT_FALSE(ExactMatch("What is the p", "48213"));
  EXPECT_FALSE(ExactMatch("the 48213", "48213"));  // not the continuation's first word
  EXPECT_FALSE(ExactMatch("", "48213"));
}

TEST(Needle, NeedlesFollowTheRetrieverFormatAndDependOnlyOnSeedAndTrial) {
  const Needle p = MakeNeedle(NeedleKind::kPassKey, 1, 0);
  ASSERT_EQ(p.answer.size(), 5u);
  EXPECT_EQ(p.sentence, "The pass key is " + p.answer + ". Remember it. " + p.answer + " is the pass key.");
  EXPECT_EQ(p.question, "What is the pass key? The pass key is");
  const Needle f = MakeNeedle(NeedleKind::kNamedFact, 1, 0);
  ASSERT_EQ(f.answer.size(), 4u);
  const std::string name = f.sentence.substr(0, f.sentence.find('\''));
  EXPECT_EQ(f.sentence, name + "'s number is " + f.answer + ".");
  EXPECT_EQ(f.question, "What is " + name + "'s number? " + name + "'s number is");
  EXPECT_EQ(MakeNeedle(NeedleKind::kPassKey, 1, 0).answer, p.answer);
  std::vector<std::string> keys;
  for (int t = 0; t < 8; ++t) keys.push_back(MakeNeedle(NeedleKind::kPassKey, 1, t).answer);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(std::unique(keys.begin(), keys.end()), keys.end()) << "trials share a key";
  EXPECT_NE(MakeNeedle(NeedleKind::kPassKey, 2, 0).answer, p.answer);
}

TEST(Needle, LoadHaystackReadsTxtFilesInNameOrderAsSentences) {
  TempDir d;
  std::ofstream(d.File("b.txt")) << "Third one!  Fourth\n\n  sentence? Tail";
  std::ofstream(d.File("a.txt")) << "First  sentence.\nSecond\tone.";
  std::ofstream(d.File("c.md")) << "Not read.";
  auto h = LoadHaystack(d.path());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(*h, (std::vector<std::string>{"First sentence.", "Second one.", "Third one!", "Fourth sentence?", "Tail"}));
  auto one = LoadHaystack(d.File("a.txt"));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 2u);
  EXPECT_EQ(LoadHaystack(d.File("missing.txt")).status().code(), StatusCode::kNotFound);
  std::ofstream(d.File("empty.txt")) << " \n ";
  EXPECT_EQ(LoadHaystack(d.File("empty.txt")).status().code(), StatusCode::kInvalidArgument);
}

TEST(Needle, PromptsHaveTheAskedLengthAndTheNeedleAtTheAskedDepth) {
  auto tok = StoriesTokenizer();
  ASSERT_NE(tok, nullptr);
  const auto essays = Essays();
  const Needle needle = MakeNeedle(NeedleKind::kPassKey, 1, 3);
  for (int length : {128, 300}) {
    std::vector<double> depths;
    for (double depth : {0.0, 0.5, 1.0}) {
      auto p = BuildNeedlePrompt(*tok, essays, 1234, needle, length, depth);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      const int n = static_cast<int>(p->tokens.size());
      EXPECT_LE(n, length);
      EXPECT_GE(n, length - 10) << "not filled to within a word";
      EXPECT_EQ(p->tokens[0], tok->bos_id());
      std::string text = tok->Decode(p->tokens, true);
      text.erase(0, text.find_first_not_of(' '));
      const std::string tail = " " + needle.question;
      ASSERT_GE(text.size(), tail.size());
      EXPECT_EQ(text.substr(text.size() - tail.size()), tail) << "the prompt ends with the question";
      EXPECT_EQ(text.find(needle.sentence), text.rfind(needle.sentence)) << "one needle";
      if (depth == 0) {
        EXPECT_EQ(text.find(needle.sentence), 0u) << text;
      } else if (depth == 1) {
        EXPECT_EQ(text.find(needle.sentence), text.size() - tail.size() - needle.sentence.size());
      }
      // needle_token points at the needle's first token.
      std::string from = tok->Decode(std::vector<int32_t>(p->tokens.begin() + p->needle_token, p->tokens.end()), true);
      from.erase(0, from.find_first_not_of(' '));
      EXPECT_EQ(from.rfind(needle.sentence, 0), 0u) << from.substr(0, 60);
      depths.push_back(p->depth);
    }
    EXPECT_EQ(depths[0], 0.0);
    EXPECT_NEAR(depths[1], 0.5, 0.3);
    EXPECT_EQ(depths[2], 1.0);
  }
  EXPECT_EQ(BuildNeedlePrompt(*tok, essays, 0, needle, 20, 0.5).status().code(), StatusCode::kInvalidArgument);
}

TEST(Needle, GridOfAnOracleIsOneAndOfABlindMethodZero) {
  auto tok = StoriesTokenizer();
  ASSERT_NE(tok, nullptr);
  FakeMethod oracle(*tok, true), blind(*tok, false);
  NeedleOptions o;
  o.lengths = {96, 200};
  o.depths = {0, 0.5, 1};
  o.trials = 3;
  std::vector<std::string> lines;
  auto run = RunNeedleGrid({&oracle, &blind}, *tok, Essays(), o, [&](const std::string& l) { lines.push_back(l); });
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->trials.size(), 2u * 2 * 3 * 3 * 2);  // kinds x lengths x depths x trials x methods
  EXPECT_EQ(lines.size(), 2u);                         // a progress line per length
  for (NeedleKind k : o.kinds) {
    for (int length : o.lengths) {
      for (double depth : o.depths) {
        EXPECT_EQ(CellAccuracy(*run, "oracle", k, length, depth), 1.0) << NeedleKindName(k) << " " << length;
        EXPECT_EQ(CellAccuracy(*run, "blind", k, length, depth), 0.0);
      }
    }
  }
  // The outputs' cells are the same figures.
  run->model = "m";
  const auto js = ToJson(*run);
  ASSERT_EQ(js["cells"].size(), 2u * 2 * 2 * 3);
  for (const auto& c : js["cells"]) EXPECT_EQ(c["exact_match"].get<double>(), c["method"] == "oracle" ? 1.0 : 0.0);
  EXPECT_EQ(js["results"].size(), run->trials.size());
  const std::string md = ToMarkdown(*run);
  EXPECT_NE(md.find("passkey, method oracle"), std::string::npos) << md;
  EXPECT_NE(md.find("| 0.50 | 1.00 | 1.00 | 1.00 |"), std::string::npos) << md;
  const std::string svg = ToSvg(*run);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t cells = 0;
  for (size_t at = 0; (at = svg.find("<rect x=", at)) != std::string::npos; ++at) ++cells;
  EXPECT_EQ(cells, 4u * 2 * 3);  // panels x lengths x depths
}

TEST(Needle, Retriever1mFindsPassKeysAndStories260KDoesNot) {
  NeedleOptions o;
  o.lengths = {256};
  o.depths = {0, 0.5, 1};
  o.kinds = {NeedleKind::kPassKey};
  o.trials = 4;
  int correct[2] = {0, 0};
  size_t trials = 0;
  int i = 0;
  for (const char* model : {"retriever-1m", "stories260K-hf"}) {
    engine::EngineOptions eo;
    eo.model_path = SharedDir() + "/models/" + model;
    eo.n_threads = 2;
    eo.context_length = 256 + kMaxAnswerTokens;
    auto e = engine::Engine::Load(eo);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    FullAttention full(**e);
    auto run = RunNeedleGrid({&full}, (*e)->tokenizer(), Essays(), o);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    for (const auto& t : run->trials) correct[i] += t.correct ? 1 : 0;
    trials = run->trials.size();
    std::printf("%s: pass key at 256 tokens, exact match %d/%zu\n", model, correct[i], trials);
    ++i;
  }
  ASSERT_EQ(trials, 12u);  // 3 depths x 4 trials
  // retriever-1m's README measured exact match 0.92 at ~250-300 tokens of filler. For 12
  // keys each found with p = 0.92, P(at most 6 found) = sum_{k<=6} C(12,k) p^k (1-p)^(12-k)
  // = 1.6e-4: at least 7 of 12 passes a model as good as the README says, all but that
  // rarely. The same check must fail stories260K, which never learned to retrieve.
  EXPECT_GE(correct[0], 7);
  EXPECT_LT(correct[1], 7);
}

}  // namespace
}  // namespace attic::eval
