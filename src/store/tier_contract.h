// The tier contract (tier.h) as a value-parameterized suite, TierContract, that every
// tier passes: tier_contract_test.cc instantiates it over the local tiers and MemoryTier,
// store/redis/redis_tier_test.cc over RedisTier on a real cluster. A test binary
// includes this header once and instantiates the suite with its TierCases.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attic/store/entry.h"
#include "attic/store/layer_read.h"
#include "attic/store/memory_tier.h"
#include "attic/store/tier.h"
#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::KeyNamed;
using testing::MakeEntry;
using testing::Range;
using testing::ScratchDir;


std::string Pattern(size_t n, int seed) {
  std::string v(n, '\0');
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 2654435761u + seed * 97) >> 9);
  return v;
}

struct TierCase {
  std::string name;
  // A fresh tier of `capacity` bytes; `dir` is a scratch directory for the ones that need it.
  std::function<std::unique_ptr<Tier>(const std::string& dir, uint64_t capacity)> make;
  // Why the case cannot run here ("" = it can), e.g. no cluster for a remote tier.
  std::function<std::string()> unavailable = nullptr;
};

[[maybe_unused]] MemoryTierOptions Memory(uint64_t capacity, bool evicts_itself) {
  MemoryTierOptions o;
  o.name = evicts_itself ? "remote" : "memory";
  o.capacity = capacity;
  o.traits.shared = evicts_itself;
  o.traits.enumerable = !evicts_itself;
  o.traits.evicts_itself = evicts_itself;
  return o;
}

class TierContract : public ::testing::TestWithParam<TierCase> {
 protected:
  void SetUp() override {
    if (GetParam().unavailable == nullptr) return;
    if (const std::string why = GetParam().unavailable(); !why.empty()) GTEST_SKIP() << why;
  }
  std::unique_ptr<Tier> Make(uint64_t capacity) { return GetParam().make(dir_.path(), capacity); }
  ScratchDir dir_{"contract"};
};

