#include "attic/store/kv_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::MakeEntry;
using testing::Range;
using testing::ScratchDir;
using testing::Gate;

// Every test entry below has 32 tokens of 2 layers x kv_dim 8: 8 KiB serialized.
const uint64_t kEntry = MakeEntry(Range(0, 32)).SerializedBytes();

StoreOptions Options(uint64_t dram_entries, const std::string& ssd_dir = "", uint64_t ssd_entries = 0,
                     PolicyKind policy = PolicyKind::kSchedulerAware) {
  StoreOptions o;
  o.fingerprint = "fp-A";
  o.dram_bytes = dram_entries * kEntry;
  o.ssd_dir = ssd_dir;
  o.ssd_bytes = ssd_entries * kEntry;
  o.policy = policy;
  o.default_ttl_ms = 0;
  o.prefix_block = 8;
  return o;
}

std::unique_ptr<KvStore> OpenStore(const StoreOptions& o, const Clock* clock = nullptr) {
  auto s = KvStore::Open(o, clock);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

void ExpectWithinCapacity(const KvStore& s) {
  StoreStats st = s.Stats();
  EXPECT_LE(st.dram_bytes, st.dram_capacity);
  EXPECT_LE(st.ssd_bytes, st.ssd_capacity);
}

TEST(KvStore, SessionSaveLookupLoad) {
  auto s = OpenStore(Options(4));
  KvEntry e = MakeEntry(Range(100, 32), "chat-1", "alice");
  ASSERT_TRUE(s->Save(e).ok());
  // Next turn: history + new tokens.
  std::vector<int32_t> prompt = Range(100, 32);
  prompt.push_back(7);
  auto m = s->Lookup("alice", "chat-1", prompt);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->n_tokens, 32);
  EXPECT_EQ(m->tier, TierLevel::kDram);
  auto loaded = s->Load(m->key);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->k, e.k);
  EXPECT_EQ(loaded->v, e.v);
  EXPECT_EQ(s->Stats().hits_dram, 1u);
}

TEST(KvStore, PrefixLookupFindsLongestWithoutSession) {
  auto s = OpenStore(Options(8));
  ASSERT_TRUE(s->Save(MakeEntry(Range(0, 32))).ok());
  std::vector<int32_t> longer = Range(0, 32);
  longer[20] = 999;  // diverges at 20
  ASSERT_TRUE(s->Save(MakeEntry(longer)).ok());
  std::vector<int32_t> prompt = Range(0, 40);
  auto m = s->Lookup("default", "", prompt);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->n_tokens, 32);
  std::vector<int32_t> p2 = longer;
  p2.resize(27);  // partial block: the exact common prefix counts, not only whole blocks
  auto m2 = s->Lookup("default", "", p2);
  ASSERT_TRUE(m2.has_value());
  EXPECT_EQ(m2->n_tokens, 27);
  EXPECT_FALSE(s->Lookup("default", "", Range(500, 40)).has_value());
  EXPECT_EQ(s->Stats().misses, 1u);
}

TEST(KvStore, LookupsAreTenantScoped) {
  auto s = OpenStore(Options(4));
  ASSERT_TRUE(s->Save(MakeEntry(Range(0, 32), "shared-id", "alice")).ok());
  EXPECT_FALSE(s->Lookup("bob", "shared-id", Range(0, 40)).has_value());
  EXPECT_FALSE(s->Lookup("bob", "", Range(0, 40)).has_value());
  EXPECT_FALSE(s->GetSession("bob", "shared-id").ok());
  EXPECT_TRUE(s->Lookup("alice", "", Range(0, 40)).has_value());
}

TEST(KvStore, NewTurnReplacesSessionEntry) {
  auto s = OpenStore(Options(4));
  ASSERT_TRUE(s->Save(MakeEntry(Range(0, 16), "c")).ok());
  ASSERT_TRUE(s->Save(MakeEntry(Range(0, 32), "c")).ok());
  EXPECT_EQ(s->Stats().entries, 1u);
  auto info = s->GetSession("default", "c");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->n_tokens, 32);
  ASSERT_TRUE(s->EraseSession("default", "c").ok());
  EXPECT_EQ(s->EraseSession("default", "c").code(), StatusCode::kNotFound);
  EXPECT_EQ(s->Stats().entries, 0u);
  EXPECT_EQ(s->Stats().dram_bytes, 0u);
}

TEST(KvStore, FullDramDemotesToSsdAndLoadPromotes) {
  ScratchDir dir("demote");
  auto s = OpenStore(Options(2, dir.path(), 4, PolicyKind::kLru));
  std::vector<KvEntry> e;
  for (int i = 0; i < 3; ++i) {
    e.push_back(MakeEntry(Range(1000 * i, 32), "s" + std::to_string(i), "default", 2, 8, "fp-A", i));
    ASSERT_TRUE(s->Save(e.back()).ok());
    ExpectWithinCapacity(*s);
  }
  auto first = s->Lookup("default", "s0", Range(0, 33));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->tier, TierLevel::kSsd);
  EXPECT_EQ(s->Stats().evictions_dram, 1u);
  auto loaded = s->Load(first->key);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->k, e[0].k);
  EXPECT_EQ(s->TierOf(first->key), TierLevel::kDram);
  ExpectWithinCapacity(*s);
  EXPECT_GT(s->Stats().bytes_ssd_to_dram, 0u);
}

TEST(KvStore, CapacitiesAreHardBoundsUnderOverfill) {
  ScratchDir dir("overfill");
  for (PolicyKind p : {PolicyKind::kSchedulerAware, PolicyKind::kLru, PolicyKind::kFifo}) {
    std::filesystem::remove_all(dir.path());
    auto s = OpenStore(Options(3, dir.path(), 5, p));
    for (int i = 0; i < 40; ++i) {
      int n = 8 + (i * 7) % 40;  // mixed sizes
      ASSERT_TRUE(s->Save(MakeEntry(Range(i * 100, n), "s" + std::to_string(i % 12))).ok());
      std::vector<QueuedJob> q = {{"default", "s" + std::to_string((i + 1) % 12), Range((i + 1) * 100, 8)}};
      s->SetLookAhead(q);
      ExpectWithinCapacity(*s);
    }
    EXPECT_GT(s->Stats().evictions_ssd, 0u);
    EXPECT_EQ(s->Save(MakeEntry(Range(0, 400))).code(), StatusCode::kResourceExhausted);
  }
}

