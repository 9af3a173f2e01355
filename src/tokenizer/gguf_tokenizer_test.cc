// Tokenizer::FromGguf on stories260K.gguf (made by llama.cpp's converter): it must give
// the same ids as the tokenizer.json of the same model. The tiny GGUF metadata reader
// below exists only for this test; the model module owns the real one.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "attic/model/model.h"
#include "attic/tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace attic::tokenizer {
namespace {

// Reads the key/value section of a GGUF v2/v3 file into GgufTokenizerData.
class MiniGgufReader {
 public:
  explicit MiniGgufReader(std::string bytes) : b_(std::move(bytes)) {}

  std::optional<model::GgufTokenizerData> Read() {
    if (b_.compare(0, 4, "GGUF") != 0) return std::nullopt;
    pos_ = 4;
    const uint32_t version = U32();
    if (version < 2) return std::nullopt;
    U64();  // tensor count
    const uint64_t n_kv = U64();
    model::GgufTokenizerData d;
    bool add_bos_seen = false;
    for (uint64_t i = 0; i < n_kv && ok_; ++i) {
      const std::string key = Str();
      const uint32_t type = U32();
      if (key == "tokenizer.ggml.model") {
        d.model = Str();
      } else if (key == "tokenizer.ggml.pre") {
        d.pre = Str();
      } else if (key == "tokenizer.chat_template") {
        d.chat_template = Str();
      } else if (key == "tokenizer.ggml.tokens" || key == "tokenizer.ggml.merges") {
        auto& dst = key == "tokenizer.ggml.tokens" ? d.tokens : d.merges;
        U32();  // element type: string
        for (uint64_t n = U64(), k = 0; k < n && ok_; ++k) dst.push_back(Str());
      } else if (key == "tokenizer.ggml.scores") {
        U32();
        for (uint64_t n = U64(), k = 0; k < n && ok_; ++k) d.scores.push_back(Pod<float>());
      } else if (key == "tokenizer.ggml.token_type") {
        U32();
        for (uint64_t n = U64(), k = 0; k < n && ok_; ++k) d.token_types.push_back(Pod<int32_t>());
      } else if (key == "tokenizer.ggml.bos_token_id") {
        d.bos_id = static_cast<int>(Pod<uint32_t>());
      } else if (key == "tokenizer.ggml.eos_token_id") {
        d.eos_id = static_cast<int>(Pod<uint32_t>());
      } else if (key == "tokenizer.ggml.unknown_token_id") {
        d.unk_id = static_cast<int>(Pod<uint32_t>());
      } else if (key == "tokenizer.ggml.add_bos_token") {
        d.add_bos = Pod<uint8_t>() != 0;
        add_bos_seen = true;
      } else if (key == "tokenizer.ggml.add_eos_token") {
        d.add_eos = Pod<uint8_t>() != 0;
      } else if (key == "tokenizer.ggml.add_space_prefix") {
        d.add_space_prefix = Pod<uint8_t>() != 0;
      } else {
        Skip(type);
      }
    }
    // llama.cpp's default when the key is absent: SentencePiece models add BOS.
    if (!add_bos_seen) d.add_bos = d.model == "llama";
    if (!ok_) return std::nullopt;
    return d;
  }

 private:
  template <typename T>
  T Pod() {
    T v{};
    if (pos_ + sizeof(T) > b_.size()) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint32_t U32() { return Pod<uint32_t>(); }
  uint64_t U64() { return Pod<uint64_t>(); }
  std::string Str() {
    const uint64_t n = U64();
    if (!ok_ || pos_ + n > b_.size()) {
      ok_ = false;
      return "";
    }
    std::string s = b_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  void Skip(uint32_t type) {
    static constexpr size_t kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
      Str();
    } else if (type == 9) {
      const uint32_t et = U32();
      for (uint64_t n = U64(), k = 0; k < n && ok_; ++k) Skip(et);
    } else if (type < 13) {
      pos_ += kSize[type];
    } else {
      ok_ = false;
    }
  }

  std::string b_;
  size_t pos_ = 0;
  bool ok_ = true;
};

const Tokenizer& StoriesGguf() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto data = MiniGgufReader(testing::ReadOrDie(testing::StoriesGguf())).Read();
    if (!data) {
      ADD_FAILURE() << "cannot read " << testing::StoriesGguf();
      return std::unique_ptr<Tokenizer>();
    }
    EXPECT_EQ(data->model, "llama");
    EXPECT_EQ(data->tokens.size(), 512u);
    auto t = Tokenizer::FromGguf(*data);
    if (!t.ok()) ADD_FAILURE() << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }();
  return *tok;
}

TEST(GgufTokenizer, StoriesMetadata) {
  const Tokenizer& tok = StoriesGguf();
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_TRUE(tok.IsSpecial(1));
  EXPECT_FALSE(tok.IsSpecial(300));
  EXPECT_TRUE(tok.StripsLeadingSpace());
  for (int32_t id = 0; id < 512; ++id) {
    EXPECT_EQ(tok.TokenText(id), testing::Stories().TokenText(id)) << id;
    EXPECT_EQ(tok.TokenBytes(id), testing::Stories().TokenBytes(id)) << id;
  }
}

