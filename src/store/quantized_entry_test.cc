// Quantized entries, q8_0, q4_0 and q8_0/q4_0 (K in q8_0, V in q4_0) (entry.h): bytes, rows shared from a base,
// truncation, the key, and what the store does with bad ones -- a corrupt scale (NaN,
// Inf; negative for q8_0: written so by a faulty writer, or damaged on disk), a truncated
// block, a flipped byte -- found on a restart over the SSD directory: the entry is a miss
// (counted as corrupt), never served, never a crash. Also the identity rule across
// restarts (docs/store.md "Which type is stored"): a store of another type never serves
// it. q4_0 rows are checked against the GGUF q4_0 blocks (tensor/quants.h, whose quantizer
// is checked against llama.cpp's own).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "attic/attention/kv_q8.h"
#include "attic/attention/rope.h"
#include "attic/backend/thread_pool.h"
#include "attic/kv/block_pool.h"
#include "attic/store/kv_store.h"
#include "attic/store/tier.h"
#include "attic/tensor/dtype.h"
#include "attic/tensor/quants.h"
#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::MakeEntry;
using testing::Range;
using testing::ScratchDir;

constexpr int kLayers = 2, kKvDim = 16, kGroup = 8;  // stories260K's grouping: head_dim 8

// The type of an entry type's K rows (v = false) or V rows, as entry.h defines the types
// (written out here, not taken from KvTensorDtype).
KvDtype RowType(KvDtype dtype, bool v) {
  if (dtype == KvDtype::kQ8_0Q4_0) return v ? KvDtype::kQ4_0 : KvDtype::kQ8_0;
  return dtype;
}

// Bytes of a row of kKvDim values of a row type: 16 int8 values (q8_0) or 16 4-bit codes
// in 8 bytes (q4_0), + 2 f16 scales: 20 or 12 bytes.
size_t RowSize(KvDtype row_type) { return row_type == KvDtype::kQ8_0 ? 20 : 12; }

// MakeEntry's f32 rows quantized: an entry of `tokens` of type `dtype` (q8_0, q4_0,
// q8_0/q4_0), each tensor's rows quantized in its row type.
KvEntry MakeQuantized(KvDtype dtype, const std::vector<int32_t>& tokens, const std::string& session) {
  KvEntry e = MakeEntry(tokens, session, "default", kLayers, kKvDim);
  if (dtype == KvDtype::kKivi4) {  // K f32 until serialized (kivi4_entry_test.cc), V q4_0
    e.dtype = dtype;
    e.group = kGroup;
    e.vq.assign(kLayers, std::vector<uint8_t>(tokens.size() * RowSize(KvDtype::kQ4_0)));
    for (int l = 0; l < kLayers; ++l)
      for (size_t r = 0; r < tokens.size(); ++r)
        QuantizeRow(KvDtype::kQ4_0, e.v[l].data() + r * kKvDim, kKvDim, kGroup,
                    e.vq[l].data() + r * RowSize(KvDtype::kQ4_0));
    e.v.clear();
    return e;
  }
  const size_t krow = RowSize(RowType(dtype, false)), vrow = RowSize(RowType(dtype, true));
  e.dtype = dtype;
  e.group = kGroup;
  e.kq.assign(kLayers, std::vector<uint8_t>(tokens.size() * krow));
  e.vq.assign(kLayers, std::vector<uint8_t>(tokens.size() * vrow));
  for (int l = 0; l < kLayers; ++l)
    for (size_t r = 0; r < tokens.size(); ++r) {
      QuantizeRow(RowType(dtype, false), e.k[l].data() + r * kKvDim, kKvDim, kGroup, e.kq[l].data() + r * krow);
      QuantizeRow(RowType(dtype, true), e.v[l].data() + r * kKvDim, kKvDim, kGroup, e.vq[l].data() + r * vrow);
    }
  e.k.clear();
  e.v.clear();
  return e;
}

