// kivi4 entries (entry.h): K in 4 bits per channel over groups of tokens (KIVI), V in
// q4_0. The quantizer against a float64 bound derived from its arithmetic; the groups an
// entry is written with (a turn's own rows in groups of kKivi4GroupTokens, a stored
// base's groups kept as they are); round trips bit for bit; truncation; scales,
// minimums and group ends no writer produces; damage found after a restart; and a
// store of kivi4 saving and extending a conversation through turns. The golden file
// (entry_golden_test.cc) checks the bytes against an independent writer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "attic/core/hash.h"
#include "attic/store/kv_store.h"
#include "attic/store/tier.h"
#include "attic/store/turn.h"
#include "attic/tensor/dtype.h"
#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::Kivi4KBound;
using testing::MakeEntry;
using testing::Range;
using testing::ScratchDir;

constexpr int kLayers = 2, kKvDim = 16, kGroup = 8;  // stories260K's head_dim 8: V's group 8

// Checks rows [0, n) of `got` (read back) against `x` (f32 inputs), channel by channel,
// each group (ends) by its own range.
void ExpectWithinGroupBounds(const float* x, const float* got, const std::vector<int32_t>& ends, int kv_dim,
                             const std::string& what) {
  int first = 0;
  for (int32_t end : ends) {
    for (int c = 0; c < kv_dim; ++c) {
      double lo = INFINITY, hi = -INFINITY;
      for (int t = first; t < end; ++t) {
        lo = std::min(lo, static_cast<double>(x[t * kv_dim + c]));
        hi = std::max(hi, static_cast<double>(x[t * kv_dim + c]));
      }
      const double bound = Kivi4KBound(lo, hi);
      for (int t = first; t < end; ++t)
        ASSERT_LE(std::fabs(got[t * kv_dim + c] - static_cast<double>(x[t * kv_dim + c])), bound)
            << what << ": token " << t << " channel " << c << " (group [" << first << ", " << end << "))";
    }
    first = end;
  }
}

TEST(Kivi4Quantizer, EachValueIsWithinItsChannelsGroupBound) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0, 1);
  for (int n : {1, 2, 7, 128}) {
    SCOPED_TRACE("group of " + std::to_string(n) + " tokens");
    // Channel 3 an outlier (50x, offset), channel 5 constant, channel 9 tiny values: each
    // channel's error follows its own range, not the outlier's.
    std::vector<float> x(static_cast<size_t>(n) * kKvDim);
    for (int t = 0; t < n; ++t)
      for (int c = 0; c < kKvDim; ++c) {
        float v = d(rng);
        if (c == 3) v = 50 * v + 20;
        if (c == 5) v = -0.375f;
        if (c == 9) v *= 1e-3f;
        x[t * kKvDim + c] = v;
      }
    std::vector<uint8_t> codes(static_cast<size_t>(n) * kKvDim / 2);
    std::vector<uint16_t> params(2 * kKvDim);
    QuantizeKGroup(x.data(), n, kKvDim, codes.data(), params.data());
    std::vector<float> y(x.size());
    for (int t = 0; t < n; ++t)
      DequantizeKGroupRow(codes.data() + t * kKvDim / 2, params.data(), kKvDim, y.data() + t * kKvDim);
    ExpectWithinGroupBounds(x.data(), y.data(), {n}, kKvDim, "QuantizeKGroup");
    // A constant channel reads back exactly when f16 holds its value.
    for (int t = 0; t < n; ++t) EXPECT_EQ(y[t * kKvDim + 5], -0.375f);
    // Scales are never negative; minimums are f16 of the channel's smallest value.
    for (int c = 0; c < kKvDim; ++c) {
      EXPECT_EQ(params[c] & 0x8000, 0) << c;
      float lo = x[c];
      for (int t = 1; t < n; ++t) lo = std::min(lo, x[t * kKvDim + c]);
      EXPECT_EQ(params[kKvDim + c], F32ToF16(lo)) << c;
    }
  }
}

