#include "attic/store/entry.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "attic/tensor/dtype.h"

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

// Turns that each extend the previous turn's save while it is still queued: every
// entry's first rows are an unserialized entry's, whose first rows are a serialized
// entry's. The chain reads and serializes exactly like one entry holding every row.
TEST(KvEntry, RowsFromAChainOfUnserializedEntriesSerializeLikeOwnRows) {
  const int kv_dim = 16;
  KvEntry full = MakeEntry(Range(5, 45), "s1", "alice", 3, kv_dim);
  // Own rows [from, to) of `full` as an entry's k/v.
  auto own = [&](KvEntry& e, int from, int to) {
    for (int l = 0; l < e.n_layers; ++l) {
      e.k[l].assign(full.k[l].begin() + from * kv_dim, full.k[l].begin() + to * kv_dim);
      e.v[l].assign(full.v[l].begin() + from * kv_dim, full.v[l].begin() + to * kv_dim);
    }
  };
  KvEntry stored = full;
  stored.TruncateTo(12);  // serialized: rows [0, 12)
  SharedBytes bytes(std::move(*SerializeEntryBytes(stored)));
  auto h = ParseEntryHeader(*bytes);
  ASSERT_TRUE(h.ok());

  auto turn2 = std::make_shared<KvEntry>(full);  // rows [0, 10) from the stored entry, own [10, 25)
  turn2->TruncateTo(25);
  turn2->base = EntryRowsBase(bytes, *h, 10);
  own(*turn2, 10, 25);
  auto turn3 = std::make_shared<KvEntry>(full);  // rows [0, 22) from turn 2, own [22, 33)
  turn3->TruncateTo(33);
  turn3->base.entry = turn2;
  turn3->base.n_rows = 22;
  own(*turn3, 22, 33);
  KvEntry turn4 = full;  // rows [0, 30) from turn 3, own [30, 45)
  turn4.base.entry = turn3;
  turn4.base.n_rows = 30;
  own(turn4, 30, 45);

  EXPECT_EQ(turn4.base.unserialized_depth(), 2);
  ASSERT_TRUE(ValidateEntry(turn4).ok()) << ValidateEntry(turn4).ToString();
  for (int l = 0; l < full.n_layers; ++l)
    for (int row = 0; row < full.n_tokens(); ++row) {
      ASSERT_EQ(std::vector<float>(turn4.k_row(l, row), turn4.k_row(l, row) + kv_dim),
                std::vector<float>(full.k[l].begin() + row * kv_dim, full.k[l].begin() + (row + 1) * kv_dim))
          << "layer " << l << " row " << row;
      ASSERT_EQ(std::vector<float>(turn4.v_row(l, row), turn4.v_row(l, row) + kv_dim),
                std::vector<float>(full.v[l].begin() + row * kv_dim, full.v[l].begin() + (row + 1) * kv_dim))
          << "layer " << l << " row " << row;
    }
  EXPECT_TRUE(*SerializeEntry(full) == *SerializeEntry(turn4));
  // Truncating into the chain keeps only the rows it holds.
  turn4.TruncateTo(17);
  full.TruncateTo(17);
  EXPECT_TRUE(*SerializeEntry(full) == *SerializeEntry(turn4));
  // A base claiming more rows than its entry holds is refused.
  KvEntry bad = turn4;
  bad.base.n_rows = 34;
  bad.tokens = Range(5, 40);
  bad.positions = Range(0, 40);
  for (int l = 0; l < bad.n_layers; ++l) {
    bad.k[l].resize(6 * kv_dim);
    bad.v[l].resize(6 * kv_dim);
  }
  EXPECT_FALSE(ValidateEntry(bad).ok());
}

// The f32 entry `e` as an f16 entry: each element rounded to the nearest half (the
// scalar reference conversion), f32 rows dropped.
KvEntry AsF16(const KvEntry& e) {
  KvEntry h = e;
  h.dtype = KvDtype::kF16;
  h.k.clear();
  h.v.clear();
  h.k16.resize(e.n_layers);
  h.v16.resize(e.n_layers);
  for (int l = 0; l < e.n_layers; ++l)
    for (size_t i = 0; i < e.k[l].size(); ++i) {
      h.k16[l].push_back(F32ToF16(e.k[l][i]));
      h.v16[l].push_back(F32ToF16(e.v[l][i]));
    }
  return h;
}