// Where a row's first scale lies: after kv_dim int8 values (q8_0) or kv_dim / 2 bytes of
// 4-bit codes (q4_0), as entry.h's layout says. `row_type`: q8_0 or q4_0.
size_t ScalesAt(KvDtype row_type) { return row_type == KvDtype::kQ4_0 ? kKvDim / 2 : kKvDim; }

class QuantizedEntry : public ::testing::TestWithParam<KvDtype> {};

// "q8_0", "q4_0", "q8_0_q4_0" (a test name takes letters, digits and '_').
std::string TypeName(const ::testing::TestParamInfo<KvDtype>& info) {
  std::string name = KvDtypeKeyName(info.param);
  std::replace(name.begin(), name.end(), '+', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizedEntry,
                         ::testing::Values(KvDtype::kQ8_0, KvDtype::kQ4_0, KvDtype::kQ8_0Q4_0), TypeName);

TEST_P(QuantizedEntry, BytesKeyAndRoundTrip) {
  const KvDtype dtype = GetParam();
  const KvEntry e = MakeQuantized(dtype, Range(1, 20), "s");
  // K and V rows of the entry's row types; the header fits in 4096.
  const size_t krow = RowSize(RowType(dtype, false)), vrow = RowSize(RowType(dtype, true));
  EXPECT_EQ(e.k_row_size(), krow);
  EXPECT_EQ(e.v_row_size(), vrow);
  EXPECT_EQ(e.SerializedBytes(), 4096u + kLayers * 20 * (krow + vrow));
  // f16's bytes for the same rows: 2 * 16 = 32 a row; q8_0 is 20 / 32 = 0.625 of them
  // at this head_dim (group 8), 34 / 64 = 0.53 at group 32; q4_0 12 / 32 = 0.375 and
  // 18 / 64 = 0.28 (3.6x the rows of f16 in the same bytes).
  EXPECT_EQ(KvRowBytes(KvDtype::kF16, kKvDim, 0), 32u);
  EXPECT_EQ(KvRowBytes(KvDtype::kQ8_0, 64, 32), 68u);
  EXPECT_EQ(KvRowBytes(KvDtype::kQ4_0, 64, 32), 36u);
  const std::string key = e.key().ToString();
  // The key names the type, '/' written '+' (a file name): "q8_0", "q4_0", "q8_0+q4_0".
  const std::string name = dtype == KvDtype::kQ8_0 ? "q8_0" : dtype == KvDtype::kQ4_0 ? "q4_0" : "q8_0+q4_0";
  EXPECT_NE(key.find("-" + name + "-"), std::string::npos) << key;
  EXPECT_TRUE(ParseEntryKeyName(key));
  EXPECT_TRUE(EntryKeyHasDtype(key, dtype));
  for (KvDtype other : kKvDtypes)
    if (other != dtype) {
      EXPECT_FALSE(EntryKeyHasDtype(key, other)) << KvDtypeName(other);
    }
  // The type's own name with '/' is never a key's field.
  std::string slash = key;
  if (dtype == KvDtype::kQ8_0Q4_0) {
    EXPECT_FALSE(ParseEntryKeyName(slash.replace(slash.find('+'), 1, "/")));
  }
  auto bytes = SerializeEntry(e);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto back = DeserializeEntry(*bytes, "fp-A");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->dtype, dtype);
  EXPECT_EQ(back->group, kGroup);
  EXPECT_EQ(back->kq, e.kq);
  EXPECT_EQ(back->vq, e.vq);
  EXPECT_EQ(back->key().ToString(), key);
  // The same rows as f32 and f16 entries, or of the other quantized type, are other
  // keys: the type is part of the name.
  KvEntry f32 = MakeEntry(Range(1, 20), "s", "default", kLayers, kKvDim);
  EXPECT_NE(f32.key().ToString(), key);
  for (KvDtype other : {KvDtype::kQ8_0, KvDtype::kQ4_0, KvDtype::kQ8_0Q4_0})
    if (other != dtype) {
      EXPECT_NE(MakeQuantized(other, Range(1, 20), "s").key().ToString(), key);
    }
}