TEST(KvStore, TtlExpires) {
  VirtualClock clock;
  StoreOptions o = Options(4);
  o.default_ttl_ms = 1000;
  auto s = OpenStore(o, &clock);
  ASSERT_TRUE(s->Save(MakeEntry(Range(0, 32), "a")).ok());
  ASSERT_TRUE(s->Save(MakeEntry(Range(100, 32), "b"), "", 5000).ok());
  clock.Advance(999);
  EXPECT_TRUE(s->Lookup("default", "a", Range(0, 33)).has_value());
  clock.Advance(1);
  EXPECT_FALSE(s->Lookup("default", "a", Range(0, 33)).has_value());
  EXPECT_EQ(s->ExpireNow(), 1);
  EXPECT_TRUE(s->GetSession("default", "b").ok());
  clock.Advance(5000);
  EXPECT_EQ(s->GetSession("default", "b").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s->Stats().entries, 0u);
}

TEST(KvStore, ListSessionsIsTenantScopedSortedAndSkipsExpired) {
  VirtualClock clock;
  StoreOptions o = Options(8);
  o.default_ttl_ms = 1000;
  auto s = OpenStore(o, &clock);
  ASSERT_TRUE(s->Save(MakeEntry(Range(0, 32), "b", "alice"), "", 0).ok());
  ASSERT_TRUE(s->Save(MakeEntry(Range(100, 16), "a", "alice"), "", 0).ok());
  ASSERT_TRUE(s->Save(MakeEntry(Range(200, 32), "c", "alice")).ok());  // expires after 1 s
  ASSERT_TRUE(s->Save(MakeEntry(Range(300, 32), "a", "bob")).ok());
  ASSERT_TRUE(s->Save(MakeEntry(Range(400, 32), "", "alice")).ok());  // no session id: not a session
  std::vector<SessionInfo> alice = s->ListSessions("alice");
  ASSERT_EQ(alice.size(), 3u);
  EXPECT_EQ(alice[0].session_id, "a");
  EXPECT_EQ(alice[0].n_tokens, 16);
  EXPECT_EQ(alice[0].tenant, "alice");
  EXPECT_EQ(alice[0].expires_at_ms, 0);
  EXPECT_EQ(alice[1].session_id, "b");
  EXPECT_EQ(alice[1].n_tokens, 32);
  EXPECT_EQ(alice[2].session_id, "c");
  EXPECT_EQ(alice[2].expires_at_ms, clock.NowMs() + 1000);
  ASSERT_EQ(s->ListSessions("bob").size(), 1u);
  EXPECT_TRUE(s->ListSessions("carol").empty());
  clock.Advance(1000);
  alice = s->ListSessions("alice");
  ASSERT_EQ(alice.size(), 2u);
  EXPECT_EQ(alice[1].session_id, "b");
}

TEST(KvStore, SsdTierSurvivesRestart) {
  ScratchDir dir("restart");
  KvEntry e = MakeEntry(Range(0, 32), "chat");
  {
    auto s = OpenStore(Options(0, dir.path(), 4));  // no DRAM: straight to SSD
    ASSERT_TRUE(s->Save(e).ok());
  }
  auto s = OpenStore(Options(4, dir.path(), 4));
  auto m = s->Lookup("default", "chat", Range(0, 40));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->tier, TierLevel::kSsd);
  auto loaded = s->Load(m->key);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->v, e.v);
}

// DRAM goes with the process; PersistDram (a server's stop) moves it to SSD first, so
// that the next store on the directory finds every session, from SSD, byte for byte.
TEST(KvStore, PersistDramMovesDramEntriesToSsdForTheNextStart) {
  ScratchDir dir("persist");
  std::vector<KvEntry> e;
  for (int i = 0; i < 3; ++i)
    e.push_back(MakeEntry(Range(1000 * i, 32), "s" + std::to_string(i), "default", 2, 8, "fp-A", i));
  {
    auto s = OpenStore(Options(8, dir.path(), 8));
    ASSERT_TRUE(s->Save(e[0]).ok());
    EXPECT_EQ(s->TierOf(e[0].key().ToString()), TierLevel::kDram);
  }
  EXPECT_FALSE(OpenStore(Options(8, dir.path(), 8))->Lookup("default", "s0", Range(0, 33)).has_value())
      << "a DRAM entry survived without PersistDram";
  {
    auto s = OpenStore(Options(8, dir.path(), 8));
    for (const KvEntry& x : e) ASSERT_TRUE(s->Save(x).ok());
    const KvStore::PersistReport r = s->PersistDram();
    EXPECT_EQ(r.entries, 3u);
    EXPECT_EQ(r.bytes_written, 3 * kEntry);
    EXPECT_EQ(r.dropped, 0u);
    EXPECT_EQ(s->Stats().dram_bytes, 0u);
    EXPECT_EQ(s->PersistDram().entries, 0u);  // nothing left to move
  }
  auto s = OpenStore(Options(8, dir.path(), 8));
  for (int i = 0; i < 3; ++i) {
    auto m = s->Lookup("default", "s" + std::to_string(i), Range(1000 * i, 33));
    ASSERT_TRUE(m.has_value()) << i;
    EXPECT_EQ(m->tier, TierLevel::kSsd);
    auto loaded = s->Load(m->key);
    ASSERT_TRUE(loaded.ok());
    EXPECT_EQ(loaded->k, e[i].k);
    EXPECT_EQ(loaded->v, e[i].v);
  }
}

// An SSD tier too small for all of DRAM keeps the most recently used entries; without an
// SSD tier nothing moves.
TEST(KvStore, PersistDramKeepsTheMostRecentlyUsedWhenTheSsdIsFull) {
  ScratchDir dir("persist-full");
  {
    auto s = OpenStore(Options(8, dir.path(), 2, PolicyKind::kLru));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->Save(MakeEntry(Range(1000 * i, 32), "s" + std::to_string(i))).ok());
    ASSERT_TRUE(s->Lookup("default", "s0", Range(0, 33)).has_value());
    ASSERT_TRUE(s->Load(s->Lookup("default", "s0", Range(0, 33))->key).ok());  // s0 used last now
    const KvStore::PersistReport r = s->PersistDram();
    EXPECT_EQ(r.entries, 2u);
    EXPECT_EQ(r.dropped, 1u);
    ExpectWithinCapacity(*s);
  }
  auto s = OpenStore(Options(8, dir.path(), 2, PolicyKind::kLru));
  EXPECT_TRUE(s->Lookup("default", "s0", Range(0, 33)).has_value());
  EXPECT_FALSE(s->Lookup("default", "s1", Range(1000, 33)).has_value());
  EXPECT_TRUE(s->Lookup("default", "s2", Range(2000, 33)).has_value());

  auto dram_only = OpenStore(Options(8));
  ASSERT_TRUE(dram_only->Save(MakeEntry(Range(0, 32), "s")).ok());
  const KvStore::PersistReport r = dram_only->PersistDram();
  EXPECT_EQ(r.entries + r.dropped + r.bytes_written, 0u);
  EXPECT_EQ(dram_only->TierOf(MakeEntry(Range(0, 32), "s").key().ToString()), TierLevel::kDram);
}

