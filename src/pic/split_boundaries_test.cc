// FindCuts: where the semantic split may end a chunk, and how good each place is.
// Expected offsets are counted by hand from the strings.
#include "pic/split_boundaries.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace attic::pic {
namespace {

std::vector<std::pair<size_t, CutLevel>> Pairs(std::string_view text) {
  std::vector<std::pair<size_t, CutLevel>> out;
  for (const Cut& c : FindCuts(text)) out.emplace_back(c.pos, c.level);
  return out;
}

using P = std::pair<size_t, CutLevel>;

TEST(FindCutsTest, LevelsOfWhitespaceRuns) {
  // "Hi there. " = 10 bytes, "Bye\n" ends at 14, "Line two\n \n" ends at 25, "Last" to 29.
  EXPECT_EQ(Pairs("Hi there. Bye\nLine two\n \nLast"), (std::vector<P>{{3, CutLevel::kWord},
                                                                       {10, CutLevel::kSentence},
                                                                       {14, CutLevel::kLine},
                                                                       {19, CutLevel::kWord},
                                                                       {25, CutLevel::kParagraph}}));
}

TEST(FindCutsTest, RunsAtTheEdgesAreNotCuts) {
  // The leading run belongs to the first word; the trailing one to the document's end.
  EXPECT_EQ(Pairs("\n\n  Hello world  \n\n"), (std::vector<P>{{10, CutLevel::kWord}}));
  EXPECT_TRUE(FindCuts("   ").empty());
  EXPECT_TRUE(FindCuts("").empty());
  EXPECT_TRUE(FindCuts("word").empty());
}

TEST(FindCutsTest, SentenceEnds) {
  // Closing quotes and brackets may follow the mark; "…" (3 bytes) and "?!" count.
  EXPECT_EQ(Pairs("He said \"Hi.\" Then (so!) well… ok?! Yes"), (std::vector<P>{{3, CutLevel::kWord},
                                                                                {8, CutLevel::kWord},
                                                                                {14, CutLevel::kSentence},
                                                                                {19, CutLevel::kWord},
                                                                                {25, CutLevel::kSentence},
                                                                                {33, CutLevel::kSentence},
                                                                                {38, CutLevel::kSentence}}));
  // A period inside a word or a number is no cut at all.
  EXPECT_EQ(Pairs("v1.2 e.g.x"), (std::vector<P>{{5, CutLevel::kWord}}));
}

TEST(FindCutsTest, CjkSentenceEndsNeedNoSpace) {
  // Each CJK character and mark is 3 bytes. "東京です。" = 15, "「はい！」" ends at 30.
  EXPECT_EQ(Pairs("東京です。「はい！」大阪？"),
            (std::vector<P>{{15, CutLevel::kSentence}, {30, CutLevel::kSentence}}));
  // Followed by a space, the space's run is the cut (once).
  EXPECT_EQ(Pairs("東京です。 大阪"), (std::vector<P>{{16, CutLevel::kSentence}}));
  // A comma is no sentence end.
  EXPECT_TRUE(FindCuts("東京、大阪").empty());
}

TEST(FindCutsTest, CrLfAndTabs) {
  // "a\r\n" -> 3 (line), "b\r\n\r\n" -> 8 (paragraph), "c\t" -> 10 (word).
  EXPECT_EQ(Pairs("a\r\nb\r\n\r\nc\td"),
            (std::vector<P>{{3, CutLevel::kLine}, {8, CutLevel::kParagraph}, {10, CutLevel::kWord}}));
}

}  // namespace
}  // namespace attic::pic
