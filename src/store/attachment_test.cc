// Entry attachments (entry.h "Attachments"): blobs saved with an entry (a PQ index)
// round-trip through the serialized form (format version 2; entries without them stay
// version 1), travel with the entry through the DRAM and SSD tiers, demotion, promotion
// and a restart, count in its bytes, and a damaged attachment is dropped on its own
// while the KV, intact, is still served; damage anywhere else is a miss as before.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "attic/store/kv_source.h"
#include "attic/store/kv_store.h"
#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::MakeEntry;
using testing::Range;
using testing::ScratchDir;

constexpr char kKind[] = "pq-index";

std::shared_ptr<const std::string> Blob(size_t n, char seed) {
  std::string b(n, '\0');
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<char>(seed + i * 7);
  return std::make_shared<const std::string>(std::move(b));
}

KvEntry WithAttachment(const std::vector<int32_t>& tokens, const std::string& session, size_t n = 300) {
  KvEntry e = MakeEntry(tokens, session);
  e.attachments.push_back({kKind, Blob(n, 3)});
  return e;
}

uint32_t VersionOf(std::string_view bytes) {
  uint32_t v;
  std::memcpy(&v, bytes.data() + 8, 4);
  return v;
}

TEST(EntryAttachment, RoundTripsAsVersion2WithTheLayersWhereVersion1PutsThem) {
  const KvEntry plain = MakeEntry(Range(0, 20), "s");
  KvEntry e = plain;
  e.attachments.push_back({kKind, Blob(300, 1)});
  e.attachments.push_back({"other", Blob(5, 9)});
  const std::string v1 = *SerializeEntry(plain);
  const std::string v2 = *SerializeEntry(e);
  EXPECT_EQ(VersionOf(v1), 1u);  // no attachment: version 1, as always
  EXPECT_EQ(VersionOf(v2), 2u);
  EXPECT_EQ(v2.size(), e.SerializedBytes());
  EXPECT_EQ(v2.size(), v1.size() + 305);  // counted in the entry's bytes (header still one page)
  auto h1 = ParseEntryHeader(v1);
  auto h2 = ParseEntryHeader(v2);
  ASSERT_TRUE(h1.ok() && h2.ok());
  EXPECT_EQ(h2->data_offset, h1->data_offset);
  EXPECT_EQ(std::string_view(v2).substr(h2->data_offset, 2 * h2->layer_bytes),
            std::string_view(v1).substr(h1->data_offset, 2 * h1->layer_bytes));
  EXPECT_EQ(*EntryHeaderBytes(v2.substr(0, 4096)), h2->data_offset);  // layer-wise reads find the layers
  ASSERT_EQ(h2->attachments.size(), 2u);
  EXPECT_EQ(*EntryAttachmentBytes(v2, *h2, kKind), *e.attachments[0].bytes);
  EXPECT_EQ(*EntryAttachmentBytes(v2, *h2, "other"), *e.attachments[1].bytes);
  EXPECT_EQ(EntryAttachmentBytes(v2, *h2, "none").status().code(), StatusCode::kNotFound);
  auto back = DeserializeEntry(v2, "fp-A");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->k, e.k);
  ASSERT_EQ(back->attachments.size(), 2u);
  EXPECT_EQ(*back->attachment(kKind)->bytes, *e.attachments[0].bytes);
  EXPECT_EQ(*back->attachment("other")->bytes, *e.attachments[1].bytes);
  // An entry cut short no longer matches what the attachments describe: they go.
  back->TruncateTo(10);
  EXPECT_TRUE(back->attachments.empty());
}

TEST(EntryAttachment, ADamagedAttachmentIsDroppedAndTheKvStillVerifies) {
  const KvEntry e = WithAttachment(Range(0, 20), "s");
  const std::string bytes = *SerializeEntry(e);
  for (size_t off : {bytes.size() - 300, bytes.size() - 150, bytes.size() - 1}) {
    std::string bad = bytes;
    bad[off] ^= 0x04;
    auto h = VerifyEntry(bad, "fp-A");
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(EntryAttachmentBytes(bad, *h, kKind).status().code(), StatusCode::kDataLoss);
    auto back = DeserializeEntry(bad, "fp-A");
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(back->attachments.empty());
    EXPECT_EQ(back->k, e.k);
  }
}

