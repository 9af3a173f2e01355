#include "attic/store/entry.h"

#include <gtest/gtest.h>

#include <set>

#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::MakeEntry;
using testing::Range;

TEST(KvEntry, RoundTripsThroughBytes) {
  KvEntry e = MakeEntry(Range(5, 37), "s1", "alice", 3, 16);
  e.expires_at_ms = 12345;
  e.positions[3] = 99;
  auto bytes = SerializeEntry(e);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(bytes->size(), e.SerializedBytes());
  auto back = DeserializeEntry(*bytes, "fp-A");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tenant, "alice");
  EXPECT_EQ(back->session_id, "s1");
  EXPECT_EQ(back->expires_at_ms, 12345);
  EXPECT_EQ(back->tokens, e.tokens);
  EXPECT_EQ(back->positions, e.positions);
  EXPECT_EQ(back->k, e.k);
  EXPECT_EQ(back->v, e.v);
  EXPECT_EQ(back->key().ToString(), e.key().ToString());
}

// An entry whose first rows are read in place from an earlier serialized entry (a turn
// extending a stored history) serializes to exactly the bytes of the same entry with all
// rows in its own vectors.
TEST(KvEntry, RowsFromABaseEntrySerializeLikeOwnRows) {
  KvEntry full = MakeEntry(Range(5, 37), "s1", "alice", 3, 16);
  const int n_base = 20;
  KvEntry earlier = full;
  earlier.TruncateTo(n_base + 4);  // the earlier turn held more rows than are reused
  auto earlier_bytes = SerializeEntryBytes(earlier);
  ASSERT_TRUE(earlier_bytes.ok());
  SharedBytes shared(std::move(*earlier_bytes));
  auto h = ParseEntryHeader(*shared);
  ASSERT_TRUE(h.ok());
  KvEntry split = full;
  split.base = EntryRowsBase(shared, *h, n_base);
  for (int l = 0; l < split.n_layers; ++l) {
    split.k[l].erase(split.k[l].begin(), split.k[l].begin() + n_base * split.kv_dim);
    split.v[l].erase(split.v[l].begin(), split.v[l].begin() + n_base * split.kv_dim);
  }
  auto a = SerializeEntry(full);
  auto b = SerializeEntry(split);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(*a == *b);
  // Truncating into the base keeps only base rows.
  split.TruncateTo(10);
  full.TruncateTo(10);
  EXPECT_TRUE(*SerializeEntry(full) == *SerializeEntry(split));
  // Rows claimed from a base that has fewer are refused.
  KvEntry bad = split;
  bad.base.n_rows = static_cast<int>(bad.base.base_tokens) + 1;
  EXPECT_FALSE(ValidateEntry(bad).ok());
}

TEST(KvEntry, LayerDataIsPageAligned) {
  KvEntry e = MakeEntry(Range(0, 10));
  auto h = ParseEntryHeader(*SerializeEntry(e));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->data_offset % 4096, 0u);
  EXPECT_EQ(h->layer_checksums.size(), 2u);
}

TEST(KvEntry, KeyIsSelfDescribingAndDistinct) {
  KvEntry a = MakeEntry(Range(0, 10));
  KvEntry b = a;
  b.tenant = "bob";
  KvEntry c = a;
  c.fingerprint = "fp-B";
  KvEntry d = a;
  d.tokens[9] = 1000;
  KvEntry s = a;
  s.session_id = "x";
  std::set<std::string> keys = {a.key().ToString(), b.key().ToString(), c.key().ToString(), d.key().ToString(),
                                s.key().ToString()};
  EXPECT_EQ(keys.size(), 5u);
  EXPECT_NE(a.key().ToString().find("-f32-"), std::string::npos);
}

TEST(KvEntry, FlippedByteAnywhereIsDataLoss) {
  KvEntry e = MakeEntry(Range(0, 20), "s");
  std::string bytes = *SerializeEntry(e);
  auto h = ParseEntryHeader(bytes);
  ASSERT_TRUE(h.ok());
  // Header fields, the token ids, and data of each layer.
  for (size_t off : {size_t{9}, size_t{40}, size_t{60}, static_cast<size_t>(h->data_offset + 3),
                     static_cast<size_t>(h->data_offset + h->layer_bytes + 100), bytes.size() - 1}) {
    std::string bad = bytes;
    bad[off] ^= 0x10;
    auto r = DeserializeEntry(bad, "fp-A");
    EXPECT_FALSE(r.ok()) << "offset " << off;
  }
}

TEST(KvEntry, TruncatedIsDataLoss) {
  std::string bytes = *SerializeEntry(MakeEntry(Range(0, 20)));
  for (size_t n : {size_t{0}, size_t{7}, size_t{100}, size_t{4096}, bytes.size() - 1}) {
    auto r = DeserializeEntry(std::string_view(bytes).substr(0, n), "fp-A");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << n;
  }
}

TEST(KvEntry, OtherModelIsRejected) {
  std::string bytes = *SerializeEntry(MakeEntry(Range(0, 20), "", "default", 2, 8, "fp-B"));
  auto r = DeserializeEntry(bytes, "fp-A");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(DeserializeEntry(bytes, "fp-B").ok());
}

TEST(KvEntry, ValidateRejectsShapeMismatch) {
  KvEntry e = MakeEntry(Range(0, 4));
  e.k[1].pop_back();
  EXPECT_EQ(SerializeEntry(e).status().code(), StatusCode::kInvalidArgument);
  KvEntry f = MakeEntry(Range(0, 4));
  f.positions.pop_back();
  EXPECT_EQ(SerializeEntry(f).status().code(), StatusCode::kInvalidArgument);
}

TEST(KvEntry, TruncateKeepsLeadingTokens) {
  KvEntry e = MakeEntry(Range(0, 10));
  KvEntry t = e;
  t.TruncateTo(4);
  EXPECT_EQ(t.n_tokens(), 4);
  EXPECT_EQ(t.k[0].size(), 4u * 8);
  EXPECT_TRUE(std::equal(t.k[1].begin(), t.k[1].end(), e.k[1].begin()));
  EXPECT_TRUE(SerializeEntry(t).ok());
}

}  // namespace
}  // namespace attic::store
