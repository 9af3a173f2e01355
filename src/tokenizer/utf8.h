// UTF-8 helpers shared by the tokenizer: validation, code point decoding and
// encoding, and the length of a sequence from its lead byte.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attic::tokenizer {

// Number of bytes of the sequence that `lead` starts (1 for ASCII and for stray
// continuation / invalid bytes, so that a scan always makes progress).
inline int Utf8SeqLen(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Length of the well-formed sequence at s[pos], or 0 if the bytes there are not a
// complete well-formed sequence (overlong, surrogate, > U+10FFFF, truncated).
int ValidSeqLen(std::string_view s, size_t pos);

// Decodes the code point of a well-formed sequence at s[pos] (REQUIRES: valid).
uint32_t DecodeCodepoint(std::string_view s, size_t pos, int* len);

// Appends the UTF-8 encoding of `cp` (REQUIRES: cp <= 0x10FFFF, not a surrogate).
void AppendUtf8(uint32_t cp, std::string* out);

// Length of the longest prefix of `s` that consists of complete, well-formed
// sequences, treating a trailing *incomplete but so far valid* sequence as pending.
// Sets *invalid_at to the offset of the first malformed byte, or npos if none.
size_t CompleteUtf8Prefix(std::string_view s, size_t* invalid_at);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace attic::tokenizer