// Fault injection: each damaged entry is a clean miss after restart and is deleted.
class KvStoreFault : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = OpenStore(Options(0, dir_.path(), 8));
    ASSERT_TRUE(s->Save(MakeEntry(Range(0, 32), "good")).ok());
    ASSERT_TRUE(s->Save(MakeEntry(Range(500, 32), "victim")).ok());
    victim_path_ =
        SsdTier::ModelDir(dir_.path(), "fp-A") + "/" + MakeEntry(Range(500, 32), "victim").key().ToString() + ".kv";
    ASSERT_TRUE(std::filesystem::exists(victim_path_));
  }
  void ExpectCleanMiss() {
    auto s = OpenStore(Options(4, dir_.path(), 8));
    EXPECT_FALSE(s->Lookup("default", "victim", Range(500, 40)).has_value());
    EXPECT_FALSE(s->GetSession("default", "victim").ok());
    EXPECT_FALSE(std::filesystem::exists(victim_path_));
    auto good = s->Lookup("default", "good", Range(0, 40));
    ASSERT_TRUE(good.has_value());
    EXPECT_TRUE(s->Load(good->key).ok());
    EXPECT_EQ(s->Stats().entries, 1u);
  }
  void Rewrite(const std::function<void(std::string&)>& damage) {
    std::string bytes;
    {
      std::ifstream in(victim_path_, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    damage(bytes);
    std::ofstream(victim_path_, std::ios::binary | std::ios::trunc) << bytes;
  }
  ScratchDir dir_{"fault"};
  std::string victim_path_;
};

TEST_F(KvStoreFault, SaveKilledMidway) {
  // The kill happened before the rename: only a temp file with part of the data exists.
  std::filesystem::rename(victim_path_, victim_path_ + ".tmp");
  std::filesystem::resize_file(victim_path_ + ".tmp", 5000);
  ExpectCleanMiss();
  EXPECT_FALSE(std::filesystem::exists(victim_path_ + ".tmp"));
}

TEST_F(KvStoreFault, FlippedByte) {
  Rewrite([](std::string& b) { b[b.size() - 17] ^= 0x01; });
  ExpectCleanMiss();
}

TEST_F(KvStoreFault, TruncatedFile) {
  Rewrite([](std::string& b) { b.resize(b.size() - 100); });
  ExpectCleanMiss();
}

TEST_F(KvStoreFault, OtherModelFingerprint) {
  KvEntry other = MakeEntry(Range(500, 32), "victim", "default", 2, 8, "fp-B");
  Rewrite([&](std::string& b) { b = *SerializeEntry(other); });
  ExpectCleanMiss();
}

TEST_F(KvStoreFault, CorruptionAfterOpenIsAMissOnLoad) {
  auto s = OpenStore(Options(4, dir_.path(), 8));
  auto m = s->Lookup("default", "victim", Range(500, 40));
  ASSERT_TRUE(m.has_value());
  Rewrite([](std::string& b) { b[b.size() / 2] ^= 0x40; });
  EXPECT_EQ(s->Load(m->key).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(s->Lookup("default", "victim", Range(500, 40)).has_value());
  EXPECT_EQ(s->Stats().corrupt, 1u);
}

// DRAM-tier fetches check only the header, so a prefetch must verify what it brings
// into DRAM from SSD: a file damaged after start-up is dropped, not promoted and served.
TEST_F(KvStoreFault, CorruptionAfterOpenIsNotPrefetched) {
  auto s = OpenStore(Options(4, dir_.path(), 8, PolicyKind::kSchedulerAware));
  auto m = s->Lookup("default", "victim", Range(500, 40));
  ASSERT_TRUE(m.has_value());
  ASSERT_EQ(m->tier, TierLevel::kSsd);
  Rewrite([](std::string& b) { b[b.size() / 2] ^= 0x40; });
  s->SetLookAhead({{"default", "victim", Range(500, 40)}});
  EXPECT_EQ(s->Prefetch(), 0);
  EXPECT_EQ(s->Stats().corrupt, 1u);
  EXPECT_FALSE(s->Lookup("default", "victim", Range(500, 40)).has_value());
  EXPECT_EQ(s->Fetch(m->key).status().code(), StatusCode::kNotFound);
}

// Every regular file under `dir` (recursively), by path relative to it, with its bytes.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& de : std::filesystem::recursive_directory_iterator(dir)) {
    if (!de.is_regular_file()) continue;
    std::ifstream in(de.path(), std::ios::binary);
    files[std::filesystem::relative(de.path(), dir).string()].assign(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

// Each file of `kept` is still there with the same bytes.
void ExpectIntact(const std::map<std::string, std::string>& kept, const std::string& dir, const char* when) {
  const auto now = Snapshot(dir);
  for (const auto& [path, bytes] : kept) {
    auto it = now.find(path);
    if (it == now.end()) {
      ADD_FAILURE() << path << " was deleted (" << when << ")";
    } else {
      EXPECT_TRUE(it->second == bytes) << path << " was changed (" << when << ")";
    }
  }
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The directory: files Attic did not write (one named like a temporary file, one
// like an entry, one in a subdirectory) beside another model's stored sessions. The store
// of model A never touches them, byte for byte: not at start-up, not while it demotes
// DRAM -> SSD and evicts from SSD, not at a restart; model B's sessions are served again
// when B's store opens, and A's survive that too.
TEST(KvStoreSharedDir, ForeignFilesAndOtherModelsEntriesAreNeverTouched) {
  ScratchDir dir("shared");
  StoreOptions ob = Options(0, dir.path(), 8);
  ob.fingerprint = "fp-B";
  std::vector<KvEntry> b;
  {
    auto s = OpenStore(ob);
    for (int i = 0; i < 3; ++i) {
      b.push_back(MakeEntry(Range(100 * i, 32), "b" + std::to_string(i), "default", 2, 8, "fp-B", 50 + i));
      ASSERT_TRUE(s->Save(b.back()).ok());
    }
  }
  WriteFile(dir.path() + "/notes.txt", "my notes\n");
  WriteFile(dir.path() + "/data.tmp", std::string(3000, 'd'));
  WriteFile(dir.path() + "/my.kv", "not a KV entry at all");
  WriteFile(dir.path() + "/sub/a.kv", std::string(5000, 'a'));
  const auto kept = Snapshot(dir.path());
  ASSERT_GE(kept.size(), 3u + 4u);

  // Model A: DRAM holds 2 entries, SSD 3; 8 sessions demote to SSD and evict from it.
  const StoreOptions oa = Options(2, dir.path(), 3, PolicyKind::kLru);
  auto save_a = [](KvStore& s, int i) {
    return s.Save(MakeEntry(Range(10000 + 100 * i, 32), "a" + std::to_string(i), "default", 2, 8, "fp-A", i));
  };
  {
    auto s = OpenStore(oa);
    ExpectIntact(kept, dir.path(), "start-up");
    EXPECT_EQ(s->Stats().entries, 0u);
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(save_a(*s, i).ok());
      ExpectWithinCapacity(*s);
    }
    StoreStats st = s->Stats();
    EXPECT_GT(st.bytes_dram_to_ssd, 0u);
    EXPECT_GT(st.evictions_ssd, 0u);
    ExpectIntact(kept, dir.path(), "demotions and SSD evictions");
  }
  ExpectIntact(kept, dir.path(), "shutdown");
  {
    auto s = OpenStore(oa);  // restart: A's SSD entries come back (the DRAM tier was lost)
    ExpectIntact(kept, dir.path(), "restart");
    StoreStats st = s->Stats();
    EXPECT_EQ(st.entries, 3u);
    EXPECT_EQ(st.corrupt, 0u);
    EXPECT_TRUE(s->GetSession("default", "a5").ok());
    for (int i = 8; i < 12; ++i) ASSERT_TRUE(save_a(*s, i).ok());
    EXPECT_GT(s->Stats().evictions_ssd, 0u);
    ExpectIntact(kept, dir.path(), "demotions after the restart");
  }
  const auto with_a = Snapshot(dir.path());

  // Model B's server again: its sessions are served, exactly.
  {
    ob.dram_bytes = 4 * kEntry;
    auto s = OpenStore(ob);
    EXPECT_EQ(s->Stats().entries, 3u);
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> prompt = b[i].tokens;
      prompt.push_back(7);
      auto m = s->Lookup("default", "b" + std::to_string(i), prompt);
      ASSERT_TRUE(m.has_value()) << i;
      EXPECT_EQ(m->tier, TierLevel::kSsd);
      auto loaded = s->Load(m->key);
      ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
      EXPECT_EQ(loaded->k, b[i].k);
      EXPECT_EQ(loaded->v, b[i].v);
    }
    EXPECT_EQ(s->Stats().corrupt, 0u);
  }
  ExpectIntact(with_a, dir.path(), "model B's server");  // A's entries and the foreign files
  auto s = OpenStore(oa);
  EXPECT_EQ(s->Stats().entries, 3u);
  EXPECT_TRUE(s->GetSession("default", "a9").ok());  // on SSD at the last shutdown (a10, a11 were in DRAM)
}

// KvStore::open_report(): what start-up found, per kind, and its one-line rendering.
TEST(KvStoreSharedDir, OpenReportSaysWhatStartUpFound) {
  ScratchDir dir("report");
  VirtualClock clock;
  StoreOptions ob = Options(0, dir.path(), 8);
  ob.fingerprint = "fp-B";
  {
    auto s = OpenStore(ob);
    EXPECT_TRUE(s->open_report().ssd_created);
    EXPECT_EQ(FormatOpenReport(s->open_report()),
              "KV store: new store in " + dir.path() + " (this model's entries go to " +
                  SsdTier::ModelDir(dir.path(), "fp-B") + ")");
    for (int i = 0; i < 2; ++i)
      ASSERT_TRUE(s->Save(MakeEntry(Range(100 * i, 32), "b" + std::to_string(i), "default", 2, 8, "fp-B")).ok());
  }
  const StoreOptions oa = Options(0, dir.path(), 8);
  std::string corrupt_path;
  {
    auto s = OpenStore(oa, &clock);
    EXPECT_FALSE(s->open_report().ssd_created);
    EXPECT_EQ(FormatOpenReport(s->open_report()),
              "KV store: no entries of this model in " + SsdTier::ModelDir(dir.path(), "fp-A") +
                  "; kept 2 entries of 1 other model (16.0 KiB, not counted against --kv-ssd-bytes)");
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Save(MakeEntry(Range(1000 * i, 32), "a" + std::to_string(i))).ok());
    ASSERT_TRUE(s->Save(MakeEntry(Range(9000, 32), "short-lived"), "", 1000).ok());
    corrupt_path = SsdTier::ModelDir(dir.path(), "fp-A") + "/" + MakeEntry(Range(0, 32), "a0").key().ToString() + ".kv";
  }
  std::filesystem::resize_file(corrupt_path, 5000);  // a0 truncated
  WriteFile(corrupt_path.substr(0, corrupt_path.size() - 3) + "ffff.kv.tmp", "not a key: foreign");
  WriteFile(SsdTier::ModelDir(dir.path(), "fp-A") + "/" + MakeEntry(Range(7, 32)).key().ToString() + ".kv.tmp",
            "an interrupted write");
  WriteFile(dir.path() + "/notes.txt", "my notes");
  WriteFile(dir.path() + "/sub/a.kv", "a");
  clock.Advance(2000);  // short-lived expires
  StoreOptions smaller = oa;
  smaller.ssd_bytes = 2 * kEntry;  // 3 good entries left: one more goes
  auto s = OpenStore(smaller, &clock);
  const StoreOpenReport& r = s->open_report();
  EXPECT_EQ(r.ssd_root, dir.path());
  EXPECT_EQ(r.ssd_dir, SsdTier::ModelDir(dir.path(), "fp-A"));
  EXPECT_FALSE(r.ssd_created);
  EXPECT_EQ(r.ssd_entries, 2u);
  EXPECT_EQ(r.ssd_bytes, 2 * kEntry);
  EXPECT_EQ(r.dram_entries, 0u);
  EXPECT_EQ(r.removed_temp_files, 1u);
  EXPECT_EQ(r.removed_corrupt, 1u);
  EXPECT_EQ(r.removed_expired, 1u);
  EXPECT_EQ(r.evicted, 1u);
  EXPECT_EQ(r.other_models, 1u);
  EXPECT_EQ(r.other_model_entries, 2u);
  EXPECT_EQ(r.other_model_bytes, 2 * kEntry);
  EXPECT_EQ(r.foreign, 3u);  // notes.txt, sub/, the .kv.tmp that is not a key
  EXPECT_EQ(s->Stats().corrupt, 1u);
  EXPECT_EQ(s->Stats().entries, 2u);
  const std::string line = FormatOpenReport(r);
  EXPECT_EQ(line.substr(0, line.find(" (e.g. ")),
            "KV store: restored 2 entries (16.0 KiB) from SSD " + r.ssd_dir +
                "; removed 1 stale temporary file; removed 1 corrupt entry; removed 1 expired entry; evicted 1 entry "
                "over --kv-ssd-bytes; kept 2 entries of 1 other model (16.0 KiB, not counted against "
                "--kv-ssd-bytes); ignored 3 files not Attic's");
  EXPECT_EQ(line.substr(line.find(" (e.g. ")), " (e.g. '" + r.foreign_example + "'), left untouched");
}

TEST(KvStore, SchedulerAwareKeepsQueuedSessionsWhereLruDropsThem) {
  // DRAM holds 2, SSD 2. Sessions s0..s3 saved in order, then s4 arrives while s0's
  // next turn waits in the queue: LRU drops s0 from the store, scheduler-aware keeps it.
  ScratchDir dir("policy");
  for (PolicyKind p : {PolicyKind::kLru, PolicyKind::kSchedulerAware}) {
    std::filesystem::remove_all(dir.path());
    auto s = OpenStore(Options(2, dir.path(), 2, p));
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Save(MakeEntry(Range(i * 100, 32), "s" + std::to_string(i))).ok());
    s->SetLookAhead({{"default", "s0", Range(0, 40)}});
    ASSERT_TRUE(s->Save(MakeEntry(Range(400, 32), "s4")).ok());
    ExpectWithinCapacity(*s);
    bool kept = s->GetSession("default", "s0").ok();
    EXPECT_EQ(kept, p == PolicyKind::kSchedulerAware) << PolicyName(p);
  }
}

TEST(KvStore, PrefetchPromotesQueuedSessionsFromSsd) {
  ScratchDir dir("prefetch");
  auto s = OpenStore(Options(2, dir.path(), 4, PolicyKind::kSchedulerAware));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Save(MakeEntry(Range(i * 100, 32), "s" + std::to_string(i))).ok());
  ASSERT_EQ(s->GetSession("default", "s0")->tier, TierLevel::kSsd);
  s->SetLookAhead({{"default", "s0", Range(0, 40)}});
  EXPECT_EQ(s->Prefetch(), 1);
  EXPECT_EQ(s->GetSession("default", "s0")->tier, TierLevel::kDram);
  EXPECT_EQ(s->Stats().prefetches, 1u);
  ExpectWithinCapacity(*s);
}

