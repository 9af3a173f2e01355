#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace attic::tokenizer {

namespace {

bool ShowsItself(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

struct Tables {
  std::array<uint32_t, 256> to_cp;
  std::array<int16_t, 324> to_byte;  // code points < 324 cover the whole map
  Tables() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_cp[b] = ShowsItself(b) ? static_cast<uint32_t>(b) : next++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;  // immutable after first use (thread-safe init)
  return tables;
}

}  // namespace

uint32_t ByteToCodepoint(uint8_t b) { return GetTables().to_cp[b]; }

bool ByteLevelToBytes(std::string_view text, std::string* out) {
  const Tables& t = GetTables();
  out->clear();
  out->reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    int len = 0;
    const uint32_t cp = DecodeCodepoint(text, pos, &len);
    if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) return false;
    out->push_back(static_cast<char>(t.to_byte[cp]));
    pos += len;
  }
  return true;
}

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(c)), &out);
  return out;
}

}  // namespace attic::tokenizer
