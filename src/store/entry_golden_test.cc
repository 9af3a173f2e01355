// The ATTICKV1 entry format against a second, independent writer: the golden entries in
// tests/data/store/ were written by make_golden_entry.py (Python, following
// docs/store.md "Byte layout", with its own XXH3 checked against xxHash's published
// vectors), and golden_entries.json says what each holds. Attic must read every field
// and every K/V element's bits from them, write the same bytes from the same inputs,
// take any damaged header byte, layer byte, cut or extension for DataLoss, and find the
// files where its SSD tier keeps entries (a restart restores them).
//
// To change the format, change docs/store.md and the script first, run it, and commit
// its outputs with the code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "attic/store/entry.h"
#include "attic/store/kv_store.h"
#include "attic/store/tier.h"
#include "attic/tensor/dtype.h"
#include "store/store_test_util.h"
#include "test_util.h"

namespace attic::store {
namespace {

using nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string GoldenDir() { return attic::testing::SourceDir() + "/tests/data/store/"; }

struct Golden {
  std::string name;
  std::string bytes;  // the file
  json m;             // what the script wrote into it
};

std::vector<Golden> LoadGoldens() {
  const json manifest = json::parse(ReadFile(GoldenDir() + "golden_entries.json"));
  std::vector<Golden> out;
  for (const char* name :
       {"golden_f32_v1.kv", "golden_f16_v2.kv", "golden_q8_0_v1.kv", "golden_q4_0_v1.kv", "golden_q8_0_q4_0_v1.kv",
        "golden_kivi4_v1.kv"}) {
    EXPECT_TRUE(manifest.contains(name)) << name;
    out.push_back({name, ReadFile(GoldenDir() + name), manifest.value(name, json::object())});
  }
  return out;
}

uint64_t Hex(const json& s) { return std::stoull(s.get<std::string>(), nullptr, 16); }

std::string Unhex(const std::string& s) {
  std::string out;
  for (size_t i = 0; i + 1 < s.size(); i += 2) out.push_back(static_cast<char>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return out;
}

// The bits of every element of a layer's K or V, as the manifest lists them (q8_0, q4_0:
// the stored bytes, row by row; kivi4's K: its codes, then its groups' scales and
// minimums, as stored -- a read kivi4 entry's rows are its bytes, its base).
std::vector<uint32_t> Bits(const KvEntry& e, int layer, bool k) {
  std::vector<uint32_t> bits;
  if (KvDtypeGroupedK(e.dtype)) {
    const KvRowsBase& b = e.base;
    EXPECT_EQ(b.n_rows, e.n_tokens());
    if (b.bytes == nullptr) return bits;
    const char* at = b.bytes->data() + b.data_offset + layer * b.layer_bytes + (k ? 0 : b.layer_k_bytes);
    const size_t n = k ? b.layer_k_bytes : b.layer_bytes - b.layer_k_bytes;
    for (size_t i = 0; i < n; ++i) bits.push_back(static_cast<uint8_t>(at[i]));
    return bits;
  }
  if (KvDtypeQuantized(e.dtype)) {
    for (uint8_t b : (k ? e.kq : e.vq)[layer]) bits.push_back(b);
    return bits;
  }
  if (e.dtype == KvDtype::kF16) {
    for (uint16_t h : (k ? e.k16 : e.v16)[layer]) bits.push_back(h);
    return bits;
  }
  for (float f : (k ? e.k : e.v)[layer]) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bits.push_back(u);
  }
  return bits;
}

// A kivi4 entry of the script's inputs (`e`: everything but the rows) written as Attic
// writes a turn that extends a stored entry: each K group but the last a stored entry's
// rows (serialized, then the next one's base), the last group the entry's own f32 rows.
// (A turn's own rows form groups of kKivi4GroupTokens; the golden's are shorter.)
KvEntry Kivi4FromManifest(const json& m, KvEntry e) {
  const auto ends = m["k_group_ends"].get<std::vector<int32_t>>();
  const size_t kvd = e.kv_dim, vrow = e.v_row_size();
  SharedBytes base;
  StatusOr<EntryHeader> bh = DataLossError("no base");
  int nb = 0;
  for (size_t g = 0;; ++g) {
    KvEntry part = e;
    part.tokens.resize(ends[g]);
    part.positions.resize(ends[g]);
    if (g + 1 < ends.size()) part.attachments.clear();
    if (nb > 0) part.base = EntryRowsBase(base, *bh, nb);
    part.k.assign(e.n_layers, {});
    part.vq.assign(e.n_layers, {});
    for (int l = 0; l < e.n_layers; ++l) {
      const auto kb = m["k_input_bits"][l].get<std::vector<uint32_t>>();
      const auto vb = m["v_bits"][l].get<std::vector<uint32_t>>();
      part.k[l].resize((ends[g] - nb) * kvd);
      std::memcpy(part.k[l].data(), kb.data() + nb * kvd, part.k[l].size() * 4);
      part.vq[l].assign(vb.begin() + nb * vrow, vb.begin() + ends[g] * vrow);
    }
    if (g + 1 == ends.size()) return part;
    auto bytes = SerializeEntryBytes(part);
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    base = SharedBytes(std::move(*bytes));
    bh = VerifyEntry(*base);
    EXPECT_TRUE(bh.ok()) << bh.status().ToString();
    nb = ends[g];
  }
}

// The script's inputs as a KvEntry (for Attic's writer).
KvEntry FromManifest(const json& m) {
  KvEntry e;
  e.tenant = m["tenant"];
  e.session_id = m["session_id"];
  e.fingerprint = m["fingerprint"];
  EXPECT_TRUE(ParseKvDtype(m["dtype"].get<std::string>(), &e.dtype));
  e.group = m.value("group", 0);
  e.n_layers = m["n_layers"];
  e.kv_dim = m["kv_dim"];
  e.expires_at_ms = m["expires_at_ms"];
  e.tokens = m["tokens"].get<std::vector<int32_t>>();
  e.positions = m["positions"].get<std::vector<int32_t>>();
  for (int l = 0; l < e.n_layers; ++l) {
    const auto kb = m["k_bits"][l].get<std::vector<uint32_t>>();
    const auto vb = m["v_bits"][l].get<std::vector<uint32_t>>();
    if (KvDtypeQuantized(e.dtype)) {
      e.kq.emplace_back(kb.begin(), kb.end());
      e.vq.emplace_back(vb.begin(), vb.end());
    } else if (e.dtype == KvDtype::kF16) {
      e.k16.emplace_back(kb.begin(), kb.end());
      e.v16.emplace_back(vb.begin(), vb.end());
    } else {
      e.k.emplace_back(kb.size());
      e.v.emplace_back(vb.size());
      std::memcpy(e.k.back().data(), kb.data(), kb.size() * 4);
      std::memcpy(e.v.back().data(), vb.data(), vb.size() * 4);
    }
  }
  for (const json& a : m["attachments"])
    e.attachments.push_back({a["kind"], std::make_shared<const std::string>(Unhex(a["bytes_hex"]))});
  if (KvDtypeGroupedK(e.dtype)) {
    e.kq.clear();
    e.vq.clear();
    return Kivi4FromManifest(m, std::move(e));
  }
  return e;
}

// Everything the manifest says the entry holds, read back by Attic.
void ExpectAsWritten(const KvEntry& e, const json& m, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(e.tenant, m["tenant"]);
  EXPECT_EQ(e.session_id, m["session_id"]);
  EXPECT_EQ(e.fingerprint, m["fingerprint"]);
  EXPECT_EQ(KvDtypeName(e.dtype), m["dtype"]);
  EXPECT_EQ(e.n_layers, m["n_layers"]);
  EXPECT_EQ(e.kv_dim, m["kv_dim"]);
  EXPECT_EQ(e.group, m.value("group", 0));
  EXPECT_EQ(e.expires_at_ms, m["expires_at_ms"]);
  EXPECT_EQ(e.tokens, m["tokens"].get<std::vector<int32_t>>());
  EXPECT_EQ(e.positions, m["positions"].get<std::vector<int32_t>>());
  ASSERT_EQ(e.n_layers, static_cast<int>(m["k_bits"].size()));
  for (int l = 0; l < e.n_layers; ++l) {
    EXPECT_EQ(Bits(e, l, true), m["k_bits"][l].get<std::vector<uint32_t>>()) << "K of layer " << l;
    EXPECT_EQ(Bits(e, l, false), m["v_bits"][l].get<std::vector<uint32_t>>()) << "V of layer " << l;
  }
  ASSERT_EQ(e.attachments.size(), m["attachments"].size());
  for (size_t i = 0; i < e.attachments.size(); ++i) {
    EXPECT_EQ(e.attachments[i].kind, m["attachments"][i]["kind"]);
    EXPECT_EQ(*e.attachments[i].bytes, Unhex(m["attachments"][i]["bytes_hex"]));
  }
  EXPECT_EQ(e.key().ToString(), m["key"]);
}

TEST(GoldenEntry, AtticReadsWhatTheIndependentWriterWrote) {
  for (const Golden& g : LoadGoldens()) {
    SCOPED_TRACE(g.name);
    ASSERT_EQ(g.bytes.size(), g.m["total_bytes"].get<size_t>());
    auto h = ParseEntryHeader(g.bytes);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->data_offset, g.m["data_offset"].get<uint64_t>());
    EXPECT_EQ(h->total_bytes, g.bytes.size());
    ASSERT_EQ(h->layer_checksums.size(), g.m["layer_checksums"].size());
    for (size_t l = 0; l < h->layer_checksums.size(); ++l)
      EXPECT_EQ(h->layer_checksums[l], Hex(g.m["layer_checksums"][l])) << "layer " << l;
    ASSERT_EQ(h->attachments.size(), g.m["attachments"].size());
    for (size_t i = 0; i < h->attachments.size(); ++i)
      EXPECT_EQ(h->attachments[i].checksum, Hex(g.m["attachments"][i]["checksum"]));
    auto header_bytes = EntryHeaderBytes(g.bytes.substr(0, g.m["header_bytes"].get<size_t>()));
    ASSERT_TRUE(header_bytes.ok()) << header_bytes.status().ToString();
    EXPECT_EQ(*header_bytes, g.m["data_offset"].get<uint64_t>());
    for (int l = 0; l < h->meta.n_layers; ++l) EXPECT_TRUE(VerifyEntryLayer(g.bytes, *h, l).ok()) << l;

    auto e = DeserializeEntry(g.bytes, g.m["fingerprint"]);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ExpectAsWritten(*e, g.m, "DeserializeEntry");
    EXPECT_TRUE(ParseEntryKeyName(e->key().ToString()));
  }
}

// Attic's q8_0 and q4_0 row quantization (the compute buffer's formulas, QuantizeRow) of
// the script's f32 inputs gives the bytes the script's own quantizer wrote, and reading
// them back gives scale * int8 (q8_0) or scale * (code - 8) (q4_0) of those bytes. The
// q8_0/q4_0 entry's K rows are q8_0 and its V rows q4_0 (docs/store.md).
TEST(GoldenEntry, QuantizedRowsAreTheIndependentQuantizersBytes) {
  int checked = 0;
  for (const Golden& g : LoadGoldens()) {
    KvDtype dtype;
    ASSERT_TRUE(ParseKvDtype(g.m["dtype"].get<std::string>(), &dtype));
    if (!KvDtypeQuantized(dtype) || KvDtypeGroupedK(dtype)) continue;  // kivi4: the next test
    SCOPED_TRACE(g.name);
    const int kv_dim = g.m["kv_dim"], group = g.m["group"];
    for (const char* which : {"k", "v"}) {
      // The rows' type: q8_0/q4_0 holds K in q8_0, V in q4_0.
      const bool v = which[0] == 'v';
      const KvDtype type = dtype == KvDtype::kQ8_0Q4_0 ? (v ? KvDtype::kQ4_0 : KvDtype::kQ8_0) : dtype;
      const size_t row = KvRowBytes(type, kv_dim, group);
      const int codes = type == KvDtype::kQ8_0 ? kv_dim : kv_dim / 2;  // bytes before the scales
      ASSERT_EQ(row, static_cast<size_t>(codes + 2 * kv_dim / group));
      for (size_t l = 0; l < g.m["k_bits"].size(); ++l) {
        const auto inputs = g.m[std::string(which) + "_input_bits"][l].get<std::vector<uint32_t>>();
        const auto stored = g.m[std::string(which) + "_bits"][l].get<std::vector<uint32_t>>();
        ASSERT_EQ(inputs.size() / kv_dim * row, stored.size());
        for (size_t t = 0; t < inputs.size() / kv_dim; ++t) {
          std::vector<float> x(kv_dim);
          std::memcpy(x.data(), inputs.data() + t * kv_dim, kv_dim * 4);
          std::vector<uint8_t> mine(row);
          QuantizeRow(type, x.data(), kv_dim, group, mine.data());
          const std::vector<uint8_t> theirs(stored.begin() + t * row, stored.begin() + (t + 1) * row);
          EXPECT_EQ(mine, theirs) << which << " layer " << l << " row " << t;
          // Read back: each value is its group's scale (the row's f16 bits) times its int8,
          // or its 4-bit code (group g's byte j: value j low, value j + group / 2 high) - 8.
          std::vector<float> y(kv_dim);
          DequantizeRow(type, theirs.data(), kv_dim, group, y.data());
          for (int j = 0; j < kv_dim; ++j) {
            const int at = codes + 2 * (j / group), in = j % group;
            const uint16_t bits = static_cast<uint16_t>(theirs[at] | theirs[at + 1] << 8);
            const double scale = F16ToF32(bits);
            int q;  // a q4_0 row holds kv_dim / 2 bytes of codes: value j is not byte j
            if (type == KvDtype::kQ4_0) {
              const uint8_t byte = theirs[j / group * group / 2 + in % (group / 2)];
              q = (in < group / 2 ? byte & 15 : byte >> 4) - 8;
            } else {
              q = static_cast<int8_t>(theirs[j]);
            }
            EXPECT_EQ(y[j], scale * q) << j;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 36);  // q8_0, q4_0 and q8_0/q4_0: 2 layers x K, V x 3 rows each
}

// kivi4's K: Attic's per-channel quantizer (QuantizeKGroup) of the script's f32 inputs,
// group by group, gives the codes, scales and minimums the script's own quantizer wrote;
// every K value Attic reads back (DequantizeEntryKRow) is minimum + scale * code of those
// bytes, taken from them here. V's rows are q4_0 (the test above checks that type).
TEST(GoldenEntry, Kivi4KIsTheIndependentQuantizersBytes) {
  int checked = 0;
  for (const Golden& g : LoadGoldens()) {
    if (g.m["dtype"] != "kivi4") continue;
    const int kv_dim = g.m["kv_dim"];
    const auto ends = g.m["k_group_ends"].get<std::vector<int32_t>>();
    const int n = ends.back();
    for (size_t l = 0; l < g.m["k_bits"].size(); ++l) {
      const auto inputs = g.m["k_input_bits"][l].get<std::vector<uint32_t>>();
      const auto stored = g.m["k_bits"][l].get<std::vector<uint32_t>>();
      const std::vector<uint8_t> k(stored.begin(), stored.end());
      ASSERT_EQ(k.size(), static_cast<size_t>(n * kv_dim / 2 + ends.size() * 4 * kv_dim));
      const uint8_t* params = k.data() + n * kv_dim / 2;
      int first = 0;
      for (size_t grp = 0; grp < ends.size(); first = ends[grp++]) {
        const int rows = ends[grp] - first;
        std::vector<float> x(static_cast<size_t>(rows) * kv_dim);
        std::memcpy(x.data(), inputs.data() + first * kv_dim, x.size() * 4);
        std::vector<uint8_t> codes(static_cast<size_t>(rows) * kv_dim / 2);
        std::vector<uint16_t> p(2 * kv_dim);
        QuantizeKGroup(x.data(), rows, kv_dim, codes.data(), p.data());
        EXPECT_EQ(0, std::memcmp(codes.data(), k.data() + first * kv_dim / 2, codes.size())) << "group " << grp;
        EXPECT_EQ(0, std::memcmp(p.data(), params + grp * 4 * kv_dim, 4 * kv_dim)) << "group " << grp;
      }
      const std::string_view layer(reinterpret_cast<const char*>(k.data()), k.size());
      std::vector<float> y(kv_dim);
      for (int t = 0; t < n; ++t) {
        DequantizeEntryKRow(layer.data(), n, ends, kv_dim, t, y.data());
        const size_t grp = std::upper_bound(ends.begin(), ends.end(), t) - ends.begin();
        for (int c = 0; c < kv_dim; ++c) {
          const uint8_t* pc = params + grp * 4 * kv_dim;
          const double scale = F16ToF32(static_cast<uint16_t>(pc[2 * c] | pc[2 * c + 1] << 8));
          const double min = F16ToF32(static_cast<uint16_t>(pc[2 * (kv_dim + c)] | pc[2 * (kv_dim + c) + 1] << 8));
          const int code = (k[t * kv_dim / 2 + c / 2] >> (c % 2 * 4)) & 15;
          // scale * code is exact in f32 (11 + 4 bits): the value is one rounding of the sum.
          EXPECT_EQ(y[c], static_cast<float>(min + scale * code)) << "layer " << l << " token " << t << " channel " << c;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 10);  // 2 layers x 5 tokens
}

// The first byte where two buffers differ (for a readable failure).
std::string FirstDifference(const std::string& a, const std::string& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i]) return "first difference at byte " + std::to_string(i);
  return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
}

TEST(GoldenEntry, AtticWritesTheSameBytesFromTheSameInputs) {
  for (const Golden& g : LoadGoldens()) {
    SCOPED_TRACE(g.name);
    const KvEntry e = FromManifest(g.m);
    EXPECT_EQ(e.SerializedBytes(), g.bytes.size());
    auto out = SerializeEntry(e);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_TRUE(*out == g.bytes) << FirstDifference(*out, g.bytes);
    EXPECT_EQ(e.key().ToString(), g.m["key"]);
  }
}

// Every bit of the header (magic through the header checksum) and every byte of the
// layers: a damaged entry is DataLoss, never another entry.
TEST(GoldenEntry, EveryDamagedHeaderOrLayerByteIsDataLoss) {
  for (const Golden& g : LoadGoldens()) {
    SCOPED_TRACE(g.name);
    const std::string fp = g.m["fingerprint"];
    const size_t header = g.m["header_bytes"];
    const size_t data = g.m["data_offset"];
    // Each layer: its K then its V elements, as listed (bytes of each: f16 2, f32 4, a
    // quantized type's listed bytes 1).
    const size_t elem = g.m["dtype"] == "f16" ? 2 : g.m["dtype"] == "f32" ? 4 : 1;
    const size_t layers_end =
        data + g.m["n_layers"].get<size_t>() * (g.m["k_bits"][0].size() + g.m["v_bits"][0].size()) * elem;
    ASSERT_LE(layers_end, g.bytes.size());
    std::vector<std::string> not_data_loss;
    auto check = [&](size_t at, uint8_t mask) {
      std::string bad = g.bytes;
      bad[at] = static_cast<char>(bad[at] ^ mask);
      auto r = DeserializeEntry(bad, fp);
      if (r.status().code() != StatusCode::kDataLoss)
        not_data_loss.push_back("byte " + std::to_string(at) + " ^ " + std::to_string(mask) + ": " +
                                r.status().ToString());
      if (at < header && ParseEntryHeader(bad).status().code() != StatusCode::kDataLoss)
        not_data_loss.push_back("header byte " + std::to_string(at) + " ^ " + std::to_string(mask) +
                                " parsed by ParseEntryHeader");
    };
    for (size_t at = 0; at < header; ++at) {
      for (int bit = 0; bit < 8; ++bit) check(at, static_cast<uint8_t>(1u << bit));
      check(at, 0xff);
    }
    for (size_t at = data; at < layers_end; ++at) check(at, 0x01);
    EXPECT_TRUE(not_data_loss.empty()) << not_data_loss.size() << " damaged entries not DataLoss, e.g. "
                                       << not_data_loss.front();
  }
}

TEST(GoldenEntry, EveryCutAndAnExtensionIsDataLoss) {
  for (const Golden& g : LoadGoldens()) {
    SCOPED_TRACE(g.name);
    const std::string fp = g.m["fingerprint"];
    std::vector<size_t> not_data_loss;
    for (size_t n = 0; n < g.bytes.size(); ++n)
      if (DeserializeEntry(std::string_view(g.bytes).substr(0, n), fp).status().code() != StatusCode::kDataLoss)
        not_data_loss.push_back(n);
    EXPECT_TRUE(not_data_loss.empty()) << not_data_loss.size() << " cuts not DataLoss, e.g. length "
                                       << not_data_loss.front();
    EXPECT_EQ(DeserializeEntry(g.bytes + std::string(1, '\0'), fp).status().code(), StatusCode::kDataLoss);
  }
}

// A damaged attachment is dropped on its own (docs/store.md): the KV is still served.
TEST(GoldenEntry, ADamagedAttachmentIsDroppedAndTheKvServed) {
  for (const Golden& g : LoadGoldens()) {
    if (g.m["attachments"].empty()) continue;
    SCOPED_TRACE(g.name);
    std::string bad = g.bytes;
    bad.back() = static_cast<char>(bad.back() ^ 0x01);  // the last attachment's last byte
    auto e = DeserializeEntry(bad, g.m["fingerprint"]);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->attachments.size(), g.m["attachments"].size() - 1);
    json without = g.m;
    without["attachments"].erase(without["attachments"].size() - 1);
    ExpectAsWritten(*e, without, "attachment dropped");
  }
}

// The golden files placed where an SSD tier keeps entries (DIR/<fingerprint field of
// the key>/<key>.kv) come back on a restart: found by session and read as written.
TEST(GoldenEntry, AnSsdStoreRestoresTheGoldenFiles) {
  testing::ScratchDir dir("golden");
  const std::vector<Golden> goldens = LoadGoldens();
  StoreOptions o;
  o.fingerprint = goldens[0].m["fingerprint"];
  o.ssd_dir = dir.path();
  o.default_ttl_ms = 0;
  { ASSERT_TRUE(KvStore::Open(o).ok()); }  // makes the store directory (marker, model directory)
  const std::string key = goldens[0].m["key"];
  const std::string model_dir = SsdTier::ModelDir(dir.path(), o.fingerprint);
  EXPECT_EQ(std::filesystem::path(model_dir).filename().string(), key.substr(17, 16));
  for (const Golden& g : goldens) {
    std::ofstream f(model_dir + "/" + g.m["key"].get<std::string>() + ".kv", std::ios::binary);
    f << g.bytes;
  }
  auto s = KvStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->open_report().ssd_entries, goldens.size());
  EXPECT_EQ((*s)->open_report().removed_corrupt, 0u);
  const json& m = goldens[0].m;  // f32: the store's dtype
  std::vector<int32_t> prompt = m["tokens"].get<std::vector<int32_t>>();
  prompt.push_back(9);
  auto hit = (*s)->Lookup(m["tenant"], m["session_id"], prompt);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->key, key);
  EXPECT_EQ(hit->n_tokens, static_cast<int>(m["tokens"].size()));
  auto e = (*s)->Load(key);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ExpectAsWritten(*e, m, "restored from SSD");
}

}  // namespace
}  // namespace attic::store