TEST(KvStore, PrefetchPromotesAnEntryAJobReadsByKey) {
  // A context-cache chunk a waiting job links: named by key, whatever the job's tokens.
  ScratchDir dir("prefetch-key");
  auto s = OpenStore(Options(2, dir.path(), 4, PolicyKind::kSchedulerAware));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Save(MakeEntry(Range(i * 100, 32), "ctx:" + std::to_string(i))).ok());
  auto chunk = s->GetSession("default", "ctx:0");
  ASSERT_EQ(chunk->tier, TierLevel::kSsd);
  store::QueuedJob job{"default", "", Range(9000, 8), 32, chunk->key};
  s->SetLookAhead({{"other-tenant", "", {}, 32, chunk->key}});  // not its tenant's: not resolved
  EXPECT_EQ(s->Prefetch(), 0);
  s->SetLookAhead({job});
  EXPECT_EQ(s->Prefetch(), 1);
  EXPECT_EQ(s->GetSession("default", "ctx:0")->tier, TierLevel::kDram);
  ExpectWithinCapacity(*s);
}

TEST(KvStore, RejectsOtherModelsEntryOnSave) {
  auto s = OpenStore(Options(4));
  EXPECT_EQ(s->Save(MakeEntry(Range(0, 32), "", "default", 2, 8, "fp-B")).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attic::store

namespace attic::store {
namespace {

TEST(KvStoreAsync, QueuedSavesAreNeverMissedAndRespectTheWriteBuffer) {
  StoreOptions o = Options(64);
  o.write_buffer_bytes = 3 * 32 * 2 * 8 * 4;  // KV of three 32-token entries
  auto s = OpenStore(o);
  for (int i = 0; i < 20; ++i) s->SaveAsync(MakeEntry(Range(i * 100, 32), "s" + std::to_string(i)));
  // A lookup of the tenant waits for its queued saves.
  auto m = s->Lookup("default", "s19", Range(1900, 40));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->n_tokens, 32);
  s->Flush();
  StoreStats st = s->Stats();
  EXPECT_EQ(st.entries, 20u);
  EXPECT_EQ(st.async_saves, 20u);
  EXPECT_EQ(st.pending_saves, 0u);
}

TEST(KvStoreAsync, DestructorFinishesQueuedSaves) {
  ScratchDir dir("async");
  {
    auto s = OpenStore(Options(0, dir.path(), 8));
    for (int i = 0; i < 4; ++i) s->SaveAsync(MakeEntry(Range(i * 100, 32), "s" + std::to_string(i)));
  }
  auto s = OpenStore(Options(4, dir.path(), 8));
  EXPECT_EQ(s->Stats().entries, 4u);
}

TEST(KvStoreAsync, ZeroWriteBufferSavesSynchronously) {
  StoreOptions o = Options(4);
  o.write_buffer_bytes = 0;
  auto s = OpenStore(o);
  s->SaveAsync(MakeEntry(Range(0, 32), "a"));
  EXPECT_EQ(s->Stats().entries, 1u);
  EXPECT_EQ(s->Stats().async_saves, 0u);
}

}  // namespace
}  // namespace attic::store

namespace attic::store {
namespace {

TEST(KvStorePrefetch, BackgroundThreadPromotesQueuedSession) {
  ScratchDir dir("bgprefetch");
  auto s = OpenStore(Options(2, dir.path(), 4, PolicyKind::kSchedulerAware));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Save(MakeEntry(Range(i * 100, 32), "s" + std::to_string(i))).ok());
  ASSERT_EQ(s->GetSession("default", "s0")->tier, TierLevel::kSsd);
  s->SetLookAhead({{"default", "s0", Range(0, 40)}});
  s->RequestPrefetch();
  // Until the background thread has promoted it (a hang is ctest's timeout, not a guess
  // at how long the thread may take).
  while (s->GetSession("default", "s0")->tier != TierLevel::kDram)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a poll, not a deadline
  ExpectWithinCapacity(*s);
}

TEST(KvStorePrefetch, BaselinePoliciesDoNotPrefetch) {
  ScratchDir dir("noprefetch");
  auto s = OpenStore(Options(2, dir.path(), 4, PolicyKind::kLru));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Save(MakeEntry(Range(i * 100, 32), "s" + std::to_string(i))).ok());
  s->SetLookAhead({{"default", "s0", Range(0, 40)}});
  EXPECT_EQ(s->Prefetch(), 0);
}

}  // namespace
}  // namespace attic::store