// An f16 entry: per layer K [n, kv_dim] then V [n, kv_dim] of 2-byte halves, read back
// with the same bits, in half the bytes of the f32 entry's layers; its key names f16.
TEST(KvEntry, F16EntryRoundTripsBitForBitInHalfTheLayerBytes) {
  const int n = 37, kv_dim = 16, n_layers = 3;
  KvEntry e32 = MakeEntry(Range(5, n), "s1", "alice", n_layers, kv_dim);
  KvEntry e16 = AsF16(e32);
  auto b32 = SerializeEntry(e32);
  auto b16 = SerializeEntry(e16);
  ASSERT_TRUE(b32.ok());
  ASSERT_TRUE(b16.ok()) << b16.status().ToString();
  EXPECT_EQ(b16->size(), e16.SerializedBytes());
  auto h32 = ParseEntryHeader(*b32);
  auto h16 = ParseEntryHeader(*b16);
  ASSERT_TRUE(h32.ok());
  ASSERT_TRUE(h16.ok());
  EXPECT_EQ(h16->meta.dtype, KvDtype::kF16);
  EXPECT_EQ(h32->layer_bytes, 2u * n * kv_dim * 4);
  EXPECT_EQ(h16->layer_bytes, 2u * n * kv_dim * 2);
  EXPECT_EQ(h16->data_offset, h32->data_offset);  // same header layout
  EXPECT_EQ(b16->size() - h16->data_offset, (b32->size() - h32->data_offset) / 2);
  // The layout: layer l's K rows, then its V rows, as IEEE half bits.
  for (int l = 0; l < n_layers; ++l) {
    const char* layer = b16->data() + h16->data_offset + l * h16->layer_bytes;
    EXPECT_EQ(std::memcmp(layer, e16.k16[l].data(), n * kv_dim * 2), 0) << l;
    EXPECT_EQ(std::memcmp(layer + n * kv_dim * 2, e16.v16[l].data(), n * kv_dim * 2), 0) << l;
  }
  auto back = DeserializeEntry(*b16, "fp-A");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->dtype, KvDtype::kF16);
  EXPECT_EQ(back->k16, e16.k16);
  EXPECT_EQ(back->v16, e16.v16);
  EXPECT_TRUE(back->k.empty());
  EXPECT_EQ(back->tokens, e32.tokens);
  // Re-serialized: the same bytes.
  EXPECT_TRUE(*SerializeEntry(*back) == *b16);
  // The key names the dtype: f16 and f32 entries of the same tokens are distinct.
  const std::string k16 = e16.key().ToString(), k32 = e32.key().ToString();
  EXPECT_NE(k16.find("-f16-"), std::string::npos);
  EXPECT_NE(k16, k32);
  EXPECT_TRUE(ParseEntryKeyName(k16));
  EXPECT_TRUE(EntryKeyHasDtype(k16, KvDtype::kF16));
  EXPECT_FALSE(EntryKeyHasDtype(k16, KvDtype::kF32));
  EXPECT_TRUE(EntryKeyHasDtype(k32, KvDtype::kF32));
  // A flipped data byte is caught by the layer checksum.
  std::string bad = *b16;
  bad[h16->data_offset + h16->layer_bytes + 7] ^= 0x10;
  EXPECT_EQ(DeserializeEntry(bad, "fp-A").status().code(), StatusCode::kDataLoss);
}

// An f16 entry's rows from a serialized f16 base and from an unserialized f16 entry
// read and serialize like the same entry holding every row itself.
TEST(KvEntry, F16RowsFromBasesSerializeLikeOwnRows) {
  const int kv_dim = 16;
  KvEntry full = AsF16(MakeEntry(Range(5, 45), "s1", "alice", 3, kv_dim));
  auto own = [&](KvEntry& e, int from, int to) {
    for (int l = 0; l < e.n_layers; ++l) {
      e.k16[l].assign(full.k16[l].begin() + from * kv_dim, full.k16[l].begin() + to * kv_dim);
      e.v16[l].assign(full.v16[l].begin() + from * kv_dim, full.v16[l].begin() + to * kv_dim);
    }
  };
  KvEntry stored = full;
  stored.TruncateTo(12);
  SharedBytes bytes(std::move(*SerializeEntryBytes(stored)));
  auto h = ParseEntryHeader(*bytes);
  ASSERT_TRUE(h.ok());
  auto turn2 = std::make_shared<KvEntry>(full);  // [0, 10) from the stored entry
  turn2->TruncateTo(25);
  turn2->base = EntryRowsBase(bytes, *h, 10);
  own(*turn2, 10, 25);
  KvEntry turn3 = full;  // [0, 22) from turn 2 (not serialized)
  turn3.base.entry = turn2;
  turn3.base.n_rows = 22;
  own(turn3, 22, 45);
  ASSERT_TRUE(ValidateEntry(turn3).ok()) << ValidateEntry(turn3).ToString();
  for (int l = 0; l < full.n_layers; ++l)
    for (int row = 0; row < full.n_tokens(); ++row) {
      ASSERT_EQ(std::memcmp(turn3.k_row_bytes(l, row), full.k16[l].data() + row * kv_dim, kv_dim * 2), 0) << row;
      ASSERT_EQ(std::memcmp(turn3.v_row_bytes(l, row), full.v16[l].data() + row * kv_dim, kv_dim * 2), 0) << row;
    }
  EXPECT_TRUE(*SerializeEntry(full) == *SerializeEntry(turn3));
  turn3.TruncateTo(17);
  full.TruncateTo(17);
  EXPECT_TRUE(*SerializeEntry(full) == *SerializeEntry(turn3));
  // Rows of the wrong dtype, or a base of the other dtype, are refused.
  KvEntry mixed = full;
  mixed.k = MakeEntry(Range(5, 17), "s1", "alice", 3, kv_dim).k;
  EXPECT_EQ(ValidateEntry(mixed).code(), StatusCode::kInvalidArgument);
  KvEntry f32 = MakeEntry(Range(5, 17), "s1", "alice", 3, kv_dim);
  f32.base = EntryRowsBase(bytes, *h, 10);
  for (int l = 0; l < 3; ++l) {
    f32.k[l].erase(f32.k[l].begin(), f32.k[l].begin() + 10 * kv_dim);
    f32.v[l].erase(f32.v[l].begin(), f32.v[l].begin() + 10 * kv_dim);
  }
  EXPECT_EQ(ValidateEntry(f32).code(), StatusCode::kInvalidArgument);
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
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << "offset " << off;
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
