#include "tokenizer/text_pipeline.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace attic::tokenizer {
namespace {

std::vector<std::string> Split(const std::string& text, const std::string& pattern, SplitBehavior b,
                               bool invert = false) {
  auto re = Regex::Compile(pattern);
  EXPECT_TRUE(re.ok()) << re.status().ToString();
  PipelineScratch scratch;
  std::vector<std::string> out;
  SplitPiece(text, **re, b, invert, &scratch, [&](std::string_view p, bool) { out.emplace_back(p); });
  return out;
}

using V = std::vector<std::string>;

// The examples of HF tokenizers' SplitDelimiterBehavior documentation.
TEST(SplitPiece, DocumentedBehaviors) {
  const std::string t = "the-final--countdown";
  EXPECT_EQ(Split(t, "-", SplitBehavior::kRemoved), (V{"the", "final", "countdown"}));
  EXPECT_EQ(Split(t, "-", SplitBehavior::kIsolated), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(Split(t, "-", SplitBehavior::kMergedWithPrevious), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(Split(t, "-", SplitBehavior::kMergedWithNext), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(Split(t, "-", SplitBehavior::kContiguous), (V{"the", "-", "final", "--", "countdown"}));
  // invert: the matches are the content, the gaps the delimiters.
  EXPECT_EQ(Split("ab12cd3", R"(\p{L}+)", SplitBehavior::kRemoved, /*invert=*/true), (V{"ab", "cd"}));
}

TEST(SplitPiece, Gpt2PatternOnUnicode) {
  const std::string gpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(Split("Héllo wörld's  日本 42!!\n", gpt2, SplitBehavior::kIsolated),
            (V{"Héllo", " wörld", "'s", " ", " 日本", " 42", "!!", "\n"}));
}

TEST(TextPipeline, MetaspaceAndByteLevelSteps) {
  TextPipeline pipe;
  PreTokenizerStep meta;
  meta.kind = PreTokenizerStep::Kind::kMetaspace;
  meta.prepend = PreTokenizerStep::Prepend::kFirst;
  pipe.pre_tokenizers.push_back(meta);
  PipelineScratch scratch;
  std::vector<std::string> out;
  const PieceSink sink = [&](std::string_view p) { out.emplace_back(p); };
  pipe.Run("a  b", /*at_start=*/true, &scratch, sink);
  EXPECT_EQ(out, (V{"\xE2\x96\x81" "a", "\xE2\x96\x81", "\xE2\x96\x81" "b"}));
  out.clear();
  pipe.Run("a b", /*at_start=*/false, &scratch, sink);  // "first": no prefix after the start
  EXPECT_EQ(out, (V{"a", "\xE2\x96\x81" "b"}));

  TextPipeline bl;
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kByteLevel;
  step.add_prefix_space = true;
  bl.pre_tokenizers.push_back(step);
  out.clear();
  bl.Run("hi there", true, &scratch, sink);
  EXPECT_EQ(out, (V{" hi there"}));
}

}  // namespace
}  // namespace attic::tokenizer