namespace attic::store {
namespace {

// Tiers filled before the store opens (Open indexes what the tiers hold).
struct Preloaded {
  std::unique_ptr<DramTier> dram, ssd;
  void Put(TierLevel level, const KvEntry& e) {
    auto bytes = SerializeEntry(e);
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE((level == TierLevel::kDram ? dram : ssd)->Put(e.key().ToString(), *bytes).ok());
  }
  std::unique_ptr<KvStore> Open(PolicyKind policy) {
    StoreOptions o = Options(0, "", 0, policy);
    o.write_buffer_bytes = 0;
    auto s = KvStore::Open(o, std::move(dram), std::move(ssd), nullptr);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(s).value();
  }
};

// Session "jN": its entry has `n` tokens (32 -> 8 KiB = 1 unit, 96 -> 16 KiB = 2 units);
// its queued job's prompt extends the entry by one token.
KvEntry Job(int n, int size_tokens = 32) { return MakeEntry(Range(n * 1000, size_tokens), "j" + std::to_string(n)); }
QueuedJob Queued(int n, int size_tokens = 32) { return {"default", "j" + std::to_string(n), Range(n * 1000, size_tokens + 1)}; }

// Paper Fig. 9, worked by hand. DRAM 3 units: Job 2 (1) and Job 4 (2); SSD 4 units: Jobs
// 3, 6, 8, 9 (1 each); waiting jobs 2..9 (5 and 7 are new sessions). S_kv = 7/6 units,
// so the prefetch window is 3 / (7/6) = 2 jobs (2, 3) and the eviction window 6 jobs
// (2..7). Job 3 is on SSD: fetching it needs DRAM room; every DRAM entry is wanted, the
// one nearest the window's tail (Job 4) is demoted; its 2 units need one more SSD unit
// than Job 3 freed, and the last arrived job (9, behind the window) leaves.
TEST(KvStoreSchedulerAware, PrefetchFollowsPaperFigure9) {
  Preloaded t{std::make_unique<DramTier>(3 * kEntry), std::make_unique<DramTier>(4 * kEntry, TierLevel::kSsd)};
  t.Put(TierLevel::kDram, Job(2));
  t.Put(TierLevel::kDram, Job(4, 96));
  for (int j : {3, 6, 8, 9}) t.Put(TierLevel::kSsd, Job(j));
  auto s = t.Open(PolicyKind::kSchedulerAware);
  std::vector<QueuedJob> queue;
  for (int j = 2; j <= 9; ++j) queue.push_back(j == 4 ? Queued(4, 96) : Queued(j));
  s->SetLookAhead(queue);
  EXPECT_EQ(s->Prefetch(), 1);
  auto tier = [&](int j) { return s->GetSession("default", "j" + std::to_string(j)); };
  EXPECT_EQ(tier(2)->tier, TierLevel::kDram);
  EXPECT_EQ(tier(3)->tier, TierLevel::kDram);
  EXPECT_EQ(tier(4)->tier, TierLevel::kSsd);
  EXPECT_EQ(tier(6)->tier, TierLevel::kSsd);
  EXPECT_EQ(tier(8)->tier, TierLevel::kSsd);
  EXPECT_EQ(tier(9).status().code(), StatusCode::kNotFound);
  StoreStats st = s->Stats();
  EXPECT_EQ(st.prefetches, 1u);
  EXPECT_EQ(st.evictions_dram, 1u);
  EXPECT_EQ(st.evictions_ssd, 1u);
  ExpectWithinCapacity(*s);
  // Job 3's request finds it in DRAM: the prefetch was useful. Job 2 was not prefetched.
  EXPECT_EQ(s->Lookup("default", "j3", Queued(3).tokens)->tier, TierLevel::kDram);
  EXPECT_EQ(s->Lookup("default", "j2", Queued(2).tokens)->tier, TierLevel::kDram);
  EXPECT_EQ(s->Stats().prefetches_useful, 1u);

  // A finished turn of a session no queued job reads (2 units) would displace entries
  // every waiting job wants sooner: DRAM (Jobs 2, 3) and SSD (Jobs 4, 6, 8) both rank
  // it last, so it is not kept and nothing else moves.
  ASSERT_TRUE(s->Save(MakeEntry(Range(70000, 96), "j1")).ok());
  EXPECT_EQ(s->GetSession("default", "j1").status().code(), StatusCode::kNotFound);
  st = s->Stats();
  EXPECT_EQ(st.saves_not_kept, 1u);
  EXPECT_EQ(st.entries, 5u);
  EXPECT_EQ(st.evictions_dram, 1u);
  EXPECT_EQ(st.evictions_ssd, 1u);
}

TEST(KvStoreSchedulerAware, BaselinesAlwaysKeepTheNewestSave) {
  // The same full store under LRU: the new entry enters DRAM, pushing the least recently
  // used entries down and out.
  Preloaded t{std::make_unique<DramTier>(3 * kEntry), std::make_unique<DramTier>(4 * kEntry, TierLevel::kSsd)};
  t.Put(TierLevel::kDram, Job(2));
  t.Put(TierLevel::kDram, Job(4, 96));
  for (int j : {3, 6, 8, 9}) t.Put(TierLevel::kSsd, Job(j));
  auto s = t.Open(PolicyKind::kLru);
  ASSERT_TRUE(s->Save(MakeEntry(Range(70000, 96), "j1")).ok());
  EXPECT_EQ(s->GetSession("default", "j1")->tier, TierLevel::kDram);
  EXPECT_EQ(s->Stats().saves_not_kept, 0u);
  ExpectWithinCapacity(*s);
}

TEST(KvStoreSchedulerAware, NewEntryOfAQueuedSessionTakesItsJobsPlace) {
  // DRAM only, 2 units, holding b and c; waiting: a's next turn, b's, c's. a's new entry
  // (1 unit) is read by the first waiting job, so c's (the last in the queue) goes.
  Preloaded t{std::make_unique<DramTier>(2 * kEntry), nullptr};
  t.Put(TierLevel::kDram, Job(2));
  t.Put(TierLevel::kDram, Job(3));
  auto s = t.Open(PolicyKind::kSchedulerAware);
  s->SetLookAhead({Queued(1), Queued(2), Queued(3)});
  ASSERT_TRUE(s->Save(Job(1)).ok());
  EXPECT_TRUE(s->GetSession("default", "j1").ok());
  EXPECT_TRUE(s->GetSession("default", "j2").ok());
  EXPECT_FALSE(s->GetSession("default", "j3").ok());

  // The job that produced an entry does not protect it: its prompt is shorter than the
  // entry (which adds the answer). With j2's and j1's jobs waiting, j4's save is
  // ranked last and not kept, although j4's own (running) job is shown first.
  s->SetLookAhead({{"default", "j4", Range(4000, 20)}, Queued(2), Queued(1)});
  ASSERT_TRUE(s->Save(Job(4)).ok());
  EXPECT_FALSE(s->GetSession("default", "j4").ok());
  EXPECT_EQ(s->Stats().saves_not_kept, 1u);
}

TEST(KvStoreSchedulerAware, JobsBehindTheEvictionWindowGoLastInQueueFirst) {
  // DRAM only, 2 units: a (saved first, least recently used) and b. Eviction window =
  // 2 / 1 = 2 jobs; waiting: c's next turn, a new session, a's, b's -- a and b are
  // behind the window. c's new entry needs a unit: b's job is the last in the queue, so
  // b goes (LRU would drop a, whose job comes sooner).
  Preloaded t{std::make_unique<DramTier>(2 * kEntry), nullptr};
  auto s = t.Open(PolicyKind::kSchedulerAware);
  ASSERT_TRUE(s->Save(Job(1)).ok());
  ASSERT_TRUE(s->Save(Job(2)).ok());
  s->SetLookAhead({Queued(3), Queued(9), Queued(1), Queued(2)});
  ASSERT_TRUE(s->Save(Job(3)).ok());
  EXPECT_TRUE(s->GetSession("default", "j1").ok());
  EXPECT_FALSE(s->GetSession("default", "j2").ok());
  EXPECT_TRUE(s->GetSession("default", "j3").ok());
}

TEST(KvStore, PromotionFreesTheSsdCopyFirst) {
  // DRAM 2, SSD 2, LRU, all full: DRAM {s2, s3}, SSD {s0, s1}. Loading s0 moves it to
  // DRAM; DRAM's least recently used (s2) takes s0's place on SSD. Nothing leaves the
  // store (fetching before freeing would have pushed s1 out).
  Preloaded t{std::make_unique<DramTier>(2 * kEntry), std::make_unique<DramTier>(2 * kEntry, TierLevel::kSsd)};
  auto s = t.Open(PolicyKind::kLru);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Save(Job(i)).ok());
  ASSERT_EQ(s->GetSession("default", "j0")->tier, TierLevel::kSsd);
  ASSERT_EQ(s->GetSession("default", "j1")->tier, TierLevel::kSsd);
  auto m = s->Lookup("default", "j0", Queued(0).tokens);
  ASSERT_TRUE(m.has_value());
  ASSERT_TRUE(s->Load(m->key).ok());
  EXPECT_EQ(s->GetSession("default", "j0")->tier, TierLevel::kDram);
  EXPECT_EQ(s->GetSession("default", "j2")->tier, TierLevel::kSsd);
  EXPECT_EQ(s->GetSession("default", "j1")->tier, TierLevel::kSsd);
  EXPECT_EQ(s->GetSession("default", "j3")->tier, TierLevel::kDram);
  StoreStats st = s->Stats();
  EXPECT_EQ(st.entries, 4u);
  EXPECT_EQ(st.evictions_ssd, 0u);
  ExpectWithinCapacity(*s);
}

TEST(KvStore, PromotedEntriesKeepTheirSsdCopyAndDemoteWithoutWriting) {
  // DRAM 2, SSD 4, LRU: DRAM {j2, j3}, SSD {j0, j1}. Loading j0 and j1 promotes them
  // (j2, j3 are written to SSD to make room); their files stay. Loading j2 then demotes
  // j0 (least recently used) by dropping its DRAM copy: no bytes are written, and j0
  // still loads, from SSD.
  Preloaded t{std::make_unique<DramTier>(2 * kEntry), std::make_unique<DramTier>(4 * kEntry, TierLevel::kSsd)};
  auto s = t.Open(PolicyKind::kLru);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Save(Job(i)).ok());
  auto load = [&](int i) {
    auto m = s->Lookup("default", "j" + std::to_string(i), Queued(i).tokens);
    ASSERT_TRUE(m.has_value());
    ASSERT_TRUE(s->Load(m->key).ok());
  };
  load(0);
  load(1);
  const uint64_t written = s->Stats().bytes_dram_to_ssd;
  EXPECT_EQ(written, 4 * kEntry);  // j0, j1 at the saves; j2, j3 for the promotions
  load(2);
  EXPECT_EQ(s->GetSession("default", "j0")->tier, TierLevel::kSsd);
  EXPECT_EQ(s->GetSession("default", "j2")->tier, TierLevel::kDram);
  EXPECT_EQ(s->Stats().bytes_dram_to_ssd, written);
  load(0);
  StoreStats st = s->Stats();
  EXPECT_EQ(st.entries, 4u);
  EXPECT_EQ(st.evictions_ssd, 0u);
  EXPECT_EQ(st.corrupt, 0u);
  ExpectWithinCapacity(*s);
}

