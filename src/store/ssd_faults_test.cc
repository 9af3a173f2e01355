// I/O faults under the SSD tier, injected through its file layer (FaultInjectingFileEnv,
// leveldb's fault-injecting Env): failed and short writes, a full disk, a failed fsync
// or rename, and reads that return flipped bits. What must hold: a failed write leaves
// the previous value and no temporary file, and is an error of the right kind; a short
// write is completed; a full disk under the store keeps it serving from DRAM (a warning,
// StoreStats::write_errors); a flipped bit is a miss, never wrong KV.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <csignal>
#include <filesystem>
#include <random>
#include <string>

#include "attic/core/file_env.h"
#include "attic/store/kv_store.h"
#include "attic/store/tier.h"
#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::KeyNamed;
using testing::MakeEntry;
using testing::Range;
using testing::ScratchDir;


// Files in the tier's directory whose name ends in `suffix`.
int CountFiles(const std::string& dir, const std::string& suffix) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) ++n;
  }
  return n;
}

// Bytes of n that are not all alike (a value whose every byte matters).
std::string Value(size_t n, char seed) {
  std::string v(n, '\0');
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(seed + i * 31 + (i >> 8));
  return v;
}

class SsdFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = SsdTier::Open(dir_.path(), "fp-A", 64 << 20, &env_);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tier_ = std::move(*t);
    ASSERT_TRUE(tier_->Put(KeyNamed("a"), old_).ok());
  }
  // After a failed Put of KeyNamed("a"): the old value intact, the accounting unchanged, no
  // temporary file left.
  void ExpectOldValueKept() {
    auto got = tier_->Get(KeyNamed("a"));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, old_);
    EXPECT_EQ(tier_->bytes(), old_.size());
    EXPECT_EQ(tier_->SizeOf(KeyNamed("a")), static_cast<int64_t>(old_.size()));
    EXPECT_EQ(CountFiles(tier_->dir(), ".tmp"), 0);
    EXPECT_EQ(CountFiles(tier_->dir(), ".kv"), 1);
  }
  ScratchDir dir_{"ssd-faults"};
  FaultInjectingFileEnv env_;
  std::unique_ptr<SsdTier> tier_;
  const std::string old_ = Value(10000, 1);
  const std::string new_ = Value(3 << 20, 7);  // several 1 MiB write chunks
};

TEST_F(SsdFaults, FailedWriteKeepsTheOldValue) {
  for (int at : {1, 2, 3}) {
    env_.Arm({.fail_write_at = at, .write_errno = EIO});
    Status st = tier_->Put(KeyNamed("a"), new_);
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << "write " << at << ": " << st.ToString();
    EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.ToString();
    ExpectOldValueKept();
    EXPECT_EQ(env_.injected(), 1);
  }
}

TEST_F(SsdFaults, FullDiskIsResourceExhausted) {
  env_.Arm({.fail_write_at = 2, .write_errno = ENOSPC});
  Status st = tier_->Put(KeyNamed("a"), new_);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  ExpectOldValueKept();
  // Space again: the write goes through.
  env_.Arm({});
  ASSERT_TRUE(tier_->Put(KeyNamed("a"), new_).ok());
  EXPECT_EQ(*tier_->Get(KeyNamed("a")), new_);
}

TEST_F(SsdFaults, ShortWritesAreCompleted) {
  for (int at : {1, 2, 3}) {
    env_.Arm({.short_write_at = at});
    ASSERT_TRUE(tier_->Put(KeyNamed("b"), new_).ok());
    EXPECT_EQ(*tier_->Get(KeyNamed("b")), new_) << "short write " << at;
    EXPECT_EQ(env_.injected(), 1);
  }
}

TEST_F(SsdFaults, FailedFsyncOrRenameKeepsTheOldValue) {
  env_.Arm({.fail_fsync_at = 1});
  EXPECT_FALSE(tier_->Put(KeyNamed("a"), new_).ok());
  ExpectOldValueKept();
  EXPECT_EQ(env_.injected(), 1);
  env_.Arm({.fail_rename_at = 1});
  EXPECT_FALSE(tier_->Put(KeyNamed("a"), new_).ok());
  ExpectOldValueKept();
  EXPECT_EQ(env_.injected(), 1);
}

TEST_F(SsdFaults, FlippedBitOnReadIsReturnedAsRead) {
  // The tier hands out what the disk gave (it does not know the format): the store's
  // checksums are what catch it (next test). Here: the flip reaches the caller intact,
  // so the fault layer really is under the tier's reads.
  env_.Arm({.flip_read_at = 1, .flip_byte = 1234});
  auto got = tier_->Get(KeyNamed("a"));
  ASSERT_TRUE(got.ok());
  std::string want = old_;
  want[1234] ^= 0x10;
  EXPECT_EQ(*got, want);
}

