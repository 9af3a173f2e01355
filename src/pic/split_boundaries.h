// Where KVSplit's semantic method may cut a document, and how good each place is
// (internal to the pic module; split.h documents the rules).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace attic::pic {

// Better boundaries have smaller values.
enum class CutLevel { kParagraph = 0, kLine = 1, kSentence = 2, kWord = 3 };

// A chunk may end at byte `pos` (exclusive) of the document.
struct Cut {
  size_t pos = 0;
  CutLevel level = CutLevel::kWord;
};

// The cuts of `text` in ascending order of pos: the end of every run of ASCII
// whitespace (so the run stays with the text before it), graded by what the run holds
// or follows, and the place right after a CJK sentence end (。！？ and closing brackets)
// that is directly followed by more text. Neither a run at the very beginning nor the
// document's end is listed.
std::vector<Cut> FindCuts(std::string_view text);

inline bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace attic::pic