TEST(KvStorePrefetch, PrefetchDemotedBeforeItsRequestIsNotUseful) {
  // DRAM 1, SSD 3. a is prefetched for its queued job, then b's job comes first and b
  // is prefetched in a's place: a's request finds it on SSD.
  Preloaded t{std::make_unique<DramTier>(1 * kEntry), std::make_unique<DramTier>(3 * kEntry, TierLevel::kSsd)};
  t.Put(TierLevel::kSsd, Job(1));
  t.Put(TierLevel::kSsd, Job(2));
  auto s = t.Open(PolicyKind::kSchedulerAware);
  s->SetLookAhead({Queued(1)});
  EXPECT_EQ(s->Prefetch(), 1);
  s->SetLookAhead({Queued(2)});
  EXPECT_EQ(s->Prefetch(), 1);
  EXPECT_EQ(s->Lookup("default", "j1", Queued(1).tokens)->tier, TierLevel::kSsd);
  EXPECT_EQ(s->Lookup("default", "j2", Queued(2).tokens)->tier, TierLevel::kDram);
  StoreStats st = s->Stats();
  EXPECT_EQ(st.prefetches, 2u);
  EXPECT_EQ(st.prefetches_useful, 1u);
}

// A tier whose Put blocks while the gate is held (a slow write). Not local memory: the
// store makes its calls without holding its lock, so Stats() answers while a Put blocks.
class GatedTier final : public Tier, public Gate {
 public:
  explicit GatedTier(uint64_t capacity) : inner_(capacity) {}
  std::string name() const override { return "dram"; }
  TierTraits traits() const override { return {.local_memory = false}; }
  Status Put(const std::string& key, std::string_view bytes) override {
    Pass();
    return inner_.Put(key, bytes);
  }
  StatusOr<std::string> Get(const std::string& key) override { return inner_.Get(key); }
  Status Erase(const std::string& key) override { return inner_.Erase(key); }
  bool Contains(const std::string& key) const override { return inner_.Contains(key); }
  int64_t SizeOf(const std::string& key) const override { return inner_.SizeOf(key); }
  std::vector<std::string> Keys() const override { return inner_.Keys(); }
  uint64_t bytes() const override { return inner_.bytes(); }
  uint64_t capacity() const override { return inner_.capacity(); }

