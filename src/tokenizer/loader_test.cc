// FromJson / FromDirectory details: added-token options, config files, chat template
// forms, BOS/EOS sources.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attic/core/file.h"
#include "attic/tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace attic::tokenizer {
namespace {

using json = nlohmann::json;
using testing::EncodeOrDie;

// A byte-level vocabulary of single bytes a..z, space (Ġ) and a few merges.
json TinyByteLevel() {
  json vocab = json::object();
  int id = 0;
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = id++;
  vocab["\xC4\xA0"] = id++;  // "Ġ" = ' '
  vocab["ab"] = id++;        // 27
  return {{"added_tokens", json::array({{{"id", 100}, {"content", "<sep>"}, {"special", true},
                                         {"lstrip", true}, {"rstrip", true}},
                                        {{"id", 101}, {"content", "ab-cd"}, {"special", false}}})},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b"})}}}};
}

TEST(Loader, AddedTokenOptions) {
  auto tok = Tokenizer::FromJson(TinyByteLevel().dump(), "");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const int32_t sp = 26;  // "Ġ"
  // lstrip/rstrip: <sep> swallows the spaces around it.
  EXPECT_EQ(EncodeOrDie(**tok, "a  <sep>  b"), (std::vector<int32_t>{0, 100, 1}));
  // Without parse_special, <sep> is plain text; a non-special added token still matches.
  EXPECT_EQ(EncodeOrDie(**tok, "x ab-cd", {.parse_special = false}), (std::vector<int32_t>{23, sp, 101}));
  const auto plain = EncodeOrDie(**tok, "a <sep>", {.parse_special = false});
  EXPECT_EQ(plain.size(), 5u);  // a, Ġ, s, e, p: "<" and ">" have no token and no <unk> (dropped, as HF)
  EXPECT_EQ((*tok)->vocab_size(), 102);
  EXPECT_TRUE((*tok)->IsSpecial(100));
  EXPECT_FALSE((*tok)->IsSpecial(101));
  EXPECT_EQ((*tok)->TokenId("<sep>"), 100);
  EXPECT_EQ((*tok)->Decode({0, 100, 101}), "a<sep>ab-cd");
  EXPECT_EQ((*tok)->Decode({0, 100, 101}, /*skip_special=*/true), "aab-cd");
}

TEST(Loader, DirectoryFilesAndChatTemplateForms) {
  attic::testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.File("tokenizer.json"), TinyByteLevel().dump()).ok());
  // List form: the entry named "default" is the chat template.
  json cfg = {{"bos_token", {{"content", "<sep>"}, {"special", true}}},
              {"add_bos_token", true},
              {"eos_token", "<sep>"},
              {"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}},
                                             {{"name", "default"}, {"template", "{{ '<|im_start|>' }}"}}})}};
  ASSERT_TRUE(WriteFileAtomic(dir.File("tokenizer_config.json"), cfg.dump()).ok());
  auto tok = Tokenizer::FromDirectory(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->chat_template(), "{{ '<|im_start|>' }}");
  EXPECT_EQ((*tok)->bos_id(), 100);
  EXPECT_EQ((*tok)->eos_id(), 100);
  EXPECT_TRUE((*tok)->add_bos());
  EXPECT_EQ(EncodeOrDie(**tok, "ab"), (std::vector<int32_t>{100, 27}));

  // String form, and chat_template.jinja as the fallback.
  cfg["chat_template"] = "string form";
  ASSERT_TRUE(WriteFileAtomic(dir.File("tokenizer_config.json"), cfg.dump()).ok());
  ASSERT_TRUE(WriteFileAtomic(dir.File("chat_template.jinja"), "from file").ok());
  EXPECT_EQ((*Tokenizer::FromDirectory(dir.path()))->chat_template(), "string form");
  cfg.erase("chat_template");
  ASSERT_TRUE(WriteFileAtomic(dir.File("tokenizer_config.json"), cfg.dump()).ok());
  EXPECT_EQ((*Tokenizer::FromDirectory(dir.path()))->chat_template(), "from file");

  // A broken tokenizer_config.json is an error naming the file.
  ASSERT_TRUE(WriteFileAtomic(dir.File("tokenizer_config.json"), "{oops").ok());
  auto bad = Tokenizer::FromDirectory(dir.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(Loader, UnsupportedComponentsAreUnimplemented) {
  json tj = TinyByteLevel();
  tj["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_EQ(Tokenizer::FromJson(tj.dump(), "").status().code(), StatusCode::kUnimplemented);
  tj = TinyByteLevel();
  tj["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_EQ(Tokenizer::FromJson(tj.dump(), "").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attic::tokenizer