// A q4_0 row of groups of 32 values holds the GGUF q4_0 blocks' codes (bit for bit),
// group after group, then their scales; it reads back as the blocks do.
// The list every --kv-store-dtype / --tier-dtype message gives: the types docs/store.md
// names, each of which parses to itself.
TEST(KvDtypeNames, ChoicesNameEveryTypeAndEachParses) {
  EXPECT_EQ(KvDtypeChoices(), "f32, f16, q8_0, q4_0, q8_0/q4_0 or kivi4");
  for (KvDtype t : kKvDtypes) {
    KvDtype parsed;
    ASSERT_TRUE(ParseKvDtype(KvDtypeName(t), &parsed)) << KvDtypeName(t);
    EXPECT_EQ(parsed, t);
  }
  KvDtype unused;
  EXPECT_FALSE(ParseKvDtype("q4_1", &unused));
}

TEST(Q4Entry, RowsOf32ValueGroupsHoldTheGgufQ4_0Blocks) {
  constexpr int kDim = 96, kG = 32, kBlocks = kDim / kG;
  std::vector<float> x(kDim);
  for (int i = 0; i < kDim; ++i) x[i] = std::sin(0.7f * i) * (i % 13 == 5 ? 9.0f : 1.0f) - 0.1f;
  std::vector<uint8_t> row(KvRowBytes(KvDtype::kQ4_0, kDim, kG));
  ASSERT_EQ(row.size(), static_cast<size_t>(kDim / 2 + 2 * kBlocks));
  QuantizeRow(KvDtype::kQ4_0, x.data(), kDim, kG, row.data());
  std::vector<uint8_t> blocks(kBlocks * 18);  // block_q4_0: f16 d, then 16 bytes of codes
  QuantizeBlocks(DType::kQ4_0, x.data(), blocks.data(), kDim);
  for (int b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(std::memcmp(&row[b * 16], &blocks[b * 18 + 2], 16), 0) << "block " << b;
    EXPECT_EQ(std::memcmp(&row[kDim / 2 + 2 * b], &blocks[b * 18], 2), 0) << "block " << b;
  }
  std::vector<float> got(kDim), want(kDim);
  DequantizeRow(KvDtype::kQ4_0, row.data(), kDim, kG, got.data());
  DequantizeBlocks(DType::kQ4_0, blocks.data(), want.data(), kDim);
  for (int i = 0; i < kDim; ++i) EXPECT_EQ(got[i], want[i]) << i;
}

TEST_P(QuantizedEntry, RowsFromABaseAndTruncation) {
  const KvEntry full = MakeQuantized(GetParam(), Range(1, 24), "s");
  auto full_bytes = SerializeEntryBytes(full);
  ASSERT_TRUE(full_bytes.ok());
  // The first 16 rows of an entry of 16 tokens, shared in place; the other 8 its own.
  KvEntry head = full;
  head.TruncateTo(16);
  auto head_bytes = SerializeEntryBytes(head);
  ASSERT_TRUE(head_bytes.ok());
  SharedBytes shared(std::move(*head_bytes));
  auto h = VerifyEntry(*shared, "fp-A");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  KvEntry turn = full;
  turn.base = EntryRowsBase(shared, *h, 16);
  const size_t krow = RowSize(RowType(GetParam(), false)), vrow = RowSize(RowType(GetParam(), true));
  for (int l = 0; l < kLayers; ++l) {
    turn.kq[l].erase(turn.kq[l].begin(), turn.kq[l].begin() + 16 * krow);
    turn.vq[l].erase(turn.vq[l].begin(), turn.vq[l].begin() + 16 * vrow);
  }
  ASSERT_TRUE(ValidateEntry(turn).ok()) << ValidateEntry(turn).ToString();
  for (int l = 0; l < kLayers; ++l)
    for (int r = 0; r < 24; ++r) {
      ASSERT_EQ(std::memcmp(turn.k_row_bytes(l, r), full.kq[l].data() + r * krow, krow), 0) << r;
      ASSERT_EQ(std::memcmp(turn.v_row_bytes(l, r), full.vq[l].data() + r * vrow, vrow), 0) << r;
    }
  auto turn_bytes = SerializeEntryBytes(turn);
  ASSERT_TRUE(turn_bytes.ok()) << turn_bytes.status().ToString();
  EXPECT_EQ((*turn_bytes)->view(), (*full_bytes)->view());
}