TEST(EntryAttachment, DamageToTheTableOrTheLayersAndAnyTruncationIsDataLoss) {
  const KvEntry e = WithAttachment(Range(0, 20), "s");
  const std::string bytes = *SerializeEntry(e);
  auto h = ParseEntryHeader(bytes);
  ASSERT_TRUE(h.ok());
  // The attachment table follows the fingerprint: its count, kind, size, checksum.
  const size_t table = 8 + 4 * 5 + 8 + 4 + e.tenant.size() + 4 + e.session_id.size() + 4 + e.fingerprint.size();
  for (size_t off : {table, table + 5, table + 4 + 4 + sizeof(kKind) - 1, table + 20,
                     static_cast<size_t>(h->data_offset + 5), static_cast<size_t>(h->data_offset + h->layer_bytes + 9)}) {
    std::string bad = bytes;
    bad[off] ^= 0x10;
    EXPECT_EQ(DeserializeEntry(bad, "fp-A").status().code(), StatusCode::kDataLoss) << "offset " << off;
  }
  for (size_t n : {size_t{100}, size_t{4096}, bytes.size() - 300, bytes.size() - 1}) {
    EXPECT_EQ(DeserializeEntry(std::string_view(bytes).substr(0, n), "fp-A").status().code(), StatusCode::kDataLoss)
        << n;
  }
}

TEST(EntryAttachment, ValidateRejectsBadAttachments) {
  KvEntry e = MakeEntry(Range(0, 8));
  e.attachments.push_back({"", Blob(4, 1)});
  EXPECT_FALSE(ValidateEntry(e).ok());
  e.attachments = {{kKind, nullptr}};
  EXPECT_FALSE(ValidateEntry(e).ok());
  e.attachments = {{kKind, Blob(4, 1)}, {kKind, Blob(4, 2)}};
  EXPECT_FALSE(ValidateEntry(e).ok());
  e.attachments = {{kKind, Blob(4, 1)}, {"b", Blob(0, 2)}};
  EXPECT_TRUE(ValidateEntry(e).ok());
}

// --- In the store ----------------------------------------------------------------------

class StoreAttachment : public ::testing::Test {
 protected:
  // DRAM holds one entry with its attachment; the SSD several.
  StoreOptions Options(bool dram = true) const {
    StoreOptions o;
    o.fingerprint = "fp-A";
    const uint64_t entry = WithAttachment(Range(0, 32), "a").SerializedBytes();
    o.dram_bytes = dram ? entry + entry / 2 : 0;
    o.ssd_dir = dir_.path();
    o.ssd_bytes = 8 * entry;
    o.policy = PolicyKind::kLru;
    o.default_ttl_ms = 0;
    o.prefix_block = 8;
    o.write_buffer_bytes = 0;
    return o;
  }
  std::unique_ptr<KvStore> Open(bool dram = true) {
    auto s = KvStore::Open(Options(dram));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(s).value();
  }
  std::string PathOf(const KvEntry& e) const {
    return SsdTier::ModelDir(dir_.path(), "fp-A") + "/" + e.key().ToString() + ".kv";
  }
  void Rewrite(const std::string& path, const std::function<void(std::string&)>& damage) {
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    damage(bytes);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
  ScratchDir dir_{"attachment"};
};

TEST_F(StoreAttachment, SurvivesDemotionEvictionFromDramPromotionAndRestart) {
  const KvEntry a = WithAttachment(Range(0, 32), "a");
  const KvEntry b = WithAttachment(Range(1000, 32), "b");
  const std::string key = a.key().ToString();
  {
    auto s = Open();
    ASSERT_TRUE(s->Save(a).ok());
    EXPECT_EQ(s->Stats().dram_bytes, a.SerializedBytes());  // counted with the attachment
    ASSERT_TRUE(s->Save(b).ok());                          // a leaves DRAM for the SSD
    EXPECT_EQ(s->TierOf(key), TierLevel::kSsd);
    EXPECT_EQ(s->Stats().evictions_dram, 1u);
    EXPECT_TRUE(std::filesystem::exists(PathOf(a)));
    // Read from the SSD (verified), as a turn reads it.
    auto f = s->Fetch(key);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    auto src = KvSource::Stored(f->bytes, f->header, key);
    auto got = src->attachment(kKind);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(*got, *a.attachments[0].bytes);
    // Promoted to DRAM by that read: the DRAM copy carries it too.
    EXPECT_EQ(s->TierOf(key), TierLevel::kDram);
    auto d = s->FetchFromDram(key);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*EntryAttachmentBytes(*d->bytes, d->header, kKind), *a.attachments[0].bytes);
  }
  // A restart: a new store over the same directory (no DRAM tier: every read is the SSD's).
  auto s = Open(/*dram=*/false);
  EXPECT_EQ(s->open_report().ssd_entries, 2u);
  auto m = s->Lookup("default", "a", Range(0, 40));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->tier, TierLevel::kSsd);
  auto loaded = s->Load(m->key);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->k, a.k);
  ASSERT_NE(loaded->attachment(kKind), nullptr);
  EXPECT_EQ(*loaded->attachment(kKind)->bytes, *a.attachments[0].bytes);
  EXPECT_EQ(s->Stats().corrupt, 0u);
  EXPECT_EQ(s->Stats().corrupt_attachments, 0u);
}