 private:
  DramTier inner_;
};

TEST(KvStoreAsync, WaitTimesAreCounted) {
  StoreOptions o = Options(0);
  o.write_buffer_bytes = 2 * 32 * 2 * 8 * 4;  // KV of one 32-token entry (2 layers, kv_dim 8)
  auto gated = std::make_unique<GatedTier>(16 * kEntry);
  GatedTier* gate = gated.get();
  auto opened = KvStore::Open(o, std::move(gated), nullptr, nullptr);
  ASSERT_TRUE(opened.ok());
  auto s = std::move(opened).value();
  std::vector<KvEntry> e;
  for (int i = 0; i < 4; ++i) e.push_back(Job(i));
  // The gate opens once Stats() shows the wait under test has begun (the writer blocks
  // in the tier without the store's lock), or once the caller returned without waiting
  // (then the counts below fail instead of the test hanging): no time involved.
  std::atomic<bool> returned{false};
  auto release_when = [&](auto waiting) {
    returned = false;
    return std::thread([&, waiting] {
      while (!waiting(s->Stats()) && !returned) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a poll
      gate->Release();
    });
  };

  // The first save blocks in the tier; the buffer holds one entry's KV, so the third
  // SaveAsync (at the latest) waits for room.
  gate->Hold();
  std::thread t1 = release_when([](const StoreStats& st) { return st.save_waits >= 1; });
  for (int i = 0; i < 3; ++i) s->SaveAsync(e[i]);
  returned = true;
  t1.join();
  s->Flush();
  StoreStats st = s->Stats();
  EXPECT_GE(st.save_waits, 1u);
  EXPECT_GT(st.save_wait_ms, 0.0);
  EXPECT_EQ(st.lookup_waits, 0u);

  // A lookup of the tenant waits for its queued save.
  gate->Hold();
  std::thread t2 = release_when([](const StoreStats& st) { return st.lookup_waits >= 1; });
  s->SaveAsync(e[3]);
  EXPECT_TRUE(s->Lookup("default", "j3", Queued(3).tokens).has_value());
  returned = true;
  t2.join();
  st = s->Stats();
  EXPECT_EQ(st.lookup_waits, 1u);
  EXPECT_GT(st.lookup_wait_ms, 0.0);
  EXPECT_EQ(st.entries, 4u);
  // Nothing queued: no further waits.
  EXPECT_TRUE(s->GetSession("default", "j0").ok());
  EXPECT_EQ(s->Stats().lookup_waits, 1u);
}

