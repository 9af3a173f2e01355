#include "tokenizer/utf8.h"

#include "attic/tokenizer/tokenizer.h"

namespace attic::tokenizer {

int ValidSeqLen(std::string_view s, size_t pos) {
  const size_t n = s.size();
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t c = b(pos);
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;  // continuation byte or overlong 2-byte lead
  if (c < 0xE0) {
    if (pos + 1 >= n || (b(pos + 1) & 0xC0) != 0x80) return 0;
    return 2;
  }
  if (c < 0xF0) {
    if (pos + 2 >= n) return 0;
    const uint8_t c1 = b(pos + 1);
    if ((c1 & 0xC0) != 0x80 || (b(pos + 2) & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && c1 < 0xA0) return 0;   // overlong
    if (c == 0xED && c1 >= 0xA0) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (c < 0xF5) {
    if (pos + 3 >= n) return 0;
    const uint8_t c1 = b(pos + 1);
    if ((c1 & 0xC0) != 0x80 || (b(pos + 2) & 0xC0) != 0x80 || (b(pos + 3) & 0xC0) != 0x80) return 0;
    if (c == 0xF0 && c1 < 0x90) return 0;   // overlong
    if (c == 0xF4 && c1 >= 0x90) return 0;  // > U+10FFFF
    return 4;
  }
  return 0;
}

uint32_t DecodeCodepoint(std::string_view s, size_t pos, int* len) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i])); };
  const uint32_t c = b(pos);
  if (c < 0x80) {
    *len = 1;
    return c;
  }
  if (c < 0xE0) {
    *len = 2;
    return ((c & 0x1F) << 6) | (b(pos + 1) & 0x3F);
  }
  if (c < 0xF0) {
    *len = 3;
    return ((c & 0x0F) << 12) | ((b(pos + 1) & 0x3F) << 6) | (b(pos + 2) & 0x3F);
  }
  *len = 4;
  return ((c & 0x07) << 18) | ((b(pos + 1) & 0x3F) << 12) | ((b(pos + 2) & 0x3F) << 6) |
         (b(pos + 3) & 0x3F);
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {
// True if s[pos..] (which runs to the end of s) could still become a well-formed
// sequence once more bytes arrive.
bool IsValidIncompleteTail(std::string_view s, size_t pos) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t c = b(pos);
  const int need = Utf8SeqLen(c);
  if (need == 1 || c < 0xC2 || c >= 0xF5) return false;
  const size_t have = s.size() - pos;
  if (have >= static_cast<size_t>(need)) return false;
  for (size_t i = 1; i < have; ++i) {
    if ((b(pos + i) & 0xC0) != 0x80) return false;
  }
  if (have >= 2) {
    const uint8_t c1 = b(pos + 1);
    if (c == 0xE0 && c1 < 0xA0) return false;
    if (c == 0xED && c1 >= 0xA0) return false;
    if (c == 0xF0 && c1 < 0x90) return false;
    if (c == 0xF4 && c1 >= 0x90) return false;
  }
  return true;
}
}  // namespace

size_t CompleteUtf8Prefix(std::string_view s, size_t* invalid_at) {
  *invalid_at = std::string_view::npos;
  size_t pos = 0;
  while (pos < s.size()) {
    const int len = ValidSeqLen(s, pos);
    if (len > 0) {
      pos += len;
      continue;
    }
    if (!IsValidIncompleteTail(s, pos)) *invalid_at = pos;
    break;
  }
  return pos;
}

bool IsValidUtf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    // Fast path for ASCII runs.
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const int len = ValidSeqLen(s, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

}  // namespace attic::tokenizer