// MakeEntry's rows as a kivi4 entry: own K f32 (quantized when serialized), V in q4_0.
KvEntry MakeKivi(const std::vector<int32_t>& tokens, const std::string& session) {
  KvEntry e = MakeEntry(tokens, session, "default", kLayers, kKvDim);
  e.dtype = KvDtype::kKivi4;
  e.group = kGroup;
  const size_t vrow = kKvDim / 2 + 2 * kKvDim / kGroup;  // q4_0: 8 bytes of codes, 2 f16 scales
  e.vq.assign(kLayers, std::vector<uint8_t>(tokens.size() * vrow));
  for (int l = 0; l < kLayers; ++l)
    for (size_t r = 0; r < tokens.size(); ++r)
      QuantizeRow(KvDtype::kQ4_0, e.v[l].data() + r * kKvDim, kKvDim, kGroup, e.vq[l].data() + r * vrow);
  e.v.clear();
  return e;
}

// Every K row of `e` read as f32 (KRowF32), layer `l`.
std::vector<float> KRows(const KvEntry& e, int l) {
  std::vector<float> y(static_cast<size_t>(e.n_tokens()) * e.kv_dim);
  for (int r = 0; r < e.n_tokens(); ++r) e.KRowF32(l, r, y.data() + r * e.kv_dim);
  return y;
}

TEST(Kivi4Entry, BytesKeyGroupsAndRoundTrip) {
  const KvEntry e = MakeKivi(Range(1, 300), "s");
  ASSERT_TRUE(ValidateEntry(e).ok()) << ValidateEntry(e).ToString();
  EXPECT_EQ(e.k_row_size(), 8u);   // 16 4-bit codes
  EXPECT_EQ(e.v_row_size(), 12u);  // q4_0: 8 bytes of codes, 2 f16 scales
  // Own rows in groups of 128 tokens, the last shorter.
  EXPECT_EQ(e.KGroupEnds(), (std::vector<int32_t>{128, 256, 300}));
  // The header (with 3 group ends) fits in 4096; a layer is 300 rows of K codes, 3 groups
  // of 16 scales and 16 minimums (f16), 300 rows of V.
  EXPECT_EQ(e.SerializedBytes(), 4096u + kLayers * (300 * 8 + 3 * 64 + 300 * 12));
  const std::string key = e.key().ToString();
  EXPECT_NE(key.find("-kivi4-"), std::string::npos) << key;
  EXPECT_TRUE(ParseEntryKeyName(key));
  EXPECT_TRUE(EntryKeyHasDtype(key, KvDtype::kKivi4));
  EXPECT_FALSE(EntryKeyHasDtype(key, KvDtype::kQ4_0));
  KvDtype parsed;
  ASSERT_TRUE(ParseKvDtype("kivi4", &parsed));
  EXPECT_EQ(parsed, KvDtype::kKivi4);
  auto bytes = SerializeEntry(e);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  ASSERT_EQ(bytes->size(), e.SerializedBytes());
  auto h = VerifyEntry(*bytes, "fp-A");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->k_group_ends, e.KGroupEnds());
  EXPECT_EQ(h->layer_k_bytes, 300u * 8 + 3 * 64);
  auto back = DeserializeEntry(*bytes, "fp-A");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->dtype, KvDtype::kKivi4);
  EXPECT_EQ(back->group, kGroup);
  EXPECT_EQ(back->key().ToString(), key);
  EXPECT_EQ(back->KGroupEnds(), e.KGroupEnds());
  for (int l = 0; l < kLayers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const std::vector<float> got = KRows(*back, l);
    ExpectWithinGroupBounds(e.k[l].data(), got.data(), e.KGroupEnds(), kKvDim, "read back");
    for (int r = 0; r < 300; ++r)
      ASSERT_EQ(std::memcmp(back->v_row_bytes(l, r), e.vq[l].data() + r * 12, 12), 0) << "V row " << r;
    // The layer as read through a KvSource (how the loader reads it) gives the same rows.
    auto src = KvSource::Stored(SharedBytes(std::move(*SerializeEntryBytes(e))), *h, key);
    std::vector<float> y(kKvDim);
    for (int r = 0; r < 300; ++r) {
      src->layer(l).KF32(r, y.data());
      ASSERT_EQ(std::memcmp(y.data(), got.data() + r * kKvDim, sizeof(float) * kKvDim), 0) << r;
    }
  }
  // Written again, a read entry gives its bytes back, byte for byte.
  auto again = SerializeEntry(*back);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(*again == *bytes);
}

