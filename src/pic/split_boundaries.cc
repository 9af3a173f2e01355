#include "pic/split_boundaries.h"

#include <array>

namespace attic::pic {

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// What may stand between a sentence's final mark and the space after it.
constexpr std::array<std::string_view, 10> kClosers = {"\"",     "'",      ")",      "]",      "\u201D",
                                                       "\u2019", "\u00BB", "\u300D", "\u300F", "\uFF09"};
constexpr std::array<std::string_view, 4> kLatinEnds = {".", "!", "?", "\u2026"};
constexpr std::array<std::string_view, 3> kCjkEnds = {"\u3002", "\uFF01", "\uFF1F"};

template <size_t N>
size_t SuffixIn(std::string_view text, const std::array<std::string_view, N>& set) {
  for (std::string_view s : set) {
    if (text.size() >= s.size() && text.substr(text.size() - s.size()) == s) return s.size();
  }
  return 0;
}

template <size_t N>
size_t PrefixIn(std::string_view text, const std::array<std::string_view, N>& set) {
  for (std::string_view s : set) {
    if (text.substr(0, s.size()) == s) return s.size();
  }
  return 0;
}

// Whether text ends with a sentence's final mark, closing quotes or brackets after it
// allowed.
bool EndsSentence(std::string_view text) {
  while (size_t n = SuffixIn(text, kClosers)) text.remove_suffix(n);
  return SuffixIn(text, kLatinEnds) > 0 || SuffixIn(text, kCjkEnds) > 0;
}

}  // namespace

std::vector<Boundary> FindBoundaries(std::string_view text) {
  std::vector<Boundary> out;
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (IsSpace(text[i])) {
      const size_t begin = i;
      int newlines = 0;
      for (; i < n && IsSpace(text[i]); ++i) newlines += text[i] == '\n';
      if (begin == 0 || i == n) continue;
      CutLevel level = CutLevel::kWord;
      if (newlines >= 2) {
        level = CutLevel::kParagraph;
      } else if (newlines == 1) {
        level = CutLevel::kLine;
      } else if (EndsSentence(text.substr(0, begin))) {
        level = CutLevel::kSentence;
      }
      out.push_back({begin, i, level});
    } else if (size_t mark = PrefixIn(text.substr(i), kCjkEnds)) {
      i += mark;
      while (size_t c = PrefixIn(text.substr(i), kClosers)) i += c;
      // Followed by whitespace, the run's own boundary serves.
      if (i < n && !IsSpace(text[i])) out.push_back({i, i, CutLevel::kSentence});
    } else {
      ++i;
    }
  }
  return out;
}

}  // namespace attic::pic
