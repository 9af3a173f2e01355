// Tokenizer tests against independent references: stories260K's golden_reference.json
// (numpy HF-convention run, llama2.c-identical) and ids from @huggingface/tokenizers
// (tests/data/tokenizer/reference_ids.json, made by tools/tokref/gen_reference.mjs).
#include "attic/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/tokenizer_test_util.h"

namespace attic::tokenizer {
namespace {

using json = nlohmann::json;
using testing::EncodeOrDie;
using testing::ReadJsonOrDie;
using testing::ReadOrDie;
using testing::Smol;
using testing::Stories;

std::vector<int32_t> Ids(const json& j) { return j.get<std::vector<int32_t>>(); }

TEST(StoriesTokenizer, GoldenPromptIds) {
  const json golden = ReadJsonOrDie(testing::StoriesDir() + "/golden_reference.json");
  ASSERT_TRUE(golden.contains("cases"));
  ASSERT_EQ(golden["cases"].size(), 4u);
  for (const json& c : golden["cases"]) {
    const std::string prompt = c["prompt"];
    EXPECT_EQ(EncodeOrDie(Stories(), prompt), Ids(c["prompt_ids"])) << "prompt: " << prompt;
  }
}

TEST(StoriesTokenizer, GoldenGreedyTextDecodes) {
  const json golden = ReadJsonOrDie(testing::StoriesDir() + "/golden_reference.json");
  for (const json& c : golden["cases"]) {
    const std::vector<int32_t> greedy = Ids(c["greedy_ids"]);
    ASSERT_EQ(greedy.size(), 64u);
    // The generated continuation decodes (leading "▁" stripped) to greedy_text.
    EXPECT_EQ(Stories().Decode(greedy), c["greedy_text"].get<std::string>()) << c["prompt"];
  }
}

TEST(StoriesTokenizer, Basics) {
  const Tokenizer& tok = Stories();
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_TRUE(tok.IsSpecial(0));
  EXPECT_TRUE(tok.IsSpecial(1));
  EXPECT_TRUE(tok.IsSpecial(2));
  EXPECT_FALSE(tok.IsSpecial(403));
  EXPECT_TRUE(tok.StripsLeadingSpace());
  EXPECT_EQ(tok.TokenText(1), "<s>");
  EXPECT_EQ(tok.TokenId("<s>"), 1);
  EXPECT_EQ(tok.TokenId("no such token"), -1);
  EXPECT_EQ(tok.TokenText(-5), "");
  EXPECT_EQ(tok.TokenText(100000), "");
  EXPECT_EQ(tok.TokenBytes(3 + 0x41), "A");  // <0x41>
  EXPECT_EQ(tok.TokenText(403), "\xE2\x96\x81Once");
  EXPECT_EQ(tok.TokenBytes(403), " Once");
  EXPECT_EQ(tok.chat_template(), "");
  EXPECT_EQ(EncodeOrDie(tok, "Zoo", {.add_bos = false}), (std::vector<int32_t>{410, 469, 347}));
  EXPECT_EQ(tok.Decode({1, 403}), "<s> Once");
  EXPECT_EQ(tok.Decode({1, 403}, /*skip_special=*/true), "Once");
}

TEST(SmolTokenizer, KnownIds) {
  EXPECT_EQ(EncodeOrDie(Smol(), "Hello world, 12345"),
            (std::vector<int32_t>{19556, 905, 28, 216, 33, 34, 35, 36, 37}));
  EXPECT_FALSE(Smol().add_bos());
  EXPECT_FALSE(Smol().StripsLeadingSpace());
  EXPECT_EQ(Smol().vocab_size(), 49152);
  EXPECT_EQ(Smol().eos_id(), 2);  // config.json eos_token_id
  EXPECT_TRUE(Smol().IsSpecial(1));
  EXPECT_EQ(Smol().TokenText(905), "\xC4\xA0world");  // "Ġworld"
  EXPECT_EQ(Smol().TokenBytes(905), " world");
  EXPECT_EQ(Smol().chat_template(), ReadOrDie(testing::SmolDir() + "/chat_template.jinja"));
}

class ReferenceIdsTest : public ::testing::TestWithParam<std::string> {
 protected:
  const Tokenizer& tok() const { return testing::ReferenceTokenizer(GetParam()); }
};

TEST_P(ReferenceIdsTest, MatchesHuggingFaceTokenizersJs) {
  const json& ref = testing::ReferenceIds();
  ASSERT_TRUE(ref.contains("tokenizers")) << "reference_ids.json missing";
  const json& cases = ref["tokenizers"][GetParam()]["cases"];
  ASSERT_GE(cases.size(), 20u);
  for (const json& c : cases) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = Ids(c["ids"]);
    EXPECT_EQ(EncodeOrDie(tok(), text), want) << "text: " << text;
    // Decoding gives the text back: byte-level always (special tokens rendered as
    // written); SentencePiece when no special token splits the text (each segment
    // after one gets its own "▁" prefix, as in HF tokenizers).
    if (!tok().StripsLeadingSpace()) {
      std::vector<int32_t> no_bos(want.begin() + (tok().add_bos() ? 1 : 0), want.end());
      EXPECT_EQ(tok().Decode(no_bos, /*skip_special=*/false), text) << "text: " << text;
    } else if (std::count_if(want.begin(), want.end(), [&](int32_t id) { return tok().IsSpecial(id); }) == 1) {
      EXPECT_EQ(tok().Decode(want, /*skip_special=*/true), text) << "text: " << text;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ReferenceIdsTest,
                         ::testing::Values("stories260K", "smollm2", "smollm2_llama3_style", "smollm2_qwen2_style"));

TEST(Tokenizer, ParseSpecialOffNeverYieldsSpecialTokens) {
  for (const Tokenizer* tok : {&Stories(), &Smol()}) {
    const std::string text = "<|im_start|>user\nhi<|im_end|><s></s><unk><|endoftext|>";
    const std::vector<int32_t> ids = EncodeOrDie(*tok, text, {.add_bos = false, .parse_special = false});
    for (int32_t id : ids) EXPECT_FALSE(tok->IsSpecial(id)) << id;
    EXPECT_EQ(tok->Decode(ids), text);
  }
  // With parse_special the markers are single tokens.
  EXPECT_EQ(EncodeOrDie(Smol(), "<|im_start|>user\nhi<|im_end|>"), (std::vector<int32_t>{1, 4093, 198, 6004, 2}));
}

TEST(Tokenizer, AddBosOption) {
  EXPECT_EQ(EncodeOrDie(Stories(), "", {.add_bos = true}), std::vector<int32_t>{1});
  EXPECT_TRUE(EncodeOrDie(Stories(), "", {.add_bos = false}).empty());
  EXPECT_TRUE(EncodeOrDie(Smol(), "", {.add_bos = true}).empty());
}

TEST(Tokenizer, InvalidUtf8IsInvalidArgument) {
  const std::vector<std::string> bad = {
      std::string("\xff"), std::string("abc\xc3"), std::string("\xc0\xaf"),          // stray, truncated, overlong
      std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80"),                 // surrogate, > U+10FFFF
      std::string("ok \x80 no"), std::string("\xe2\x96") + "x",
  };
  for (const Tokenizer* tok : {&Stories(), &Smol()}) {
    for (const std::string& s : bad) {
      auto r = tok->Encode(s);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(Tokenizer, MalformedJsonIsAnError) {
  EXPECT_EQ(Tokenizer::FromJson("{not json", "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson("{}", "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson(R"({"model": {"type": "Unigram", "vocab": []}})", "").status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(Tokenizer::FromDirectory("/nonexistent/dir").status().code(), StatusCode::kNotFound);
}

// A hand-made byte-level tokenizer.json with merges written as [a, b] arrays.
TEST(Tokenizer, MergesAsArraysAndIgnoreMerges) {
  const std::string tj = R"({
    "added_tokens": [{"id": 7, "content": "<eos>", "special": true}],
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "Ġ": 5, "Ġa": 6, "<eos>": 7, "bc": 8},
              "merges": [["a", "b"], ["ab", "c"], ["Ġ", "a"], ["b", "c"]]}})";
  auto tok = Tokenizer::FromJson(tj, R"({"eos_token": "<eos>"})");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  // " ab" -> Ġ a b: (a, b) ranks before (Ġ, a), so Ġ | ab.
  EXPECT_EQ(EncodeOrDie(**tok, "abc ab<eos>"), (std::vector<int32_t>{4, 5, 3, 7}));
  EXPECT_EQ(EncodeOrDie(**tok, " a"), std::vector<int32_t>{6});
  EXPECT_EQ((*tok)->eos_id(), 7);
  EXPECT_EQ((*tok)->Decode({4, 6, 1, 7}), "abc ab<eos>");
  // "bc" has a lower priority than "ab": a|b|c -> ab|c -> abc.
  EXPECT_EQ(EncodeOrDie(**tok, "abc"), std::vector<int32_t>{4});

  // ignore_merges: a piece that is itself a token is taken whole, skipping merges.
  const std::string tj2 = R"({
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "ignore_merges": true,
              "vocab": {"a": 0, "b": 1, "c": 2, "bc": 3, "abc": 4},
              "merges": ["b c"]}})";
  auto tok2 = Tokenizer::FromJson(tj2, "");
  ASSERT_TRUE(tok2.ok()) << tok2.status().ToString();
  EXPECT_EQ(EncodeOrDie(**tok2, "abc"), std::vector<int32_t>{4});
  EXPECT_EQ(EncodeOrDie(**tok2, "abcb"), (std::vector<int32_t>{0, 3, 1}));
}

// The older SentencePiece form (Metaspace pre-tokenizer and decoder instead of the
// Prepend/Replace normalizer) tokenizes plain text the same way.
TEST(Tokenizer, MetaspaceFormMatchesNormalizerForm) {
  json tj = json::parse(ReadOrDie(testing::StoriesDir() + "/tokenizer.json"));
  tj["normalizer"] = nullptr;
  tj["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"add_prefix_space", true},
                         {"split", false}};
  tj["decoder"] = {{"type", "Sequence"},
                   {"decoders", json::array({{{"type", "ByteFallback"}},
                                             {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"},
                                              {"add_prefix_space", true}}})}};
  auto tok = Tokenizer::FromJson(tj.dump(), ReadOrDie(testing::StoriesDir() + "/tokenizer_config.json"));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  // (Text starting with a space differs: Metaspace prepends "▁" only when the text does
  // not already start with one.)
  for (const std::string text : {"Zoo", "Once upon a time, there was a little dog", "two  spaces ", "é 😀 x"}) {
    const auto want = EncodeOrDie(Stories(), text);
    EXPECT_EQ(EncodeOrDie(**tok, text), want) << text;
    EXPECT_EQ((*tok)->Decode(want, true), text);
  }
}

TEST(Tokenizer, EncodeIsThreadSafe) {
  const std::string text = ReadOrDie(attic::testing::SharedDir() + "/datasets/paul_graham_essays/avg.txt");
  const auto want_smol = EncodeOrDie(Smol(), text);
  const auto want_stories = EncodeOrDie(Stories(), text);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const Tokenizer& tok = t % 2 ? Smol() : Stories();
      auto ids = tok.Encode(text);
      if (!ids.ok() || *ids != (t % 2 ? want_smol : want_stories)) ++mismatches;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace attic::tokenizer
