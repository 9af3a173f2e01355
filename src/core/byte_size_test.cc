#include "attic/core/byte_size.h"

#include <gtest/gtest.h>

namespace attic {
namespace {

TEST(ByteSizeTest, ReadsUnitsAsPowersOf1024) {
  EXPECT_EQ(*ParseByteSize("1048576"), 1048576u);
  EXPECT_EQ(*ParseByteSize("512M"), 512ull * 1024 * 1024);
  EXPECT_EQ(*ParseByteSize("512m"), 512ull * 1024 * 1024);
  EXPECT_EQ(*ParseByteSize("16G"), 16ull << 30);
  EXPECT_EQ(*ParseByteSize("4GiB"), 4ull << 30);
  EXPECT_EQ(*ParseByteSize("4GB"), 4ull << 30);
  EXPECT_EQ(*ParseByteSize("1.5G"), 1536ull << 20);
  EXPECT_EQ(*ParseByteSize("2T"), 2ull << 40);
  EXPECT_EQ(*ParseByteSize("64K"), 65536u);
  EXPECT_EQ(*ParseByteSize("100B"), 100u);
  EXPECT_EQ(*ParseByteSize("0"), 0u);
}

TEST(ByteSizeTest, ABareNumberCountsTheOldSpellingsUnit) {
  EXPECT_EQ(*ParseByteSize("512", 1 << 20), 512ull << 20);  // --kv-budget-mib 512
  EXPECT_EQ(*ParseByteSize("1G", 1 << 20), 1ull << 30);     // a unit still wins
}

TEST(ByteSizeTest, RejectsWhatIsNotASize) {
  for (const char* bad : {"", "G", "-1", "1.2.3", "12X", "12GiBs", "0.5", "1e9", "99999999999T", " 5"}) {
    auto r = ParseByteSize(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_NE(r.status().message().find("invalid size"), std::string::npos) << r.status().message();
  }
}

TEST(ByteSizeTest, FormatsTheShortestExactSpelling) {
  EXPECT_EQ(FormatByteSize(16ull << 30), "16G");
  EXPECT_EQ(FormatByteSize(512ull << 20), "512M");
  EXPECT_EQ(FormatByteSize(1536ull << 10), "1536K");
  EXPECT_EQ(FormatByteSize(1000), "1000");
  EXPECT_EQ(FormatByteSize(0), "0");
  for (uint64_t v : {1ull, 4096ull, 3ull << 30, 1536ull << 20}) EXPECT_EQ(*ParseByteSize(FormatByteSize(v)), v);
}

}  // namespace
}  // namespace attic