TEST_P(QuantizedEntry, AGroupThatDoesNotFitIsInvalid) {
  KvEntry e = MakeQuantized(GetParam(), Range(1, 4), "s");
  for (int group : {0, -8, 3, 64}) {
    e.group = group;
    EXPECT_EQ(ValidateEntry(e).code(), StatusCode::kInvalidArgument) << group;
  }
  // q4_0 packs two values a byte: an odd group (which divides kv_dim 16 only as 1) does
  // not fit it (nor q8_0/q4_0, whose V is q4_0); q8_0 takes it.
  e.group = 1;
  e.kq.assign(kLayers, std::vector<uint8_t>(4 * KvRowBytes(RowType(GetParam(), false), kKvDim, 1)));
  e.vq.assign(kLayers, std::vector<uint8_t>(4 * KvRowBytes(RowType(GetParam(), true), kKvDim, 1)));
  EXPECT_EQ(ValidateEntry(e).ok(), GetParam() == KvDtype::kQ8_0) << ValidateEntry(e).ToString();
  KvEntry f32 = MakeEntry(Range(1, 4), "s", "default", kLayers, kKvDim);
  f32.group = 8;  // an unquantized type has no group
  EXPECT_EQ(ValidateEntry(f32).code(), StatusCode::kInvalidArgument);
}

// Scales a quantizer never writes (NaN, +-Inf; negative for q8_0, whose scale is max|x|
// / 127), in an entry whose checksums hold (a faulty writer): the reader rejects the
// layer, whole or read layer by layer. q4_0's scale carries the sign of the group's
// largest-magnitude value: a negative one is what its quantizer writes, and is kept.
// Checked in V's rows (layer 1, row 4, its second scale) and in K's (layer 0, row 0, its
// first), each by its own row type.
TEST_P(QuantizedEntry, ScalesNoQuantizerWritesAreDataLoss) {
  const KvDtype dtype = GetParam();
  auto bads = [](KvDtype row_type) {
    std::vector<uint16_t> b = {0x7e00, 0x7c00, 0xfc00, 0xfe01};
    if (row_type == KvDtype::kQ8_0) b.insert(b.end(), {0x8001, 0xbc00});
    return b;
  };
  const KvDtype k_type = RowType(dtype, false), v_type = RowType(dtype, true);
  for (uint16_t bad : bads(v_type)) {
    KvEntry e = MakeQuantized(dtype, Range(1, 6), "s");
    std::memcpy(e.vq[1].data() + 4 * RowSize(v_type) + ScalesAt(v_type) + 2, &bad, sizeof(bad));
    auto bytes = SerializeEntry(e);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(DeserializeEntry(*bytes, "fp-A").status().code(), StatusCode::kDataLoss) << std::hex << bad;
    auto h = ParseEntryHeader(*bytes);
    ASSERT_TRUE(h.ok());
    EXPECT_TRUE(VerifyEntryLayer(*bytes, *h, 0).ok());
    EXPECT_EQ(VerifyEntryLayer(*bytes, *h, 1).code(), StatusCode::kDataLoss);
    const std::string_view layer1 = std::string_view(*bytes).substr(EntryLayerOffset(*h, 1), h->layer_bytes);
    EXPECT_EQ(VerifyLayerBytes(layer1, *h, 1).code(), StatusCode::kDataLoss);
  }
  for (uint16_t bad : bads(k_type)) {
    KvEntry e = MakeQuantized(dtype, Range(1, 6), "s");
    std::memcpy(e.kq[0].data() + ScalesAt(k_type), &bad, sizeof(bad));
    auto bytes = SerializeEntry(e);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(DeserializeEntry(*bytes, "fp-A").status().code(), StatusCode::kDataLoss) << "K " << std::hex << bad;
  }
  // The largest finite scale is one the quantizer writes (a group with max |x| >= 127 *
  // 65504 for q8_0; for q4_0 a largest-magnitude value of -8 * 65504, and its negation
  // for a positive one): accepted, in K's rows and in V's.
  auto goods = [](KvDtype row_type) {
    std::vector<uint16_t> g = {0x7bff};
    if (row_type == KvDtype::kQ4_0) g.insert(g.end(), {0xfbff, 0xbc00});
    return g;
  };
  for (bool v : {false, true}) {
    const KvDtype type = v ? v_type : k_type;
    for (uint16_t good : goods(type)) {
      KvEntry e = MakeQuantized(dtype, Range(1, 6), "s");
      std::memcpy((v ? e.vq : e.kq)[0].data() + ScalesAt(type), &good, sizeof(good));
      auto bytes = SerializeEntry(e);
      ASSERT_TRUE(bytes.ok());
      EXPECT_TRUE(DeserializeEntry(*bytes, "fp-A").ok()) << (v ? "V " : "K ") << std::hex << good;
    }
  }
}

