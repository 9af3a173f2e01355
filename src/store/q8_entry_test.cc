// q8_0 entries (entry.h): bytes, rows shared from a base, truncation, the key, and what
// the store does with bad ones -- a corrupt scale (NaN, Inf, negative: written so by a
// faulty writer, or damaged on disk), a truncated block, a flipped byte -- found on a
// restart over the SSD directory: the entry is a miss (counted as corrupt), never
// served, never a crash. Also the identity rule across restarts (docs/store.md "Which
// type is stored"): a store of another type never serves it.
#include <gtest/gtest.h>

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
#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::MakeEntry;
using testing::Range;
using testing::ScratchDir;

constexpr int kLayers = 2, kKvDim = 16, kGroup = 8;  // stories260K's grouping: head_dim 8

// MakeEntry's f32 rows quantized: a q8_0 entry of `tokens`.
KvEntry Q8Entry(const std::vector<int32_t>& tokens, const std::string& session) {
  KvEntry e = MakeEntry(tokens, session, "default", kLayers, kKvDim);
  const size_t row = KvRowBytes(KvDtype::kQ8_0, kKvDim, kGroup);
  e.dtype = KvDtype::kQ8_0;
  e.group = kGroup;
  e.kq.assign(kLayers, std::vector<uint8_t>(tokens.size() * row));
  e.vq.assign(kLayers, std::vector<uint8_t>(tokens.size() * row));
  for (int l = 0; l < kLayers; ++l)
    for (size_t r = 0; r < tokens.size(); ++r) {
      QuantizeRowQ8(e.k[l].data() + r * kKvDim, kKvDim, kGroup, e.kq[l].data() + r * row);
      QuantizeRowQ8(e.v[l].data() + r * kKvDim, kKvDim, kGroup, e.vq[l].data() + r * row);
    }
  e.k.clear();
  e.v.clear();
  return e;
}

TEST(Q8Entry, BytesKeyAndRoundTrip) {
  const KvEntry e = Q8Entry(Range(1, 20), "s");
  // Row: 16 int8 values + 2 f16 scales = 20 bytes; the header fits in 4096.
  const size_t row = KvRowBytes(KvDtype::kQ8_0, kKvDim, kGroup);
  EXPECT_EQ(row, 20u);
  EXPECT_EQ(e.SerializedBytes(), 4096u + 2 * kLayers * 20 * row);
  // f16's bytes for the same rows: 2 * 16 = 32 a row; q8_0 is 20 / 32 = 0.625 of them
  // at this head_dim (group 8), 34 / 64 = 0.53 at group 32.
  EXPECT_EQ(KvRowBytes(KvDtype::kF16, kKvDim, 0), 32u);
  EXPECT_EQ(KvRowBytes(KvDtype::kQ8_0, 64, 32), 68u);
  const std::string key = e.key().ToString();
  EXPECT_NE(key.find("-q8_0-"), std::string::npos) << key;
  EXPECT_TRUE(ParseEntryKeyName(key));
  EXPECT_TRUE(EntryKeyHasDtype(key, KvDtype::kQ8_0));
  EXPECT_FALSE(EntryKeyHasDtype(key, KvDtype::kF16));
  auto bytes = SerializeEntry(e);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto back = DeserializeEntry(*bytes, "fp-A");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->dtype, KvDtype::kQ8_0);
  EXPECT_EQ(back->group, kGroup);
  EXPECT_EQ(back->kq, e.kq);
  EXPECT_EQ(back->vq, e.vq);
  EXPECT_EQ(back->key().ToString(), key);
  // The same rows as f32 and f16 entries are other keys: the type is part of the name.
  KvEntry f32 = MakeEntry(Range(1, 20), "s", "default", kLayers, kKvDim);
  EXPECT_NE(f32.key().ToString(), key);
}

TEST(Q8Entry, RowsFromABaseAndTruncation) {
  const KvEntry full = Q8Entry(Range(1, 24), "s");
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
  const size_t row = full.row_bytes();
  for (int l = 0; l < kLayers; ++l) {
    turn.kq[l].erase(turn.kq[l].begin(), turn.kq[l].begin() + 16 * row);
    turn.vq[l].erase(turn.vq[l].begin(), turn.vq[l].begin() + 16 * row);
  }
  ASSERT_TRUE(ValidateEntry(turn).ok()) << ValidateEntry(turn).ToString();
  for (int l = 0; l < kLayers; ++l)
    for (int r = 0; r < 24; ++r) {
      ASSERT_EQ(std::memcmp(turn.k_row_bytes(l, r), full.kq[l].data() + r * row, row), 0) << r;
      ASSERT_EQ(std::memcmp(turn.v_row_bytes(l, r), full.vq[l].data() + r * row, row), 0) << r;
    }
  auto turn_bytes = SerializeEntryBytes(turn);
  ASSERT_TRUE(turn_bytes.ok()) << turn_bytes.status().ToString();
  EXPECT_EQ((*turn_bytes)->view(), (*full_bytes)->view());
}

