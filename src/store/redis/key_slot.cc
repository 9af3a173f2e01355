#include "store/redis/key_slot.h"

#include <array>

namespace attic::store::redis {

namespace {
// The table of CRC16-XMODEM (polynomial 0x1021), built at compile time.
constexpr std::array<uint16_t, 256> MakeTable() {
  std::array<uint16_t, 256> t{};
  for (int i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b) crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : static_cast<uint16_t>(crc << 1);
    t[i] = crc;
  }
  return t;
}
constexpr std::array<uint16_t, 256> kTable = MakeTable();
}  // namespace

uint16_t Crc16(std::string_view bytes) {
  uint16_t crc = 0;
  for (unsigned char c : bytes) crc = static_cast<uint16_t>((crc << 8) ^ kTable[((crc >> 8) ^ c) & 0xff]);
  return crc;
}

std::string_view HashedPart(std::string_view key) {
  const size_t open = key.find('{');
  if (open == std::string_view::npos) return key;
  const size_t close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;  // no tag, or "{}": the whole key
  return key.substr(open + 1, close - open - 1);
}

int KeySlot(std::string_view key) { return Crc16(HashedPart(key)) & (kClusterSlots - 1); }

}  // namespace attic::store::redis