// The entry file of `key` in the SSD directory.
std::string EntryFile(const std::string& dir, const std::string& key) {
  return SsdTier::ModelDir(dir, "fp-A") + "/" + key + ".kv";
}

// A quantized entry saved on SSD, damaged in the file, and the store restarted over the
// directory: the lookup misses or the load finds it bad (NotFound: dropped, counted in
// StoreStats::corrupt); it is never served, and nothing crashes.
TEST_P(QuantizedEntry, DamagedOnSsdIsAMissAfterARestart) {
  const KvDtype dtype = GetParam();
  const KvEntry saved = MakeQuantized(dtype, Range(100, 24), "victim");
  const KvDtype v_type = RowType(dtype, true);
  const size_t vrow = RowSize(v_type), v_at = 24 * RowSize(RowType(dtype, false));  // V after K's 24 rows
  auto h = ParseEntryHeader(*SerializeEntry(saved));
  ASSERT_TRUE(h.ok());
  // Byte offsets in the file: layer 1's V, row 7, its first scale; and its third value
  // (q4_0: the third byte of codes).
  const uint64_t scale_at = EntryLayerOffset(*h, 1) + v_at + 7 * vrow + ScalesAt(v_type);
  const uint64_t value_at = EntryLayerOffset(*h, 1) + v_at + 7 * vrow + 2;
  struct Damage {
    const char* what;
    std::function<void(std::string&)> apply;
  };
  auto put_scale = [&](uint16_t bits) {
    return [=](std::string& f) { std::memcpy(f.data() + scale_at, &bits, sizeof(bits)); };
  };
  const std::vector<Damage> damages = {
      {"NaN scale", put_scale(0x7e00)},
      {"Inf scale", put_scale(0x7c00)},
      {"huge scale", put_scale(0x7bff)},
      {"flipped value byte", [&](std::string& f) { f[value_at] = static_cast<char>(f[value_at] ^ 0x10); }},
      {"truncated mid-block", [&](std::string& f) { f.resize(scale_at + 1); }},
      {"truncated to the header", [&](std::string& f) { f.resize(h->data_offset); }},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    ScratchDir dir("quantized-damage");
    std::string key;
    {
      auto s = KvStore::Open(testing::SsdOnlyOptions(dir.path(), dtype), nullptr);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      ASSERT_TRUE((*s)->Save(saved).ok());
      key = saved.key().ToString();
      ASSERT_TRUE((*s)->Lookup("default", "victim", Range(100, 30)).has_value());
    }
    const std::string file = EntryFile(dir.path(), key);
    ASSERT_TRUE(testing::EditFile(file, d.apply)) << file;
    auto s = KvStore::Open(testing::SsdOnlyOptions(dir.path(), dtype), nullptr);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto m = (*s)->Lookup("default", "victim", Range(100, 30));
    if (m.has_value()) {  // indexed from its (intact) header: the load finds the damage
      auto loaded = (*s)->Load(m->key);
      EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound) << loaded.status().ToString();
      EXPECT_FALSE((*s)->Lookup("default", "victim", Range(100, 30)).has_value());
    }
    // Dropped as corrupt: at the restart (a size that does not match its header) or when
    // loaded (a layer's checksum or scales).
    EXPECT_GE((*s)->Stats().corrupt, 1u);
    EXPECT_FALSE(std::filesystem::exists(file));
  }
}

