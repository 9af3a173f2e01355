// FindBoundaries: where the semantic split may end a chunk, and how good each place is.
// Expected offsets are counted by hand from the strings.
#include "pic/split_boundaries.h"

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

namespace attic::pic {
namespace {

// [begin, end] and level of each boundary.
struct B {
  size_t begin;
  size_t end;
  CutLevel level;
  bool operator==(const B& o) const { return begin == o.begin && end == o.end && level == o.level; }
};

void PrintTo(const B& b, std::ostream* os) {
  *os << "{" << b.begin << ", " << b.end << ", " << static_cast<int>(b.level) << "}";
}

std::vector<B> Bounds(std::string_view text) {
  std::vector<B> out;
  for (const Boundary& b : FindBoundaries(text)) out.push_back({b.begin, b.end, b.level});
  return out;
}

TEST(FindBoundariesTest, LevelsOfWhitespaceRuns) {
  // "Hi" 0-1, " " 2, "there." 3-8, " " 9, "Bye" 10-12, "\n" 13, "Line" 14-17, " " 18,
  // "two" 19-21, "\n \n" 22-24, "Last" 25-28.
  EXPECT_EQ(Bounds("Hi there. Bye\nLine two\n \nLast"), (std::vector<B>{{2, 3, CutLevel::kWord},
                                                                       {9, 10, CutLevel::kSentence},
                                                                       {13, 14, CutLevel::kLine},
                                                                       {18, 19, CutLevel::kWord},
                                                                       {22, 25, CutLevel::kParagraph}}));
}

TEST(FindBoundariesTest, RunsAtTheEdgesAreNotBoundaries) {
  // The leading run belongs to the first word; the trailing one to the last.
  EXPECT_EQ(Bounds("\n\n  Hello world  \n\n"), (std::vector<B>{{9, 10, CutLevel::kWord}}));
  EXPECT_TRUE(FindBoundaries("   ").empty());
  EXPECT_TRUE(FindBoundaries("").empty());
  EXPECT_TRUE(FindBoundaries("word").empty());
}

TEST(FindBoundariesTest, SentenceEnds) {
  // Closing quotes and brackets may follow the mark; "…" (3 bytes) and "?!" count.
  // "He" 0-1, "said" 3-6, "\"Hi.\"" 8-12, "Then" 14-17, "(so!)" 19-23, "well…" 25-31,
  // "ok?!" 33-36, "Yes" 38-40; one space between each.
  EXPECT_EQ(Bounds("He said \"Hi.\" Then (so!) well… ok?! Yes"), (std::vector<B>{{2, 3, CutLevel::kWord},
                                                                                 {7, 8, CutLevel::kWord},
                                                                                 {13, 14, CutLevel::kSentence},
                                                                                 {18, 19, CutLevel::kWord},
                                                                                 {24, 25, CutLevel::kSentence},
                                                                                 {32, 33, CutLevel::kSentence},
                                                                                 {37, 38, CutLevel::kSentence}}));
  // A period inside a word or a number is no boundary at all.
  EXPECT_EQ(Bounds("v1.2 e.g.x"), (std::vector<B>{{4, 5, CutLevel::kWord}}));
}

TEST(FindBoundariesTest, CjkSentenceEndsNeedNoSpace) {
  // Each CJK character and mark is 3 bytes. "東京です。" = 15, "「はい！」" ends at 30.
  EXPECT_EQ(Bounds("東京です。「はい！」大阪？"),
            (std::vector<B>{{15, 15, CutLevel::kSentence}, {30, 30, CutLevel::kSentence}}));
  // Followed by a space, the space's run is the boundary (once).
  EXPECT_EQ(Bounds("東京です。 大阪"), (std::vector<B>{{15, 16, CutLevel::kSentence}}));
  // A comma is no sentence end.
  EXPECT_TRUE(FindBoundaries("東京、大阪").empty());
}

TEST(FindBoundariesTest, CrLfAndTabs) {
  // "a" 0, "\r\n" 1-2 (line), "b" 3, "\r\n\r\n" 4-7 (paragraph), "c" 8, "\t" 9 (word).
  EXPECT_EQ(Bounds("a\r\nb\r\n\r\nc\td"),
            (std::vector<B>{{1, 3, CutLevel::kLine}, {4, 8, CutLevel::kParagraph}, {9, 10, CutLevel::kWord}}));
}

}  // namespace
}  // namespace attic::pic
