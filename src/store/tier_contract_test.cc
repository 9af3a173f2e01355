// The tier contract (tier_contract.h) over the DRAM tier, the SSD tier, and MemoryTier
// (the in-memory stand-in for a remote tier), also self-evicting; the traits and errors
// of the local tiers and MemoryTier's faults.
#include "store/tier_contract.h"

namespace attic::store {
namespace {

INSTANTIATE_TEST_SUITE_P(
    Tiers, TierContract,
    ::testing::Values(
        TierCase{"dram", [](const std::string&, uint64_t cap) { return std::make_unique<DramTier>(cap); }},
        TierCase{"ssd",
                 [](const std::string& dir, uint64_t cap) -> std::unique_ptr<Tier> {
                   return std::move(SsdTier::Open(dir, "fp-A", cap)).value();
                 }},
        TierCase{"memory",
                 [](const std::string&, uint64_t cap) { return std::make_unique<MemoryTier>(Memory(cap, false)); }},
        TierCase{"self_evicting",
                 [](const std::string&, uint64_t cap) { return std::make_unique<MemoryTier>(Memory(cap, true)); }}),
    [](const ::testing::TestParamInfo<TierCase>& info) { return info.param.name; });

TEST(TierTraits, TheLocalTiersSayWhatTheyAre) {
  DramTier dram(10);
  EXPECT_EQ(dram.name(), "dram");
  EXPECT_TRUE(dram.traits().local_memory);
  EXPECT_FALSE(dram.traits().shared);
  EXPECT_TRUE(dram.traits().enumerable);
  EXPECT_FALSE(dram.traits().evicts_itself);
  EXPECT_EQ(DramTier(10, TierLevel::kSsd).name(), "ssd");  // the policy bench's stand-in
  ScratchDir dir("traits");
  auto ssd = std::move(SsdTier::Open(dir.path(), "fp-A", 10)).value();
  EXPECT_EQ(ssd->name(), "ssd");
  EXPECT_FALSE(ssd->traits().local_memory);
  EXPECT_TRUE(ssd->traits().enumerable);
  EXPECT_FALSE(ssd->traits().evicts_itself);
  EXPECT_EQ(TierName(TierLevel::kDram), "dram");
  EXPECT_EQ(TierName(TierLevel::kSsd), "ssd");
  EXPECT_EQ(TierName(TierAt(2)), "tier2");
}

TEST(TierErrors, OnlyBadBytesAreCorruptAndOnlyNotFoundIsGone) {
  EXPECT_EQ(ClassifyReadError(NotFoundError("x")), ReadError::kVanished);
  EXPECT_EQ(ClassifyReadError(DataLossError("x")), ReadError::kCorrupt);
  EXPECT_EQ(ClassifyReadError(FailedPreconditionError("x")), ReadError::kCorrupt);
  for (const Status& s : {UnavailableError("x"), Status(StatusCode::kDeadlineExceeded, "x"),
                          ResourceExhaustedError("x"), InternalError("x"), CancelledError("x")})
    EXPECT_EQ(ClassifyReadError(s), ReadError::kTransient) << s.ToString();
}

TEST(MemoryTier, InjectedFaultsAreWhatTheySay) {
  MemoryTier tier(Memory(1000, false));
  ASSERT_TRUE(tier.Put(KeyNamed("a"), Pattern(100, 1)).ok());
  tier.FailNextReads(2, Status(StatusCode::kDeadlineExceeded, "timeout"));
  EXPECT_EQ(tier.Get(KeyNamed("a")).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(tier.GetRange(KeyNamed("a"), 0, 10).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*tier.Get(KeyNamed("a")), Pattern(100, 1));  // the value was never touched
  tier.FailNextPuts(1, UnavailableError("down"));
  EXPECT_EQ(tier.Put(KeyNamed("a"), Pattern(50, 2)).code(), StatusCode::kUnavailable);
  EXPECT_EQ(*tier.Get(KeyNamed("a")), Pattern(100, 1));
  tier.Corrupt(KeyNamed("a"), 3);
  std::string want = Pattern(100, 1);
  want[3] ^= 0x01;
  EXPECT_EQ(*tier.Get(KeyNamed("a")), want);
  tier.Vanish(KeyNamed("a"));
  EXPECT_EQ(tier.Get(KeyNamed("a")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier.bytes(), 0u);
}

}  // namespace
}  // namespace attic::store