// MakeEntry's rows as an entry of any type: f16 (rounded) or quantized.
KvEntry Typed(KvDtype dtype, const std::vector<int32_t>& tokens, const std::string& session) {
  if (KvDtypeQuantized(dtype)) return MakeQuantized(dtype, tokens, session);
  KvEntry e = MakeEntry(tokens, session, "default", kLayers, kKvDim);
  if (dtype == KvDtype::kF32) return e;
  e.dtype = KvDtype::kF16;
  e.k16.resize(kLayers);
  e.v16.resize(kLayers);
  for (int l = 0; l < kLayers; ++l)
    for (size_t i = 0; i < e.k[l].size(); ++i) {
      e.k16[l].push_back(F32ToF16(e.k[l][i]));
      e.v16[l].push_back(F32ToF16(e.v[l][i]));
    }
  e.k.clear();
  e.v.clear();
  return e;
}

// The identity rule across restarts over one SSD directory, for each pair of types (A,
// B) with a quantized one: A's entries are kept but never served by a B store (a miss,
// counted in other_type_misses), and the other way round. A session's save replaces the
// session's previous entry whatever its type (a session has one entry: its newest turn);
// an entry of another session stays and is served again, bit for bit, by a store of its
// type.
TEST(QuantizedEntryOnSsd, AnotherTypesEntryIsAMissAcrossRestarts) {
  const std::pair<KvDtype, KvDtype> pairs[] = {{KvDtype::kF16, KvDtype::kQ8_0},
                                               {KvDtype::kQ8_0, KvDtype::kQ4_0},
                                               {KvDtype::kF16, KvDtype::kQ4_0},
                                               {KvDtype::kQ8_0, KvDtype::kQ8_0Q4_0},
                                               {KvDtype::kQ8_0Q4_0, KvDtype::kQ4_0},
                                               {KvDtype::kQ4_0, KvDtype::kKivi4},
                                               {KvDtype::kKivi4, KvDtype::kQ8_0Q4_0}};
  for (auto [a, b] : pairs) {
    SCOPED_TRACE(std::string(KvDtypeName(a)) + " then " + KvDtypeName(b));
    ScratchDir dir("quantized-identity");
    const KvEntry conv_a = Typed(a, Range(100, 24), "conv"), other_a = Typed(a, Range(500, 16), "other");
    const KvEntry conv_b = Typed(b, Range(100, 20), "conv");
    const std::vector<int32_t> next = Range(100, 30), other_next = Range(500, 20);
    // The entry `key` as the store of `s` loads it equals `want`, row bytes for row bytes
    // (kivi4: its bytes, serialized again: its K rows are codes of their groups).
    auto served_as = [](KvStore& s, const std::string& key, const KvEntry& want) {
      auto e = s.Load(key);
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      EXPECT_EQ(e->dtype, want.dtype);
      if (want.dtype == KvDtype::kKivi4) {
        KvEntry w = want;
        w.expires_at_ms = e->expires_at_ms;
        EXPECT_TRUE(*SerializeEntry(*e) == *SerializeEntry(w));
        return;
      }
      for (int l = 0; l < kLayers; ++l)
        for (int r = 0; r < want.n_tokens(); ++r) {
          ASSERT_EQ(std::memcmp(e->k_row_bytes(l, r), want.k_row_bytes(l, r), want.k_row_size()), 0) << l << " " << r;
          ASSERT_EQ(std::memcmp(e->v_row_bytes(l, r), want.v_row_bytes(l, r), want.v_row_size()), 0) << l << " " << r;
        }
    };
    {  // A: saves both sessions
      auto s = KvStore::Open(testing::SsdOnlyOptions(dir.path(), a), nullptr);
      ASSERT_TRUE(s.ok());
      ASSERT_TRUE((*s)->Save(conv_a).ok());
      ASSERT_TRUE((*s)->Save(other_a).ok());
      ASSERT_TRUE((*s)->Lookup("default", "conv", next).has_value());
    }
    {  // B: A's entries are kept, never served; its save of "conv" replaces conv's
      auto s = KvStore::Open(testing::SsdOnlyOptions(dir.path(), b), nullptr);
      ASSERT_TRUE(s.ok());
      EXPECT_EQ((*s)->open_report().ssd_entries, 2u);
      EXPECT_FALSE((*s)->Lookup("default", "conv", next).has_value());
      EXPECT_FALSE((*s)->Lookup("default", "other", other_next).has_value());
      EXPECT_EQ((*s)->Stats().other_type_misses, 2u);
      EXPECT_EQ((*s)->Stats().misses, 2u);
      ASSERT_TRUE((*s)->Save(conv_b).ok());
      auto m = (*s)->Lookup("default", "conv", next);
      ASSERT_TRUE(m.has_value());
      EXPECT_EQ(m->key, conv_b.key().ToString());
      EXPECT_EQ(m->n_tokens, 20);
      EXPECT_FALSE((*s)->Contains(conv_a.key().ToString()));
      EXPECT_TRUE((*s)->Contains(other_a.key().ToString()));
    }
    {  // A again: "other" served, bit for bit; "conv" (now B's) a counted miss
      auto s = KvStore::Open(testing::SsdOnlyOptions(dir.path(), a), nullptr);
      ASSERT_TRUE(s.ok());
      EXPECT_EQ((*s)->open_report().ssd_entries, 2u);
      auto m = (*s)->Lookup("default", "other", other_next);
      ASSERT_TRUE(m.has_value());
      EXPECT_EQ(m->key, other_a.key().ToString());
      served_as(**s, m->key, other_a);
      EXPECT_FALSE((*s)->Lookup("default", "conv", next).has_value());
      EXPECT_EQ((*s)->Stats().other_type_misses, 1u);
    }
    {  // B again: its own entry, bit for bit
      auto s = KvStore::Open(testing::SsdOnlyOptions(dir.path(), b), nullptr);
      ASSERT_TRUE(s.ok());
      auto m = (*s)->Lookup("default", "conv", next);
      ASSERT_TRUE(m.has_value());
      EXPECT_EQ(m->key, conv_b.key().ToString());
      served_as(**s, m->key, conv_b);
      EXPECT_EQ((*s)->Stats().other_type_misses, 0u);
    }
  }
}