// The loader's reader (GroupedKRows: a layer's group scales widened once, eight channels
// at a time where the CPU has SSE2) gives every row the values KRowF32 gives it (which
// widens its group's scales for the row), bit for bit, at widths that leave no channel,
// some or none past the last group of eight.
TEST(Kivi4Entry, TheLoadersReaderGivesTheEntrysValues) {
  for (int kv_dim : {16, 12, 4, 40}) {
    SCOPED_TRACE("kv_dim " + std::to_string(kv_dim));
    KvEntry e = MakeEntry(Range(1, 140), "s", "default", kLayers, kv_dim);
    e.dtype = KvDtype::kKivi4;
    e.group = 4;
    const size_t vrow = KvRowBytes(KvDtype::kQ4_0, kv_dim, 4);
    e.vq.assign(kLayers, std::vector<uint8_t>(140 * vrow));
    for (int l = 0; l < kLayers; ++l)
      for (int r = 0; r < 140; ++r) {
        for (int c = 0; c < kv_dim; ++c) e.k[l][r * kv_dim + c] *= 1 + c % 5;  // channels of other ranges
        QuantizeRow(KvDtype::kQ4_0, e.v[l].data() + r * kv_dim, kv_dim, 4, e.vq[l].data() + r * vrow);
      }
    e.v.clear();
    SharedBytes bytes(std::move(*SerializeEntryBytes(e)));
    auto h = VerifyEntry(*bytes, "fp-A");
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    auto src = KvSource::Stored(bytes, *h, e.key().ToString());
    auto back = DeserializeEntry(bytes->view(), "fp-A");
    ASSERT_TRUE(back.ok());
    std::vector<float> want(kv_dim), got(kv_dim);
    for (int l = 0; l < kLayers; ++l) {
      const GroupedKRows rows(src->layer(l));
      for (int r = 0; r < 140; ++r) {
        back->KRowF32(l, r, want.data());
        rows.Row(r, got.data());
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), sizeof(float) * kv_dim)) << "layer " << l << " row " << r;
      }
    }
  }
}

