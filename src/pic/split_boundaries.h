// Where KVSplit's semantic method may cut a document, and how good each place is
// (internal to the pic module; split.h documents the rules).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace attic::pic {

// Better boundaries have smaller values. kCharacter is no boundary: any place between
// two code points, the fallback for a word longer than a chunk.
enum class CutLevel { kParagraph = 0, kLine = 1, kSentence = 2, kWord = 3, kCharacter = 4 };

// A place where one chunk may end and the next begin: the next chunk may start at any
// byte offset in [begin, end] (both inclusive) of the document. For a whitespace run,
// [begin, end] spans the run, so the run may go to either chunk or be shared, wherever
// the tokenizer puts a token boundary; right after a CJK sentence end, begin == end.
struct Boundary {
  size_t begin = 0;
  size_t end = 0;
  CutLevel level = CutLevel::kWord;
};

// The boundaries of `text` in ascending order (disjoint): every run of ASCII
// whitespace, graded by what the run holds or follows, and the place right after a CJK
// sentence end (。！？ and closing brackets) that is directly followed by more text.
// A run at the very beginning or the very end of the document is not listed (it
// belongs to the first or the last word).
std::vector<Boundary> FindBoundaries(std::string_view text);

inline bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace attic::pic