// A turn of a quantized store loaded from a source of another type (a chunk another
// store type saved, opened by its key): the rows enter the buffer, but the turn cannot
// keep them as rows of its type, so it is not saved -- an entry of the wrong type is
// never written under this store's type. From a source of its own type the same turn
// shares the rows and stays valid.
TEST_P(QuantizedEntry, ATurnLoadedFromAnotherTypeIsNotSaved) {
  const KvDtype dtype = GetParam();
  kv::KvShape shape;
  shape.n_layers = kLayers;
  shape.n_kv_heads = 2;
  shape.head_dim = 8;  // kv_dim 16, group 8
  shape.block_size = 4;
  kv::BlockPool pool(shape, 16);
  attention::RopeTable rope{8, 10000.0f, model::RopeScaling{}, 64};
  backend::ThreadPool threads{1};
  StoreOptions o = testing::TierTestOptions();
  o.kv_dtype = dtype;
  o.dram_bytes = 16 << 20;
  auto store = KvStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  (*store)->AttachComputeBuffer(&pool, &rope);
  for (KvDtype source_type : kKvDtypes) {
    const KvEntry e = Typed(source_type, Range(100, 8), "chunk");
    SCOPED_TRACE(KvDtypeName(e.dtype));
    SharedBytes bytes(std::move(*SerializeEntryBytes(e)));
    auto h = VerifyEntry(*bytes, "fp-A");
    ASSERT_TRUE(h.ok());
    auto source = KvSource::Stored(bytes, *h, e.key().ToString());
    std::vector<int32_t> blocks = {*pool.Allocate(), *pool.Allocate()};
    std::vector<int32_t> positions = Range(0, 8);
    auto turn = (*store)->NewTurn("default", "s", -1);
    turn->Load({LoadSegment{source, 0, 8, 0}}, blocks, positions, 12, Preload::kSync, threads);
    turn->WaitLoad();
    EXPECT_EQ(turn->valid(), e.dtype == dtype);
    turn.reset();
    for (int32_t b : blocks) pool.Free(b);
  }
}