// A turn extending a stored kivi4 entry shares its rows: the base's groups are kept as
// written (one the turn's rows cut keeps its scales: its rows' values do not change), and
// the turn's own rows form new groups from there.
TEST(Kivi4Entry, ATurnAfterAStoredEntryKeepsItsGroups) {
  const KvEntry full = MakeKivi(Range(1, 300), "s");
  KvEntry head = full;
  head.TruncateTo(200);
  EXPECT_EQ(head.KGroupEnds(), (std::vector<int32_t>{128, 200}));
  SharedBytes shared(std::move(*SerializeEntryBytes(head)));
  auto h = VerifyEntry(*shared, "fp-A");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  auto stored = DeserializeEntry(shared->view(), "fp-A");
  ASSERT_TRUE(stored.ok());
  for (int base_rows : {200, 150, 128, 60}) {
    SCOPED_TRACE("base rows " + std::to_string(base_rows));
    KvEntry turn = full;
    turn.base = EntryRowsBase(shared, *h, base_rows);
    for (int l = 0; l < kLayers; ++l) {
      turn.k[l].erase(turn.k[l].begin(), turn.k[l].begin() + base_rows * kKvDim);
      turn.vq[l].erase(turn.vq[l].begin(), turn.vq[l].begin() + base_rows * 12);
    }
    ASSERT_TRUE(ValidateEntry(turn).ok()) << ValidateEntry(turn).ToString();
    std::vector<int32_t> want_ends;
    if (base_rows > 128) want_ends.push_back(128);
    want_ends.push_back(base_rows);
    for (int at = base_rows; at < 300; at += 128) want_ends.push_back(std::min(at + 128, 300));
    EXPECT_EQ(turn.KGroupEnds(), want_ends);
    auto bytes = SerializeEntry(turn);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto back = DeserializeEntry(*bytes, "fp-A");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->KGroupEnds(), want_ends);
    for (int l = 0; l < kLayers; ++l) {
      const std::vector<float> got = KRows(*back, l), base = KRows(*stored, l);
      // The stored rows: bit for bit what the stored entry reads.
      EXPECT_EQ(0, std::memcmp(got.data(), base.data(), sizeof(float) * base_rows * kKvDim)) << l;
      // The turn's own rows: within their new groups' bounds.
      std::vector<int32_t> own_ends;
      for (int32_t end : want_ends)
        if (end > base_rows) own_ends.push_back(end - base_rows);
      ExpectWithinGroupBounds(full.k[l].data() + base_rows * kKvDim, got.data() + base_rows * kKvDim, own_ends,
                              kKvDim, "own rows");
      for (int r = 0; r < 300; ++r)
        ASSERT_EQ(std::memcmp(back->v_row_bytes(l, r), full.vq[l].data() + r * 12, 12), 0) << "V row " << r;
    }
  }
}

TEST(Kivi4Entry, TruncationKeepsTheRowsValues) {
  const KvEntry e = MakeKivi(Range(1, 300), "s");
  auto stored = DeserializeEntry(*SerializeEntry(e), "fp-A");
  ASSERT_TRUE(stored.ok());
  for (int n : {299, 256, 140, 1}) {
    SCOPED_TRACE("cut to " + std::to_string(n));
    KvEntry cut = *stored;
    cut.TruncateTo(n);
    std::vector<int32_t> want_ends;
    for (int32_t end : {128, 256, 300}) {
      want_ends.push_back(std::min(end, n));
      if (end >= n) break;
    }
    EXPECT_EQ(cut.KGroupEnds(), want_ends);
    auto bytes = SerializeEntry(cut);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    EXPECT_EQ(bytes->size(), cut.SerializedBytes());
    auto back = DeserializeEntry(*bytes, "fp-A");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ASSERT_EQ(back->n_tokens(), n);
    for (int l = 0; l < kLayers; ++l) {
      const std::vector<float> got = KRows(*back, l), all = KRows(*stored, l);
      EXPECT_EQ(0, std::memcmp(got.data(), all.data(), sizeof(float) * n * kKvDim)) << l;
    }
  }
}

// The byte offset of layer `l`'s K group `g` parameter `j` (< kv_dim: scale of channel j;
// else minimum of channel j - kv_dim) in a serialized kivi4 entry (entry.h's layout).
size_t ParamAt(const EntryHeader& h, int l, int g, int j) {
  return EntryLayerOffset(h, l) + h.meta.n_tokens() * h.meta.kv_dim / 2 + (g * 2 * h.meta.kv_dim + j) * 2;
}