// A store whose writer stops at `gate` before each queued save.
std::unique_ptr<KvStore> OpenGated(StoreOptions o, Gate* gate) {
  o.before_async_save = gate->Hook();
  auto opened = KvStore::Open(o);
  EXPECT_TRUE(opened.ok()) << opened.status().ToString();
  return opened.ok() ? std::move(opened).value() : nullptr;
}

// The writer saves at background priority (writer_nice) until somebody waits for a queued
// save: then it runs at normal priority until the write buffer is empty.
TEST(KvStoreAsync, WriterRunsAtNormalPriorityWhileASaveIsAwaited) {
  StoreOptions o = Options(0);
  o.writer_nice = 10;
  Gate gate;
  auto s = OpenGated(o, &gate);
  ASSERT_NE(s, nullptr);
  Gate::ReleaseAtExit release{&gate};
  gate.Hold();
  s->SaveAsync(Job(0));
  s->SaveAsync(Job(1));
  gate.WaitArrivals(1);
  EXPECT_FALSE(s->SavePending("default", "j9", Queued(9).tokens));
  EXPECT_TRUE(s->SavePending("default", "j1", Queued(1).tokens));  // job 1's save is awaited
  gate.Release();
  s->Flush();
  std::vector<int> nice = gate.nice_seen();
  ASSERT_EQ(nice.size(), 2u);
  EXPECT_EQ(nice[0], 10);  // background
  if (nice[1] != 0 && geteuid() != 0) GTEST_SKIP() << "raising the writer's priority back is not permitted here";
  EXPECT_EQ(nice[1], 0);   // awaited
  s->SaveAsync(Job(2));
  s->Flush();
  nice = gate.nice_seen();
  ASSERT_EQ(nice.size(), 3u);
  EXPECT_EQ(nice[2], 10);  // background again once the buffer had emptied
  EXPECT_FALSE(s->SavePending("default", "j1", Queued(1).tokens));
}

// Without a session id a lookup waits only for the tenant's queued saves that could give
// it a longer match than the stored entries, not for every other conversation's save.
TEST(KvStoreAsync, SessionlessLookupWaitsOnlyForSavesThatExtendItsMatch) {
  StoreOptions o = Options(16);
  Gate gate;
  auto s = OpenGated(o, &gate);
  ASSERT_NE(s, nullptr);
  Gate::ReleaseAtExit release{&gate};
  ASSERT_TRUE(s->Save(MakeEntry(Range(0, 16))).ok());  // stored: tokens 0..15
  auto concat = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<int32_t> queued = concat(Range(0, 8), Range(100, 24));
  gate.Hold();
  s->SaveAsync(MakeEntry(queued));               // shares 8 tokens with the stored entry
  s->SaveAsync(MakeEntry(Range(7000, 32), "", "other-tenant"));
  gate.WaitArrivals(1);
  // Stored 16-token match beats the queued entry's 8: no wait.
  EXPECT_FALSE(s->SavePending("default", "", concat(Range(0, 16), Range(500, 4))));
  EXPECT_FALSE(s->SavePending("default", "", Range(9000, 20)));  // shares nothing
  // The queued entry would match 30 tokens, the stored one 8: wait for it.
  const std::vector<int32_t> extends = concat(Range(0, 8), Range(100, 30));
  EXPECT_TRUE(s->SavePending("default", "", extends));
  EXPECT_EQ(s->Stats().lookup_waits, 0u);
  gate.Release();
  auto m = s->Lookup("default", "", extends);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->n_tokens, 32);  // the queued save was waited for, not missed
}

}  // namespace
}  // namespace attic::store