TEST(Q8Entry, AGroupThatDoesNotFitIsInvalid) {
  KvEntry e = Q8Entry(Range(1, 4), "s");
  for (int group : {0, -8, 3, 64}) {
    e.group = group;
    EXPECT_EQ(ValidateEntry(e).code(), StatusCode::kInvalidArgument) << group;
  }
  KvEntry f32 = MakeEntry(Range(1, 4), "s", "default", kLayers, kKvDim);
  f32.group = 8;  // an unquantized type has no group
  EXPECT_EQ(ValidateEntry(f32).code(), StatusCode::kInvalidArgument);
}

// Scales a quantizer never writes (NaN, +-Inf, negative), in an entry whose checksums
// hold (a faulty writer): the reader rejects the layer, whole or read layer by layer.
TEST(Q8Entry, ScalesNoQuantizerWritesAreDataLoss) {
  for (uint16_t bad : {uint16_t{0x7e00}, uint16_t{0x7c00}, uint16_t{0xfc00}, uint16_t{0x8001}, uint16_t{0xbc00}}) {
    KvEntry e = Q8Entry(Range(1, 6), "s");
    const size_t row = e.row_bytes();
    // Layer 1's V, row 4, its second scale.
    std::memcpy(e.vq[1].data() + 4 * row + kKvDim + 2, &bad, sizeof(bad));
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
  // The largest finite scale is one the quantizer writes (a group with max |x| >= 127 *
  // 65504): accepted.
  KvEntry e = Q8Entry(Range(1, 6), "s");
  const uint16_t largest = 0x7bff;
  std::memcpy(e.kq[0].data() + kKvDim, &largest, sizeof(largest));
  auto bytes = SerializeEntry(e);
  ASSERT_TRUE(bytes.ok());
  EXPECT_TRUE(DeserializeEntry(*bytes, "fp-A").ok());
}

StoreOptions StoreOn(const std::string& dir, KvDtype dtype) {
  StoreOptions o;
  o.fingerprint = "fp-A";
  o.kv_dtype = dtype;
  o.dram_bytes = 0;  // no DRAM: the entries live on SSD
  o.ssd_dir = dir;
  o.ssd_bytes = 64 << 20;
  o.default_ttl_ms = 0;
  o.prefix_block = 8;
  return o;
}

// The entry file of `key` in the SSD directory.
std::string EntryFile(const std::string& dir, const std::string& key) {
  return SsdTier::ModelDir(dir, "fp-A") + "/" + key + ".kv";
}

// A q8_0 entry saved on SSD, damaged in the file, and the store restarted over the
// directory: the lookup misses or the load finds it bad (NotFound: dropped, counted in
// StoreStats::corrupt); it is never served, and nothing crashes.
TEST(Q8EntryOnSsd, DamagedEntriesAreMissesAfterARestart) {
  const KvEntry saved = Q8Entry(Range(100, 24), "victim");
  const size_t row = saved.row_bytes();
  auto h = ParseEntryHeader(*SerializeEntry(saved));
  ASSERT_TRUE(h.ok());
  // Byte offsets in the file: layer 1's V, row 7, its first scale; and its third value.
  const uint64_t scale_at = EntryLayerOffset(*h, 1) + h->layer_bytes / 2 + 7 * row + kKvDim;
  const uint64_t value_at = EntryLayerOffset(*h, 1) + h->layer_bytes / 2 + 7 * row + 2;
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
    ScratchDir dir("q8-damage");
    std::string key;
    {
      auto s = KvStore::Open(StoreOn(dir.path(), KvDtype::kQ8_0), nullptr);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      ASSERT_TRUE((*s)->Save(saved).ok());
      key = saved.key().ToString();
      ASSERT_TRUE((*s)->Lookup("default", "victim", Range(100, 30)).has_value());
    }
    const std::string file = EntryFile(dir.path(), key);
    std::string bytes;
    {
      std::ifstream in(file, std::ios::binary);
      ASSERT_TRUE(in.good()) << file;
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    d.apply(bytes);
    {
      std::ofstream out(file, std::ios::binary | std::ios::trunc);
      out << bytes;
    }
    auto s = KvStore::Open(StoreOn(dir.path(), KvDtype::kQ8_0), nullptr);
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

// The identity rule across restarts over one SSD directory: an f16 store's entries are
// kept but never served by a q8_0 store (a miss, counted in other_type_misses), and the
// other way round. A session's save replaces the session's previous entry whatever its
// type (a session has one entry: its newest turn); an entry of another session stays
// and is served again by a store of its type.
TEST(Q8EntryOnSsd, AnotherTypesEntryIsAMissAcrossRestarts) {
  ScratchDir dir("q8-identity");
  auto f16_entry = [](const std::vector<int32_t>& tokens, const std::string& session) {
    KvEntry e = MakeEntry(tokens, session, "default", kLayers, kKvDim);
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
  };
  const KvEntry conv16 = f16_entry(Range(100, 24), "conv"), other16 = f16_entry(Range(500, 16), "other");
  const KvEntry conv8 = Q8Entry(Range(100, 20), "conv");
  const std::vector<int32_t> next = Range(100, 30), other_next = Range(500, 20);
  {  // f16: saves both sessions
    auto s = KvStore::Open(StoreOn(dir.path(), KvDtype::kF16), nullptr);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Save(conv16).ok());
    ASSERT_TRUE((*s)->Save(other16).ok());
    ASSERT_TRUE((*s)->Lookup("default", "conv", next).has_value());
  }
  {  // q8_0: the f16 entries are kept, never served; its save of "conv" replaces conv's
    auto s = KvStore::Open(StoreOn(dir.path(), KvDtype::kQ8_0), nullptr);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ((*s)->open_report().ssd_entries, 2u);
    EXPECT_FALSE((*s)->Lookup("default", "conv", next).has_value());
    EXPECT_FALSE((*s)->Lookup("default", "other", other_next).has_value());
    EXPECT_EQ((*s)->Stats().other_type_misses, 2u);
    EXPECT_EQ((*s)->Stats().misses, 2u);
    ASSERT_TRUE((*s)->Save(conv8).ok());
    auto m = (*s)->Lookup("default", "conv", next);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->key, conv8.key().ToString());
    EXPECT_EQ(m->n_tokens, 20);
    EXPECT_FALSE((*s)->Contains(conv16.key().ToString()));
    EXPECT_TRUE((*s)->Contains(other16.key().ToString()));
  }
  {  // f16 again: "other" served, bit for bit; "conv" (now q8_0) a counted miss
    auto s = KvStore::Open(StoreOn(dir.path(), KvDtype::kF16), nullptr);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ((*s)->open_report().ssd_entries, 2u);
    auto m = (*s)->Lookup("default", "other", other_next);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->key, other16.key().ToString());
    auto e = (*s)->Load(m->key);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->dtype, KvDtype::kF16);
    EXPECT_EQ(e->k16, other16.k16);
    EXPECT_EQ(e->v16, other16.v16);
    EXPECT_FALSE((*s)->Lookup("default", "conv", next).has_value());
    EXPECT_EQ((*s)->Stats().other_type_misses, 1u);
  }
  {  // q8_0 again: its own entry, bit for bit
    auto s = KvStore::Open(StoreOn(dir.path(), KvDtype::kQ8_0), nullptr);
    ASSERT_TRUE(s.ok());
    auto m = (*s)->Lookup("default", "conv", next);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->key, conv8.key().ToString());
    auto e = (*s)->Load(m->key);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->dtype, KvDtype::kQ8_0);
    EXPECT_EQ(e->kq, conv8.kq);
    EXPECT_EQ(e->vq, conv8.vq);
    EXPECT_EQ((*s)->Stats().other_type_misses, 0u);
  }
}