TEST_P(TierContract, PutGetEraseAndBytes) {
  auto tier = Make(1000);
  EXPECT_FALSE(tier->name().empty());
  EXPECT_EQ(tier->bytes(), 0u);
  EXPECT_EQ(tier->Get(KeyNamed("a")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->SizeOf(KeyNamed("a")), -1);
  ASSERT_TRUE(tier->Put(KeyNamed("a"), Pattern(600, 1)).ok());
  EXPECT_TRUE(tier->Contains(KeyNamed("a")));
  EXPECT_EQ(tier->SizeOf(KeyNamed("a")), 600);
  EXPECT_EQ(*tier->Get(KeyNamed("a")), Pattern(600, 1));
  ASSERT_TRUE(tier->Put(KeyNamed("b"), Pattern(400, 2)).ok());
  EXPECT_EQ(tier->bytes(), 1000u);
  // Replacing counts only the difference.
  ASSERT_TRUE(tier->Put(KeyNamed("a"), Pattern(500, 3)).ok());
  EXPECT_EQ(tier->bytes(), 900u);
  EXPECT_EQ(*tier->Get(KeyNamed("a")), Pattern(500, 3));
  ASSERT_TRUE(tier->Erase(KeyNamed("a")).ok());
  ASSERT_TRUE(tier->Erase(KeyNamed("a")).ok());  // absent: OK
  EXPECT_FALSE(tier->Contains(KeyNamed("a")));
  EXPECT_EQ(tier->bytes(), 400u);
  EXPECT_LE(tier->bytes(), tier->capacity());
}

TEST_P(TierContract, CapacityIsAHardBound) {
  auto tier = Make(1000);
  ASSERT_TRUE(tier->Put(KeyNamed("a"), Pattern(600, 1)).ok());
  const Status st = tier->Put(KeyNamed("b"), Pattern(401, 2));
  if (tier->traits().evicts_itself) {
    // It makes its own room: the new value is kept, an old one went.
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(*tier->Get(KeyNamed("b")), Pattern(401, 2));
    EXPECT_FALSE(tier->Contains(KeyNamed("a")));
  } else {
    // Refused; the tier is unchanged.
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
    EXPECT_FALSE(tier->Contains(KeyNamed("b")));
    EXPECT_EQ(*tier->Get(KeyNamed("a")), Pattern(600, 1));
  }
  EXPECT_LE(tier->bytes(), tier->capacity());
  EXPECT_EQ(tier->Put(KeyNamed("c"), Pattern(1001, 3)).code(), StatusCode::kResourceExhausted);  // larger than it all
  EXPECT_LE(tier->bytes(), tier->capacity());
}

TEST_P(TierContract, SharedReadsAndPutSharedHoldTheSameBytes) {
  auto tier = Make(1 << 20);
  const std::string v = Pattern(9000, 4);
  ASSERT_TRUE(tier->PutShared(KeyNamed("s"), SharedBytes(CopyBytes(v))).ok());
  auto shared = tier->GetShared(KeyNamed("s"));
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_TRUE((*shared)->view() == v);
  EXPECT_EQ(*tier->Get(KeyNamed("s")), v);
  EXPECT_EQ(tier->GetShared(KeyNamed("none")).status().code(), StatusCode::kNotFound);
}

TEST_P(TierContract, RangeReadsDeliverExactlyTheRange) {
  auto tier = Make(1 << 20);
  const std::string v = Pattern(3 * 4096 + 777, 5);
  ASSERT_TRUE(tier->Put(KeyNamed("r"), v).ok());
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, v.size()}, {0, 1}, {4096, 4096}, {1, 4095}, {5000, 3000}, {v.size() - 13, 13}, {123, 0}, {v.size(), 0}};
  for (const auto& [off, len] : ranges) {
    auto r = tier->GetRange(KeyNamed("r"), off, len);
    ASSERT_TRUE(r.ok()) << off << "+" << len << ": " << r.status().ToString();
    EXPECT_EQ(r->size, len);
    EXPECT_TRUE(r->view() == std::string_view(v).substr(off, len)) << off << "+" << len;
  }
  EXPECT_EQ(tier->GetRange(KeyNamed("r"), v.size() - 10, 11).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(tier->GetRange(KeyNamed("r"), v.size() + 1, 0).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(tier->GetRange(KeyNamed("none"), 0, 1).status().code(), StatusCode::kNotFound);
  // A range outlives the value it was read from.
  auto r = tier->GetRange(KeyNamed("r"), 100, 50);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(tier->Erase(KeyNamed("r")).ok());
  EXPECT_TRUE(r->view() == std::string_view(v).substr(100, 50));
}

TEST_P(TierContract, KeysListEveryEntryOfAnEnumerableTier) {
  auto tier = Make(1 << 20);
  for (const char* n : {"x", "y", "z"}) ASSERT_TRUE(tier->Put(KeyNamed(n), Pattern(100, 6)).ok());
  ASSERT_TRUE(tier->Erase(KeyNamed("y")).ok());
  if (!tier->traits().enumerable) GTEST_SKIP() << "not enumerable";
  std::vector<std::string> keys = tier->Keys();
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> want = {KeyNamed("x"), KeyNamed("z")};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(keys, want);
}

// An entry read one layer at a time (layer_read.h) through the tier's range reads:
// each layer is the entry's rows, and a damaged layer is DataLoss on its own.
TEST_P(TierContract, EntriesReadLayerByLayer) {
  auto tier = Make(8 << 20);
  // 700 tokens: a header longer than 4096 bytes (the first range read is not enough).
  for (int n_tokens : {32, 700}) {
    KvEntry e = MakeEntry(Range(0, n_tokens), "layers", "default", 3, 8, "fp-A", 7);
    const std::string key = e.key().ToString();
    std::string bytes = *SerializeEntry(e);
    ASSERT_TRUE(tier->Put(key, bytes).ok());
    auto h = ReadEntryHeader(*tier, key, "fp-A");
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->meta.tokens, e.tokens);
    for (int l = 0; l < 3; ++l) {
      auto layer = ReadEntryLayer(*tier, key, *h, l);
      ASSERT_TRUE(layer.ok()) << layer.status().ToString();
      const size_t n = e.k[l].size();
      EXPECT_TRUE(std::equal(layer->k, layer->k + n, e.k[l].begin())) << l;
      EXPECT_TRUE(std::equal(layer->v, layer->v + n, e.v[l].begin())) << l;
    }
    EXPECT_EQ(ReadEntryHeader(*tier, key, "fp-B").status().code(), StatusCode::kFailedPrecondition);
    // Layer 1 damaged in the tier: layers 0 and 2 still read, layer 1 is DataLoss.
    bytes[EntryLayerOffset(*h, 1) + 5] ^= 0x20;
    ASSERT_TRUE(tier->Put(key, bytes).ok());
    EXPECT_TRUE(ReadEntryLayer(*tier, key, *h, 0).ok());
    EXPECT_EQ(ReadEntryLayer(*tier, key, *h, 1).status().code(), StatusCode::kDataLoss);
    EXPECT_TRUE(ReadEntryLayer(*tier, key, *h, 2).ok());
    // Cut short: the last layer is DataLoss, not a caller's range error.
    bytes.resize(EntryLayerOffset(*h, 2) + 10);
    ASSERT_TRUE(tier->Put(key, bytes).ok());
    EXPECT_EQ(ReadEntryLayer(*tier, key, *h, 2).status().code(), StatusCode::kDataLoss);
    ASSERT_TRUE(tier->Erase(key).ok());
  }
}

}  // namespace
}  // namespace attic::store