StoreOptions StoreOn(const std::string& dir, FileEnv* env, uint64_t dram_bytes) {
  StoreOptions o;
  o.fingerprint = "fp-A";
  o.dram_bytes = dram_bytes;
  o.ssd_dir = dir;
  o.ssd_bytes = 64 << 20;
  o.ssd_env = env;
  o.default_ttl_ms = 0;
  o.prefix_block = 8;
  return o;
}

// Every byte of the entry file is flipped in turn on its way from the disk: each load
// is a miss (the entry dropped as corrupt) or the very KV saved. Never other KV.
TEST(SsdFaultsStore, FlippedBitsAreAMissNeverWrongKv) {
  ScratchDir dir("ssd-faults-store");
  FaultInjectingFileEnv env;
  const KvEntry saved = MakeEntry(Range(500, 32), "victim");
  const uint64_t size = saved.SerializedBytes();
  int misses = 0, served = 0;
  // Header, tokens, the padding, layer 0's K and V, layer 1: a spread of offsets.
  for (uint64_t at = 0; at < size; at += 509) {
    env.Arm({});
    auto s = KvStore::Open(StoreOn(dir.path(), &env, 0), nullptr);  // no DRAM: the entry lives on SSD
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE((*s)->Save(saved).ok());
    auto m = (*s)->Lookup("default", "victim", Range(500, 40));
    ASSERT_TRUE(m.has_value()) << "byte " << at;
    env.Arm({.flip_read_at = 1, .flip_byte = at});
    auto loaded = (*s)->Load(m->key);
    ASSERT_EQ(env.injected(), 1) << "byte " << at << ": the read did not go through the fault layer";
    if (!loaded.ok()) {
      ++misses;
      EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound) << loaded.status().ToString();
      EXPECT_FALSE((*s)->Lookup("default", "victim", Range(500, 40)).has_value()) << "byte " << at;
      continue;
    }
    ++served;
    const KvEntry& e = *loaded;
    ASSERT_EQ(e.tokens, saved.tokens) << "byte " << at;
    ASSERT_EQ(e.positions, saved.positions) << "byte " << at;
    for (int l = 0; l < saved.n_layers; ++l)
      for (int r = 0; r < saved.n_tokens(); ++r) {
        ASSERT_EQ(std::memcmp(e.k_row(l, r), saved.k_row(l, r), saved.kv_dim * sizeof(float)), 0) << "byte " << at;
        ASSERT_EQ(std::memcmp(e.v_row(l, r), saved.v_row(l, r), saved.kv_dim * sizeof(float)), 0) << "byte " << at;
      }
  }
  // Only the header's zero padding is outside every checksum.
  EXPECT_GT(misses, 0);
  std::printf("[ flipped  ] %d offsets: %d misses, %d served intact (padding)\n", misses + served, misses, served);
}

// A full disk under the store: saves still land in DRAM and are served from there; the
// failed writes are counted (StoreStats::write_errors, attic_kv_store_write_errors_total).
TEST(SsdFaultsStore, FullDiskKeepsServingFromDram) {
  ScratchDir dir("ssd-faults-full");
  FaultInjectingFileEnv env;
  const uint64_t entry = MakeEntry(Range(0, 32)).SerializedBytes();
  auto s = KvStore::Open(StoreOn(dir.path(), &env, 2 * entry), nullptr);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  env.Arm({.write_errno = ENOSPC, .fail_all_writes = true});
  // Four sessions into a DRAM tier of two: the older two would move to the full disk.
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE((*s)->Save(MakeEntry(Range(100 * i, 32), "s" + std::to_string(i))).ok()) << i;
  const StoreStats st = (*s)->Stats();
  EXPECT_GT(st.write_errors, 0u);
  EXPECT_EQ(st.ssd_bytes, 0u);
  EXPECT_LE(st.dram_bytes, st.dram_capacity);
  // The newest two are served from DRAM, with their own KV.
  for (int i = 2; i < 4; ++i) {
    auto m = (*s)->Lookup("default", "s" + std::to_string(i), Range(100 * i, 40));
    ASSERT_TRUE(m.has_value()) << i;
    auto e = (*s)->Load(m->key);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->tokens, Range(100 * i, 32));
  }
  // Space again: the disk takes entries again.
  env.Arm({});
  ASSERT_TRUE((*s)->Save(MakeEntry(Range(900, 32), "s9")).ok());
  ASSERT_TRUE((*s)->Save(MakeEntry(Range(1000, 32), "s10")).ok());
  EXPECT_GT((*s)->Stats().ssd_bytes, 0u);
}

}  // namespace
}  // namespace attic::store