// RoundTripRows gives each row the value an entry of its type, written from those f32 rows
// and read back, gives it: serialized, verified and read through a KvSource as the loader
// reads it, for every type (kivi4 over three K groups: 128, 128 and 44 rows).
TEST(EntryRoundTrip, RowsComeBackAsAStoredEntryOfTheirTypeGivesThem) {
  const std::vector<int32_t> tokens = Range(1, 300);
  const KvEntry f32 = MakeEntry(tokens, "s", "default", kLayers, kKvDim);
  // A row of `type` (f32, f16, q8_0 or q4_0: entry.h's layouts) as f32.
  auto read = [](KvDtype type, const char* bytes, float* y) {
    if (type == KvDtype::kF32) {
      std::memcpy(y, bytes, sizeof(float) * kKvDim);
    } else if (type == KvDtype::kF16) {
      for (int c = 0; c < kKvDim; ++c) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * c, 2);
        y[c] = F16ToF32(h);
      }
    } else {
      DequantizeRow(type, reinterpret_cast<const uint8_t*>(bytes), kKvDim, kGroup, y);
    }
  };
  for (KvDtype dtype : kKvDtypes) {
    SCOPED_TRACE(KvDtypeName(dtype));
    const KvEntry e = Typed(dtype, tokens, "s");
    SharedBytes bytes(std::move(*SerializeEntryBytes(e)));
    auto h = VerifyEntry(*bytes, "fp-A");
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    auto src = KvSource::Stored(bytes, *h, e.key().ToString());
    const KvDtype kt = dtype == KvDtype::kQ8_0Q4_0 ? KvDtype::kQ8_0 : dtype;
    const KvDtype vt = dtype == KvDtype::kQ8_0Q4_0 || dtype == KvDtype::kKivi4 ? KvDtype::kQ4_0 : dtype;
    const int group = KvDtypeQuantized(dtype) ? kGroup : 0;
    int differ = 0;
    for (int l = 0; l < kLayers; ++l) {
      std::vector<float> k = f32.k[l], v = f32.v[l];
      RoundTripRows(dtype, false, 300, kKvDim, group, k.data());
      RoundTripRows(dtype, true, 300, kKvDim, group, v.data());
      const KvSource::Layer layer = src->layer(l);
      std::vector<float> y(kKvDim);
      for (int r = 0; r < 300; ++r) {
        if (dtype == KvDtype::kKivi4) {
          layer.KF32(r, y.data());
        } else {
          read(kt, layer.KBytes(r), y.data());
        }
        ASSERT_EQ(std::memcmp(y.data(), k.data() + r * kKvDim, sizeof(float) * kKvDim), 0) << "K row " << r;
        read(vt, layer.VBytes(r), y.data());
        ASSERT_EQ(std::memcmp(y.data(), v.data() + r * kKvDim, sizeof(float) * kKvDim), 0) << "V row " << r;
      }
      for (size_t i = 0; i < k.size(); ++i) differ += (k[i] != f32.k[l][i]) + (v[i] != f32.v[l][i]);
    }
    // f32 keeps every value; every other type moves some.
    if (dtype == KvDtype::kF32) {
      EXPECT_EQ(differ, 0);
    } else {
      EXPECT_GT(differ, 0);
    }
  }
}

}  // namespace
}  // namespace attic::store
