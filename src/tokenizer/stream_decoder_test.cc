#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attic/tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace attic::tokenizer {
namespace {

using testing::EncodeOrDie;
using testing::Smol;
using testing::Stories;

constexpr char kFffd[] = "\xEF\xBF\xBD";

int32_t ByteToken(uint8_t b) { return 3 + b; }  // stories260K: <0x00> is id 3

std::string StreamAll(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special = true) {
  StreamDecoder dec(tok, skip_special);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = dec.Push(id);
    EXPECT_TRUE(IsValidUtf8(piece));
    out += piece;
  }
  return out + dec.Flush();
}

TEST(StreamDecoder, EmojiSplitAcrossByteTokens) {
  // "🦙" is not in stories260K's vocabulary: it becomes four <0xNN> tokens.
  const std::vector<int32_t> ids = EncodeOrDie(Stories(), "a 🦙!");
  StreamDecoder dec(Stories());
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(dec.Push(id));
  std::string joined;
  for (const auto& p : pieces) joined += p;
  EXPECT_EQ(joined + dec.Flush(), "a 🦙!");
  // The emoji appears exactly once, whole, in a single Push.
  int whole = 0;
  for (const auto& p : pieces) whole += p.find("🦙") != std::string::npos;
  EXPECT_EQ(whole, 1);
}

TEST(StreamDecoder, DropsLeadingSpaceOfFirstSentencePiece) {
  const std::vector<int32_t> ids = EncodeOrDie(Stories(), "Once upon a time");
  ASSERT_EQ(ids[0], 1);  // BOS, skipped
  StreamDecoder dec(Stories());
  EXPECT_EQ(dec.Push(ids[0]), "");
  EXPECT_EQ(dec.Push(ids[1]), "Once");
  EXPECT_EQ(dec.Push(ids[2]), " upon");
  // Not skipping specials: BOS is shown and the space after it stays, like Decode.
  EXPECT_EQ(StreamAll(Stories(), ids, /*skip_special=*/false), "<s> Once upon a time");
  // Byte-level tokenizers keep a leading space.
  EXPECT_EQ(StreamAll(Smol(), EncodeOrDie(Smol(), " hello")), " hello");
}

TEST(StreamDecoder, InvalidAndIncompleteBytesBecomeReplacementChars) {
  StreamDecoder dec(Stories());
  EXPECT_EQ(dec.Push(ByteToken(0xF0)), "");
  EXPECT_EQ(dec.Push(ByteToken(0x9F)), "");
  EXPECT_EQ(dec.Flush(), kFffd);  // incomplete at the end
  StreamDecoder dec2(Stories());
  EXPECT_EQ(dec2.Push(ByteToken(0xFF)), kFffd);  // can never start a character
  EXPECT_EQ(dec2.Push(ByteToken(0xE2)), "");
  EXPECT_EQ(dec2.Push(ByteToken(0x41)), std::string(kFffd) + "A");  // cut short by 'A'
  EXPECT_EQ(dec2.Flush(), "");
}

TEST(StreamDecoder, MatchesDecodeOnRealText) {
  const std::string text =
      testing::ReadOrDie(attic::testing::SharedDir() + "/datasets/sharegpt_multiturn_sample/sharegpt_test.json");
  for (const Tokenizer* tok : {&Stories(), &Smol()}) {
    const std::vector<int32_t> ids = EncodeOrDie(*tok, text, {.parse_special = false});
    EXPECT_TRUE(StreamAll(*tok, ids) == text);
  }
  for (const std::string s : {"日本語", "Emoji: 😀🎉👍🏽 👨‍👩‍👧", "Café", "  spaced  "}) {
    EXPECT_EQ(StreamAll(Stories(), EncodeOrDie(Stories(), s)), s);
    EXPECT_EQ(StreamAll(Smol(), EncodeOrDie(Smol(), s)), s);
  }
}

TEST(Utf8, IsValidUtf8) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("é 日本 😀 \xF4\x8F\xBF\xBF"));  // U+10FFFF is the last valid
  EXPECT_TRUE(IsValidUtf8(std::string("nul\0inside", 10)));
  EXPECT_FALSE(IsValidUtf8("\x80"));              // lone continuation
  EXPECT_FALSE(IsValidUtf8("\xC3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));          // overlong NUL
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\xAF"));      // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xF0\x80\x80\xAF"));  // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // U+D800 surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // U+110000
  EXPECT_FALSE(IsValidUtf8("\xF8\x88\x80\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("\xFF"));
  EXPECT_FALSE(IsValidUtf8("abc\xE2\x82"));
}

}  // namespace
}  // namespace attic::tokenizer