namespace attic::store {
namespace {

// The kill -9 loop: a process saving sessions is killed (SIGKILL) at a random call of
// its file layer -- mid-write, before an fsync, between the fsync and the rename, before
// the old entry is removed -- 100 times; after each kill the store is reopened. Each
// session's KV is a function of its tokens, so what a restart finds is checked against
// what was saved: never other KV; no temporary file survives a restart; the files on
// disk are exactly the entries the store indexes (no orphan grows across kills).
constexpr int kSessions = 5;

KvEntry SessionEntry(int round) {
  const int s = round % kSessions;
  const std::vector<int32_t> tokens = Range(1000 * s, 16 + round % 13);
  return MakeEntry(tokens, "s" + std::to_string(s), "default", 2, 8, "fp-A",
                   /*seed=*/static_cast<uint32_t>(tokens.front() * 131 + tokens.size()));
}

[[noreturn]] void SaveUntilKilled(const std::string& dir, int kill_at_call, int first_round) {
  FaultInjectingFileEnv env;
  auto s = KvStore::Open(StoreOn(dir, &env, 0), nullptr);
  if (!s.ok()) std::exit(3);
  env.Arm({.kill_at_call = kill_at_call});
  for (int round = first_round;; ++round)
    if (!(*s)->Save(SessionEntry(round)).ok()) std::exit(4);
}

TEST(SsdFaultsStore, KillLoopNeverServesWrongKvNorGrowsOrphans) {
  // "fast": the child is a fork that runs only the saving loop, in this test's directory
  // (no store of this process is open, so no thread of its own is forked mid-work).
  ::testing::FLAGS_gtest_death_test_style = "fast";
  ScratchDir dir("ssd-kill-loop");
  std::mt19937 rng(2026);
  int found = 0;
  size_t max_files = 0;
  for (int kill = 0; kill < 100; ++kill) {
    const int at = std::uniform_int_distribution<int>(1, 40)(rng);
    EXPECT_EXIT(SaveUntilKilled(dir.path(), at, kill * 7), ::testing::KilledBySignal(SIGKILL), "")
        << "kill " << kill << " at call " << at;
    // Restart.
    auto s = KvStore::Open(StoreOn(dir.path(), FileEnv::Default(), 0), nullptr);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const std::string model_dir = SsdTier::ModelDir(dir.path(), "fp-A");
    ASSERT_EQ(CountFiles(model_dir, ".tmp"), 0) << "kill " << kill;
    const size_t files = CountFiles(model_dir, ".kv");
    EXPECT_EQ((*s)->Stats().entries, files) << "kill " << kill << ": files the store does not index";
    max_files = std::max(max_files, files);
    for (int i = 0; i < kSessions; ++i) {
      const std::string session = "s" + std::to_string(i);
      auto m = (*s)->Lookup("default", session, Range(1000 * i, 40));
      if (!m.has_value()) continue;
      auto e = (*s)->Load(m->key);
      ASSERT_TRUE(e.ok()) << "kill " << kill << " " << session << ": " << e.status().ToString();
      ASSERT_FALSE(e->tokens.empty());
      const KvEntry want = MakeEntry(e->tokens, session, "default", 2, 8, "fp-A",
                                     static_cast<uint32_t>(e->tokens.front() * 131 + e->tokens.size()));
      ASSERT_EQ(e->tokens, Range(1000 * i, e->n_tokens())) << "kill " << kill;
      for (int l = 0; l < want.n_layers; ++l)
        for (int r = 0; r < want.n_tokens(); ++r) {
          ASSERT_EQ(std::memcmp(e->k_row(l, r), want.k_row(l, r), want.kv_dim * sizeof(float)), 0) << "kill " << kill;
          ASSERT_EQ(std::memcmp(e->v_row(l, r), want.v_row(l, r), want.kv_dim * sizeof(float)), 0) << "kill " << kill;
        }
      ++found;
    }
  }
  // One file per session, plus at most one replaced entry per session a kill caught
  // between the new entry's rename and the old one's removal.
  EXPECT_LE(max_files, static_cast<size_t>(2 * kSessions));
  EXPECT_GT(found, 0);
  std::printf("[ kill -9  ] 100 kills: %d sessions found and verified, at most %zu entry files\n", found, max_files);
}

}  // namespace
}  // namespace attic::store