TEST(GgufTokenizer, GoldenPromptIds) {
  const auto golden = testing::ReadJsonOrDie(testing::StoriesDir() + "/golden_reference.json");
  for (const auto& c : golden["cases"]) {
    EXPECT_EQ(testing::EncodeOrDie(StoriesGguf(), c["prompt"].get<std::string>()),
              c["prompt_ids"].get<std::vector<int32_t>>());
  }
}

// Same ids as tokenizer.json for the reference strings and for every dataset file.
TEST(GgufTokenizer, MatchesTokenizerJson) {
  const auto ref = testing::ReadJsonOrDie(testing::TestDataDir() + "/reference_ids.json");
  for (const auto& c : ref["tokenizers"]["stories260K"]["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(testing::EncodeOrDie(StoriesGguf(), text), c["ids"].get<std::vector<int32_t>>()) << text;
  }
  for (const std::string name : {"tiny_shakespeare/input.txt", "tinystories_valid_sample/TinyStories-valid-sample.txt",
                                 "paul_graham_essays/worked.txt", "sharegpt_multiturn_sample/sharegpt_test.json"}) {
    const std::string text = testing::ReadOrDie(attic::testing::SharedDir() + "/datasets/" + name);
    const auto gguf_ids = testing::EncodeOrDie(StoriesGguf(), text);
    EXPECT_TRUE(gguf_ids == testing::EncodeOrDie(testing::Stories(), text)) << name;
    EXPECT_EQ(StoriesGguf().Decode(gguf_ids, /*skip_special=*/true), text) << name;
  }
}

TEST(GgufTokenizer, RejectsBadInput) {
  model::GgufTokenizerData empty;
  empty.model = "llama";
  EXPECT_EQ(Tokenizer::FromGguf(empty).status().code(), StatusCode::kInvalidArgument);
  model::GgufTokenizerData unknown;
  unknown.model = "t5";
  unknown.tokens = {"a"};
  EXPECT_EQ(Tokenizer::FromGguf(unknown).status().code(), StatusCode::kUnimplemented);
  model::GgufTokenizerData bad_pre;
  bad_pre.model = "gpt2";
  bad_pre.pre = "no-such-pre";
  bad_pre.tokens = {"a", "b", "ab"};
  bad_pre.merges = {"a b"};
  EXPECT_EQ(Tokenizer::FromGguf(bad_pre).status().code(), StatusCode::kUnimplemented);
}

// A gpt2-model GGUF built from SmolLM2's tokenizer.json (as llama.cpp's converter
// would: tokens in id order, merges, control type for added specials) with a named
// pre-tokenizer gives the ids @huggingface/tokenizers gives for the tokenizer.json
// variant with the same pre-tokenizer (reference_ids.json).
struct Gpt2Case {
  const char* pre;
  const char* reference;  // entry of reference_ids.json
  bool add_bos;
};

class Gpt2GgufTest : public ::testing::TestWithParam<Gpt2Case> {};

TEST_P(Gpt2GgufTest, MatchesReference) {
  const auto tj = testing::ReadJsonOrDie(testing::SmolDir() + "/tokenizer.json");
  model::GgufTokenizerData d;
  d.model = "gpt2";
  d.pre = GetParam().pre;
  d.tokens.resize(tj["model"]["vocab"].size());
  for (auto it = tj["model"]["vocab"].begin(); it != tj["model"]["vocab"].end(); ++it) {
    d.tokens[it.value().get<size_t>()] = it.key();
  }
  d.token_types.assign(d.tokens.size(), 1);
  for (const auto& a : tj["added_tokens"]) d.token_types[a["id"].get<size_t>()] = 3;
  for (const auto& m : tj["model"]["merges"]) d.merges.push_back(m.get<std::string>());
  d.bos_id = 0;
  d.eos_id = 2;
  d.add_bos = GetParam().add_bos;
  auto tok = Tokenizer::FromGguf(d);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  for (const auto& c : testing::ReferenceIds()["tokenizers"][GetParam().reference]["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(testing::EncodeOrDie(**tok, text), c["ids"].get<std::vector<int32_t>>()) << text;
  }
  const std::string text = testing::ReadOrDie(attic::testing::SharedDir() + "/datasets/wikitext2_raw_test/wiki.test.raw");
  EXPECT_TRUE(testing::EncodeOrDie(**tok, text) ==
              testing::EncodeOrDie(testing::ReferenceTokenizer(GetParam().reference), text));
}

INSTANTIATE_TEST_SUITE_P(Pre, Gpt2GgufTest,
                         ::testing::Values(Gpt2Case{"smollm", "smollm2", false},
                                           Gpt2Case{"llama-bpe", "smollm2_llama3_style", true},
                                           Gpt2Case{"qwen2", "smollm2_qwen2_style", false}),
                         [](const auto& info) {
                           std::string n = info.param.pre;
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace attic::tokenizer