// A turn of a q8_0 store loaded from an f16 source (a chunk another store type saved,
// opened by its key): the rows enter the buffer, but the turn cannot keep them as q8_0
// rows, so it is not saved -- an entry of the wrong type is never written under this
// store's type. From a q8_0 source the same turn shares the rows and stays valid.
TEST(Q8EntryTurn, ATurnLoadedFromAnotherTypeIsNotSaved) {
  kv::KvShape shape;
  shape.n_layers = kLayers;
  shape.n_kv_heads = 2;
  shape.head_dim = 8;  // kv_dim 16, q8_0 group 8
  shape.block_size = 4;
  kv::BlockPool pool(shape, 16);
  attention::RopeTable rope{8, 10000.0f, model::RopeScaling{}, 64};
  backend::ThreadPool threads{1};
  StoreOptions o = testing::TierTestOptions();
  o.kv_dtype = KvDtype::kQ8_0;
  o.dram_bytes = 16 << 20;
  auto store = KvStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  (*store)->AttachComputeBuffer(&pool, &rope);
  KvEntry f16 = MakeEntry(Range(100, 8), "chunk", "default", kLayers, kKvDim);
  f16.dtype = KvDtype::kF16;
  f16.k16.resize(kLayers);
  f16.v16.resize(kLayers);
  for (int l = 0; l < kLayers; ++l)
    for (size_t i = 0; i < f16.k[l].size(); ++i) {
      f16.k16[l].push_back(F32ToF16(f16.k[l][i]));
      f16.v16[l].push_back(F32ToF16(f16.v[l][i]));
    }
  f16.k.clear();
  f16.v.clear();
  for (const KvEntry& e : {f16, Q8Entry(Range(100, 8), "chunk")}) {
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
    EXPECT_EQ(turn->valid(), e.dtype == KvDtype::kQ8_0);
    turn.reset();
    for (int32_t b : blocks) pool.Free(b);
  }
}

}  // namespace
}  // namespace attic::store