TEST_F(StoreAttachment, OldEntriesWithoutAttachmentStillLoad) {
  const KvEntry plain = MakeEntry(Range(0, 32), "old");
  {
    auto s = Open(false);
    ASSERT_TRUE(s->Save(plain).ok());
  }
  std::ifstream in(PathOf(plain), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(VersionOf(bytes), 1u);
  auto s = Open();
  auto m = s->Lookup("default", "old", Range(0, 40));
  ASSERT_TRUE(m.has_value());
  auto f = s->Fetch(m->key);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(KvSource::Stored(f->bytes, f->header, m->key)->attachment(kKind).status().code(), StatusCode::kNotFound);
}

// A flipped byte in the attachment on disk: found at restart and at every read, the
// attachment dropped (whatever tier it is read from afterwards), the KV served.
TEST_F(StoreAttachment, AFlippedByteInTheAttachmentOnDiskDropsOnlyTheAttachment) {
  const KvEntry a = WithAttachment(Range(0, 32), "a");
  {
    auto s = Open(false);
    ASSERT_TRUE(s->Save(a).ok());
  }
  Rewrite(PathOf(a), [](std::string& b) { b[b.size() - 100] ^= 0x20; });  // inside the 300-byte attachment
  auto s = Open();
  EXPECT_EQ(s->open_report().removed_corrupt, 0u);
  EXPECT_EQ(s->Stats().corrupt_attachments, 1u);  // seen when the entry was verified at open
  auto m = s->Lookup("default", "a", Range(0, 40));
  ASSERT_TRUE(m.has_value());
  auto f = s->Fetch(m->key);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(s->Stats().corrupt_attachments, 2u);
  auto src = KvSource::Stored(f->bytes, f->header, m->key);
  EXPECT_EQ(src->attachment(kKind).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(std::memcmp(src->layer(1).k, a.k[1].data(), a.k[1].size() * sizeof(float)), 0);  // the KV is served
  // Promoted by the read: the DRAM copy's attachment is checked on its read as well.
  ASSERT_EQ(s->TierOf(m->key), TierLevel::kDram);
  auto d = s->FetchFromDram(m->key);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(EntryAttachmentBytes(*d->bytes, d->header, kKind).status().code(), StatusCode::kDataLoss);
  auto loaded = s->Load(m->key);
  ASSERT_TRUE(loaded.ok());
  EXPECT_TRUE(loaded->attachments.empty());
  EXPECT_EQ(loaded->v, a.v);
  EXPECT_EQ(s->Stats().corrupt, 0u);
}

// The store's existing guarantees for an entry that carries an attachment: damage to its
// KV or header, or a file cut short (inside the attachment too), is a clean miss at
// restart, and the file is deleted; an interrupted write is never visible.
TEST_F(StoreAttachment, DamageElsewhereIsACleanMissAsForAnyEntry) {
  const KvEntry good = WithAttachment(Range(0, 32), "good");
  const KvEntry victim = WithAttachment(Range(500, 32), "victim");
  const std::vector<std::function<void(std::string&)>> damages = {
      [](std::string& b) { b[4096 + 40] ^= 0x01; },     // layer 0's K
      [](std::string& b) { b[60] ^= 0x01; },            // the header
      [](std::string& b) { b.resize(b.size() - 10); },  // cut inside the attachment
      [](std::string& b) { b.resize(b.size() - 400); },  // cut inside the last layer
  };
  for (size_t i = 0; i < damages.size(); ++i) {
    SCOPED_TRACE(i);
    std::filesystem::remove_all(dir_.path());
    std::filesystem::create_directories(dir_.path());
    {
      auto s = Open(false);
      ASSERT_TRUE(s->Save(good).ok());
      ASSERT_TRUE(s->Save(victim).ok());
    }
    Rewrite(PathOf(victim), damages[i]);
    auto s = Open();
    EXPECT_FALSE(s->Lookup("default", "victim", Range(500, 40)).has_value());
    EXPECT_FALSE(std::filesystem::exists(PathOf(victim)));
    EXPECT_EQ(s->Stats().corrupt, 1u);
    auto m = s->Lookup("default", "good", Range(0, 40));
    ASSERT_TRUE(m.has_value());
    auto loaded = s->Load(m->key);
    ASSERT_TRUE(loaded.ok());
    ASSERT_NE(loaded->attachment(kKind), nullptr);
  }
  // A save killed before its rename: only a temporary file, removed at open.
  std::filesystem::rename(PathOf(good), PathOf(good) + ".tmp");
  auto s = Open();
  EXPECT_FALSE(s->Lookup("default", "good", Range(0, 40)).has_value());
  EXPECT_FALSE(std::filesystem::exists(PathOf(good) + ".tmp"));
}

}  // namespace
}  // namespace attic::store
