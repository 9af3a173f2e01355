// Hash64 (the checksums of KV entries, PQ indexes and registries, and the entry keys)
// and Hasher (model fingerprints) against xxHash's published test vectors: the
// XXH3_64bits_withSeed and XXH3_128bits tables of the xxHash sanity check
// (github.com/Cyan4973/xxHash, cli/xsum_sanity_check.c), on its sanity buffer. One
// vector per length class of the algorithm (0, 1-3, 4-8, 9-16, 17-128, 129-240, one
// block, several blocks), each with seed 0 and a non-zero seed.
#include "attic/core/hash.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace attic {
namespace {

constexpr uint64_t kPrime32 = 2654435761u;
constexpr uint64_t kPrime64 = 11400714785074694797ull;

// xxHash's sanity buffer: byte i is the top byte of PRIME32 * PRIME64^i (mod 2^64).
std::vector<uint8_t> SanityBuffer() {
  std::vector<uint8_t> buf(4096 + 64 + 1);
  uint64_t gen = kPrime32;
  for (uint8_t& b : buf) {
    b = static_cast<uint8_t>(gen >> 56);
    gen *= kPrime64;
  }
  return buf;
}

TEST(Hash64, PublishedXxh3Vectors) {
  struct Vector {
    size_t len;
    uint64_t seed, want;
  };
  const Vector vectors[] = {
      {0, 0, 0x2D06800538D394C2ull},    {0, kPrime64, 0xA8A6B918B2F0364Aull},
      {1, 0, 0xC44BDFF4074EECDBull},    {1, kPrime64, 0x032BE332DD766EF8ull},
      {6, 0, 0x27B56A84CD2D7325ull},    {6, kPrime64, 0x84589C116AB59AB9ull},
      {12, 0, 0xA713DAF0DFBB77E7ull},   {12, kPrime64, 0xE7303E1B2336DE0Eull},
      {24, 0, 0xA3FE70BF9D3510EBull},   {24, kPrime64, 0x850E80FC35BDD690ull},
      {48, 0, 0x397DA259ECBA1F11ull},   {48, kPrime64, 0xADC2CBAA44ACC616ull},
      {80, 0, 0xBCDEFBBB2C47C90Aull},   {80, kPrime64, 0xC6DD0CB699532E73ull},
      {195, 0, 0xCD94217EE362EC3Aull},  {195, kPrime64, 0xBA68003D370CB3D9ull},
      {403, 0, 0xCDEB804D65C6DEA4ull},  {403, kPrime64, 0x6259F6ECFD6443FDull},
      {512, 0, 0x617E49599013CB6Bull},  {512, kPrime64, 0x3CE457DE14C27708ull},
      {2048, 0, 0xDD59E2C3A5F038E0ull}, {2048, kPrime64, 0x66F81670669ABABCull},
      {2240, 0, 0x6E73A90539CF2948ull}, {2240, kPrime64, 0x757BA8487D1B5247ull},
      {2367, 0, 0xCB37AEB9E5D361EDull}, {2367, kPrime64, 0xD2DB3415B942B42Aull},
  };
  const std::vector<uint8_t> buf = SanityBuffer();
  for (const Vector& v : vectors) {
    EXPECT_EQ(Hash64(buf.data(), v.len, v.seed), v.want) << "len " << v.len << " seed " << v.seed;
    if (v.seed == 0) {
      EXPECT_EQ(Hash64(buf.data(), v.len), v.want) << "len " << v.len << " default seed";
    }
  }
  // The string overload hashes the string's bytes.
  EXPECT_EQ(Hash64(std::string_view(reinterpret_cast<const char*>(buf.data()), 403), kPrime64), 0x6259F6ECFD6443FDull);
}

TEST(Hasher, PublishedXxh128Vectors) {
  struct Vector {
    size_t len;
    uint64_t low, high;
  };
  const Vector vectors[] = {  // seed 0
      {0, 0x6001C324468D497Full, 0x99AA06D3014798D8ull},    {1, 0xC44BDFF4074EECDBull, 0xA6CD5E9392000F6Aull},
      {6, 0x3E7039BDDA43CFC6ull, 0x082AFE0B8162D12Aull},    {12, 0x061A192713F69AD9ull, 0x6E3EFD8FC7802B18ull},
      {24, 0x1E7044D28B1B901Dull, 0x0CE966E4678D3761ull},   {48, 0xF942219AED80F67Bull, 0xA002AC4E5478227Eull},
      {81, 0x5E8BAFB9F95FB803ull, 0x4952F58181AB0042ull},   {222, 0xF1AEBD597CEC6B3Aull, 0x337E09641B948717ull},
      {403, 0xCDEB804D65C6DEA4ull, 0x1B6DE21E332DD73Dull},  {512, 0x617E49599013CB6Bull, 0x18D2D110DCC9BCA1ull},
      {2048, 0xDD59E2C3A5F038E0ull, 0xF736557FD47073A5ull}, {2240, 0x6E73A90539CF2948ull, 0xCCB134FBFA7CE49Dull},
      {2367, 0xCB37AEB9E5D361EDull, 0xE89C0F6FF369B427ull},
  };
  const std::vector<uint8_t> buf = SanityBuffer();
  for (const Vector& v : vectors) {
    char want[33];
    std::snprintf(want, sizeof want, "%016llx%016llx", static_cast<unsigned long long>(v.high),
                  static_cast<unsigned long long>(v.low));
    Hasher one;
    one.Update(buf.data(), v.len);
    EXPECT_EQ(one.Hex(), want) << "len " << v.len;
    // Streamed in pieces: the same digest.
    Hasher pieces;
    for (size_t at = 0; at < v.len; at += 100) pieces.Update(buf.data() + at, std::min<size_t>(100, v.len - at));
    EXPECT_EQ(pieces.Hex(), want) << "len " << v.len << " in pieces";
  }
}

}  // namespace
}  // namespace attic