// A writer's fault: an entry whose checksums hold but whose K scales or minimums no
// quantizer writes (NaN, Inf; a negative scale). Written by serializing an entry whose
// base is the damaged bytes (a base's groups are copied as they are; the checksums are
// the new entry's). A negative minimum, the largest finite values and a zero scale are
// what the quantizer writes: accepted.
TEST(Kivi4Entry, ScalesAndMinimumsNoQuantizerWritesAreDataLoss) {
  const KvEntry e = MakeKivi(Range(1, 20), "s");
  const std::string good = *SerializeEntry(e);
  auto h = ParseEntryHeader(good);
  ASSERT_TRUE(h.ok());
  auto rewritten = [&](int layer, int j, uint16_t bits) {
    auto damaged = Bytes::Allocate(good.size());
    std::memcpy(damaged->data(), good.data(), good.size());
    std::memcpy(damaged->data() + ParamAt(*h, layer, 0, j), &bits, sizeof(bits));
    KvEntry w = e;
    w.base = EntryRowsBase(SharedBytes(std::move(damaged)), *h, 20);
    w.k.assign(kLayers, {});
    w.vq.assign(kLayers, {});
    return *SerializeEntry(w);
  };
  struct Case {
    int j;  // a scale (< 16) or a minimum
    uint16_t bits;
    bool ok;
  };
  const Case cases[] = {{3, 0x7e00, false},  {3, 0x7c00, false}, {3, 0xfc00, false}, {3, 0x8001, false},
                        {3, 0xbc00, false},  {19, 0x7e00, false}, {19, 0x7c00, false}, {19, 0xfc00, false},
                        {19, 0xbc00, true},  {19, 0xfbff, true},  {3, 0x7bff, true},  {3, 0x0000, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE((c.j < kKvDim ? "scale " : "minimum ") + std::to_string(c.bits));
    const std::string bytes = rewritten(1, c.j, c.bits);
    EXPECT_EQ(DeserializeEntry(bytes, "fp-A").ok(), c.ok) << DeserializeEntry(bytes, "fp-A").status().ToString();
    if (c.ok) continue;
    EXPECT_EQ(DeserializeEntry(bytes, "fp-A").status().code(), StatusCode::kDataLoss);
    auto hb = ParseEntryHeader(bytes);
    ASSERT_TRUE(hb.ok());
    EXPECT_TRUE(VerifyEntryLayer(bytes, *hb, 0).ok());
    EXPECT_EQ(VerifyEntryLayer(bytes, *hb, 1).code(), StatusCode::kDataLoss);
    const std::string_view layer1 = std::string_view(bytes).substr(EntryLayerOffset(*hb, 1), hb->layer_bytes);
    EXPECT_EQ(VerifyLayerBytes(layer1, *hb, 1).code(), StatusCode::kDataLoss);
  }
}

// Group ends no writer produces, in a header whose checksum holds (a faulty writer): not
// ascending, a zero-length group, a last end other than n_tokens, no groups, more groups
// than tokens. The header is rewritten from entry.h's layout, and its checksum (XXH3 of
// the header's bytes before it, seed 0x68) recomputed.
TEST(Kivi4Entry, GroupEndsNoWriterProducesAreDataLoss) {
  KvEntry e = MakeKivi(Range(1, 300), "");
  e.tenant = "t";
  e.fingerprint = "fp-A";
  const std::string good = *SerializeEntry(e);  // ends 128, 256, 300
  // magic, version, dtype, n_layers, kv_dim, n_tokens, group, then n_groups at 32.
  constexpr size_t kGroupsAt = 8 + 4 * 5 + 4;
  uint32_t n_groups;
  std::memcpy(&n_groups, good.data() + kGroupsAt, 4);
  ASSERT_EQ(n_groups, 3u);
  // Body: through the groups, expiry, three strings, tokens, positions, layer checksums.
  const size_t body = kGroupsAt + 4 + 4 * 3 + 8 + (4 + 1) + 4 + (4 + 4) + 300 * 8 + kLayers * 8;
  uint64_t hc;
  std::memcpy(&hc, good.data() + body, 8);
  ASSERT_EQ(hc, Hash64(good.data(), body, 0x68));  // the layout as read here holds
  auto with_ends = [&](std::vector<uint32_t> ends) {
    std::string bad = good;
    std::memcpy(bad.data() + kGroupsAt + 4, ends.data(), 4 * ends.size());
    const uint64_t c = Hash64(bad.data(), body, 0x68);
    std::memcpy(bad.data() + body, &c, 8);
    return bad;
  };
  EXPECT_TRUE(DeserializeEntry(with_ends({128, 256, 300}), "fp-A").ok());
  for (const auto& ends : std::vector<std::vector<uint32_t>>{
           {256, 128, 300}, {128, 128, 300}, {128, 256, 299}, {128, 256, 301}, {0, 256, 300}}) {
    SCOPED_TRACE(std::to_string(ends[0]) + "," + std::to_string(ends[1]) + "," + std::to_string(ends[2]));
    const std::string bad = with_ends(ends);
    EXPECT_EQ(ParseEntryHeader(bad).status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(DeserializeEntry(bad, "fp-A").status().code(), StatusCode::kDataLoss);
  }
  for (uint32_t count : {0u, 301u, 0x7fffffffu}) {
    std::string bad = good;
    std::memcpy(bad.data() + kGroupsAt, &count, 4);
    const uint64_t c = Hash64(bad.data(), body, 0x68);
    std::memcpy(bad.data() + body, &c, 8);
    EXPECT_EQ(ParseEntryHeader(bad).status().code(), StatusCode::kDataLoss) << count;
    if (count != 301) {
      EXPECT_EQ(EntryHeaderBytes(bad).status().code(), StatusCode::kDataLoss) << count;
    }
  }
}

// A kivi4 entry on SSD, damaged in its file (a K scale NaN, a K minimum Inf, a flipped
// code byte, a file cut inside the K groups' scales), then the store restarted: a miss
// (dropped as corrupt), never served.
TEST(Kivi4Entry, DamagedOnSsdIsAMissAfterARestart) {
  const KvEntry saved = MakeKivi(Range(100, 150), "victim");
  auto h = ParseEntryHeader(*SerializeEntry(saved));
  ASSERT_TRUE(h.ok());
  struct Damage {
    const char* what;
    std::function<void(std::string&)> apply;
  };
  auto put = [](size_t at, uint16_t bits) {
    return [=](std::string& f) { std::memcpy(f.data() + at, &bits, sizeof(bits)); };
  };
  const std::vector<Damage> damages = {
      {"NaN scale", put(ParamAt(*h, 1, 1, 2), 0x7e00)},
      {"Inf minimum", put(ParamAt(*h, 0, 0, kKvDim + 5), 0x7c00)},
      {"flipped code byte", [&](std::string& f) { f[EntryLayerOffset(*h, 1) + 77] ^= 0x10; }},
      {"cut in the scales", [&](std::string& f) { f.resize(ParamAt(*h, 1, 0, 3)); }},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    ScratchDir dir("kivi4-damage");
    const std::string key = saved.key().ToString();
    {
      auto s = KvStore::Open(testing::SsdOnlyOptions(dir.path(), KvDtype::kKivi4), nullptr);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      ASSERT_TRUE((*s)->Save(saved).ok());
      ASSERT_TRUE((*s)->Lookup("default", "victim", Range(100, 160)).has_value());
    }
    const std::string file = SsdTier::ModelDir(dir.path(), "fp-A") + "/" + key + ".kv";
    ASSERT_TRUE(testing::EditFile(file, d.apply)) << file;
    auto s = KvStore::Open(testing::SsdOnlyOptions(dir.path(), KvDtype::kKivi4), nullptr);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto m = (*s)->Lookup("default", "victim", Range(100, 160));
    if (m.has_value()) {
      auto loaded = (*s)->Load(m->key);
      EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound) << loaded.status().ToString();
      EXPECT_FALSE((*s)->Lookup("default", "victim", Range(100, 160)).has_value());
    }
    EXPECT_GE((*s)->Stats().corrupt, 1u);
    EXPECT_FALSE(std::filesystem::exists(file));
  }
}

}  // namespace
}  // namespace attic::store
