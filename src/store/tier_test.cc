#include "attic/store/tier.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::ScratchDir;

template <typename MakeTier>
void ExerciseTier(MakeTier make) {
  auto tier = make(100);
  EXPECT_EQ(tier->bytes(), 0u);
  ASSERT_TRUE(tier->Put("a", std::string(60, 'a')).ok());
  EXPECT_TRUE(tier->Contains("a"));
  EXPECT_EQ(tier->SizeOf("a"), 60);
  EXPECT_EQ(tier->Put("b", std::string(41, 'b')).code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(tier->Contains("b"));
  ASSERT_TRUE(tier->Put("b", std::string(40, 'b')).ok());
  EXPECT_EQ(tier->bytes(), 100u);
  // Replacing counts only the difference.
  ASSERT_TRUE(tier->Put("a", std::string(50, 'A')).ok());
  EXPECT_EQ(tier->bytes(), 90u);
  EXPECT_EQ(*tier->Get("a"), std::string(50, 'A'));
  EXPECT_EQ(tier->Get("zz").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(tier->Erase("a").ok());
  ASSERT_TRUE(tier->Erase("a").ok());
  EXPECT_EQ(tier->bytes(), 40u);
  EXPECT_EQ(tier->Keys(), std::vector<std::string>{"b"});
  EXPECT_LE(tier->bytes(), tier->capacity());
}

TEST(DramTier, PutGetEraseWithinCapacity) {
  ExerciseTier([](uint64_t cap) { return std::make_unique<DramTier>(cap); });
}

TEST(SsdTier, PutGetEraseWithinCapacity) {
  ScratchDir dir("tier");
  ExerciseTier([&](uint64_t cap) { return std::move(SsdTier::Open(dir.path(), cap)).value(); });
}

TEST(SsdTier, SurvivesReopenAndDropsInterruptedWrites) {
  ScratchDir dir("reopen");
  {
    auto tier = std::move(SsdTier::Open(dir.path(), 1 << 20)).value();
    ASSERT_TRUE(tier->Put("k1", "hello").ok());
  }
  // A save killed midway leaves only its temporary file behind.
  { std::ofstream(dir.path() + "/k2.kv.tmp") << "partial"; }
  auto tier = std::move(SsdTier::Open(dir.path(), 1 << 20)).value();
  EXPECT_EQ(tier->removed_temp_files(), 1);
  EXPECT_TRUE(tier->Contains("k1"));
  EXPECT_FALSE(tier->Contains("k2"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/k2.kv.tmp"));
  EXPECT_EQ(*tier->Get("k1"), "hello");
  EXPECT_EQ(tier->bytes(), 5u);
}

TEST(SsdTier, LargeValuesUseParallelChunkedIo) {
  ScratchDir dir("large");
  auto tier = std::move(SsdTier::Open(dir.path(), 64 << 20)).value();
  std::string big(20 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 13);
  ASSERT_TRUE(tier->Put("big", big).ok());
  EXPECT_EQ(std::filesystem::file_size(tier->PathOf("big")), big.size());
  auto back = tier->Get("big");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == big);
}

}  // namespace
}  // namespace attic::store
