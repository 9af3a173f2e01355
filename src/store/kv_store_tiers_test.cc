// The store over an ordered tier list: a third tier below SSD, a shared or self-evicting
// or failing lower tier (MemoryTier), and tier I/O outside the store's lock.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "attic/store/kv_store.h"
#include "attic/store/memory_tier.h"
#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::Gate;
using testing::MakeEntry;
using testing::Range;
using testing::ScratchDir;
using testing::TierTestOptions;

// Every test entry has 32 tokens of 2 layers x kv_dim 8: 8 KiB serialized.
const uint64_t kEntry = MakeEntry(Range(0, 32)).SerializedBytes();

KvEntry Job(int n) { return MakeEntry(Range(n * 1000, 32), "j" + std::to_string(n), "default", 2, 8, "fp-A", n); }
std::vector<int32_t> Prompt(int n) { return Range(n * 1000, 33); }
std::string KeyOf(int n) { return Job(n).key().ToString(); }

MemoryTierOptions Remote(uint64_t entries, bool shared = true, bool evicts_itself = false) {
  MemoryTierOptions o;
  o.name = "remote";
  o.capacity = entries * kEntry;
  o.traits.shared = shared;
  o.traits.evicts_itself = evicts_itself;
  o.traits.enumerable = !shared;
  return o;
}

std::unique_ptr<KvStore> Open(std::vector<std::unique_ptr<Tier>> tiers, PolicyKind policy = PolicyKind::kLru) {
  auto s = KvStore::Open(TierTestOptions(policy), std::move(tiers), nullptr);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

void ExpectWithinCapacity(const KvStore& s) {
  for (const auto& t : s.Stats().tiers) EXPECT_LE(t.bytes, t.capacity) << t.name;
}

// Loads session j<n>'s entry and checks it is the saved one.
void ExpectLoads(KvStore& s, int n) {
  auto m = s.Lookup("default", "j" + std::to_string(n), Prompt(n));
  ASSERT_TRUE(m.has_value()) << n;
  auto e = s.Load(m->key);
  ASSERT_TRUE(e.ok()) << n << ": " << e.status().ToString();
  EXPECT_EQ(e->k, Job(n).k) << n;
  EXPECT_EQ(e->v, Job(n).v) << n;
}

TEST(KvStoreTiers, ThreeTiersDemoteDownAndPromoteToTheTop) {
  // DRAM 2, SSD 2, remote 3 entries, LRU. Seven saves fill them top-down: DRAM {j5, j6},
  // SSD {j3, j4}, remote {j0, j1, j2}.
  ScratchDir dir("three");
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::make_unique<DramTier>(2 * kEntry));
  tiers.push_back(std::move(SsdTier::Open(dir.path(), "fp-A", 2 * kEntry)).value());
  tiers.push_back(std::make_unique<MemoryTier>(Remote(3, /*shared=*/false)));
  auto s = Open(std::move(tiers));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->n_tiers(), 3);
  EXPECT_EQ(s->tier_name(TierAt(2)), "remote");
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(s->Save(Job(i)).ok());
    ExpectWithinCapacity(*s);
  }
  auto tier = [&](int n) { return s->TierOf(KeyOf(n)); };
  for (int n : {0, 1, 2}) EXPECT_EQ(tier(n), TierAt(2)) << n;
  for (int n : {3, 4}) EXPECT_EQ(tier(n), TierLevel::kSsd) << n;
  for (int n : {5, 6}) EXPECT_EQ(tier(n), TierLevel::kDram) << n;
  StoreStats st = s->Stats();
  ASSERT_EQ(st.tiers.size(), 3u);
  EXPECT_EQ(st.tiers[0].name, "dram");
  EXPECT_EQ(st.tiers[1].name, "ssd");
  EXPECT_EQ(st.tiers[2].name, "remote");
  EXPECT_EQ(st.tiers[0].evictions, 5u);  // j0..j4 left DRAM
  EXPECT_EQ(st.tiers[1].evictions, 3u);  // j0..j2 left SSD
  EXPECT_EQ(st.tiers[2].evictions, 0u);
  EXPECT_EQ(st.evictions_dram, 5u);
  EXPECT_EQ(st.evictions_ssd, 3u);

  // Loading j0 brings it to DRAM from the remote tier. DRAM's LRU (j5) goes to SSD,
  // whose LRU (j3) goes to the remote tier, where j0's own copy makes room: nothing
  // leaves the store.
  auto m = s->Lookup("default", "j0", Prompt(0));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->tier, TierAt(2));
  EXPECT_EQ(s->Stats().tiers[2].hits, 1u);
  ExpectLoads(*s, 0);
  EXPECT_EQ(tier(0), TierLevel::kDram);
  EXPECT_EQ(tier(5), TierLevel::kSsd);
  EXPECT_EQ(tier(3), TierAt(2));
  for (int n : {1, 2}) EXPECT_EQ(tier(n), TierAt(2)) << n;
  EXPECT_EQ(tier(4), TierLevel::kSsd);
  EXPECT_EQ(tier(6), TierLevel::kDram);
  st = s->Stats();
  EXPECT_EQ(st.entries, 7u);
  EXPECT_EQ(st.tiers[2].evictions, 0u);
  ExpectWithinCapacity(*s);
  for (int n = 0; n < 7; ++n) ExpectLoads(*s, n);
  ExpectWithinCapacity(*s);
  EXPECT_EQ(s->Stats().entries, 7u);
}

TEST(KvStoreTiers, CapacitiesAreHardBoundsOverThreeTiers) {
  for (PolicyKind p : {PolicyKind::kSchedulerAware, PolicyKind::kLru, PolicyKind::kFifo}) {
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(std::make_unique<DramTier>(3 * kEntry));
    tiers.push_back(std::make_unique<MemoryTier>(Remote(4, false)));
    tiers.push_back(std::make_unique<MemoryTier>(Remote(5, false)));
    auto s = Open(std::move(tiers), p);
    ASSERT_NE(s, nullptr);
    for (int i = 0; i < 60; ++i) {
      const int n = 8 + (i * 7) % 40;  // mixed sizes
      ASSERT_TRUE(s->Save(MakeEntry(Range(i * 100, n), "s" + std::to_string(i % 15))).ok());
      s->SetLookAhead({{"default", "s" + std::to_string((i + 1) % 15), Range((i + 1) * 100, 8)}});
      if (i % 3 == 0) s->Prefetch();
      if (i % 4 == 0) {
        auto m = s->Lookup("default", "s" + std::to_string((i + 7) % 15), Range(0, 1));
        if (m) s->Load(m->key).status().IgnoreError();
      }
      ExpectWithinCapacity(*s);
    }
    EXPECT_GT(s->Stats().tiers[2].evictions, 0u);
  }
}

// A tier whose reads or writes can be held at a gate.
class HookedTier final : public Tier {
 public:
  HookedTier(std::unique_ptr<Tier> inner, TierTraits traits) : inner_(std::move(inner)), traits_(traits) {}
  std::function<void(const std::string&)> before_put, before_get;
  std::function<void(const std::string&, const Status&)> after_get;  // before the read's result is returned
  std::string name() const override { return inner_->name(); }
  TierTraits traits() const override { return traits_; }
  Status Put(const std::string& key, std::string_view bytes) override {
    if (before_put) before_put(key);
    return inner_->Put(key, bytes);
  }
  Status PutShared(const std::string& key, SharedBytes bytes) override {
    if (before_put) before_put(key);
    return inner_->PutShared(key, std::move(bytes));
  }
  StatusOr<std::string> Get(const std::string& key) override { return inner_->Get(key); }
  StatusOr<SharedBytes> GetShared(const std::string& key) override {
    if (before_get) before_get(key);
    StatusOr<SharedBytes> read = inner_->GetShared(key);
    if (after_get) after_get(key, read.status());
    return read;
  }
  Status Erase(const std::string& key) override { return inner_->Erase(key); }
  bool Contains(const std::string& key) const override { return inner_->Contains(key); }
  int64_t SizeOf(const std::string& key) const override { return inner_->SizeOf(key); }
  std::vector<std::string> Keys() const override { return inner_->Keys(); }
  uint64_t bytes() const override { return inner_->bytes(); }
  uint64_t capacity() const override { return inner_->capacity(); }

 private:
  std::unique_ptr<Tier> inner_;
  TierTraits traits_;
};

// Runs f on another thread; whether it finished within `seconds`.
bool FinishesWithin(double seconds, std::function<void()> f, std::thread* t) {
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  *t = std::thread([f, done] {
    f();
    done->set_value();
  });
  return fut.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
}

// A store of one DRAM entry over a hooked 4-entry tier (not shared, not local memory);
// *hooked: that tier, for setting its hooks.
std::unique_ptr<KvStore> OpenOverHooked(HookedTier** hooked) {
  auto lower = std::make_unique<HookedTier>(std::make_unique<MemoryTier>(Remote(4, false)), TierTraits{});
  *hooked = lower.get();
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::make_unique<DramTier>(1 * kEntry));
  tiers.push_back(std::move(lower));
  return Open(std::move(tiers));
}

// A demotion writes to the tier below without the store's lock: while that write is
// held, lookups, statistics and a read of the entry being demoted (from its source
// copy) go on.
TEST(KvStoreTiers, DemotionWritesOutsideTheStoreLock) {
  Gate gate;
  HookedTier* lower = nullptr;
  auto s = OpenOverHooked(&lower);
  ASSERT_NE(s, nullptr);
  lower->before_put = [&](const std::string&) { gate.Pass(); };
  ASSERT_TRUE(s->Save(Job(0)).ok());
  gate.Hold();
  Gate::ReleaseAtExit release{&gate};
  std::thread saver([&] { ASSERT_TRUE(s->Save(Job(1)).ok()); });  // demotes j0: its write waits at the gate
  gate.WaitArrivals(1);
  std::thread reader;
  const bool went_on = FinishesWithin(
      5.0,
      [&] {
        auto m = s->Lookup("default", "j0", Prompt(0));
        ASSERT_TRUE(m.has_value());
        EXPECT_EQ(m->tier, TierLevel::kDram);  // still where it was until the copy below is written
        auto e = s->Load(m->key);
        ASSERT_TRUE(e.ok()) << e.status().ToString();
        EXPECT_EQ(e->v, Job(0).v);
        EXPECT_EQ(s->Stats().entries, 1u);  // j1 is not indexed before it is placed
      },
      &reader);
  EXPECT_TRUE(went_on) << "a lookup waited for the demotion's write";
  gate.Release();
  reader.join();
  saver.join();
  EXPECT_EQ(s->TierOf(KeyOf(0)), TierLevel::kSsd);
  EXPECT_EQ(s->TierOf(KeyOf(1)), TierLevel::kDram);
  ExpectLoads(*s, 0);
  ExpectWithinCapacity(*s);
}

// A read that fails because its entry moved meanwhile is read again from where it went
// ("moved, retry"), not a miss and not a drop.
TEST(KvStoreTiers, AReadOfAnEntryThatMovedIsRetriedWhereItWent) {
  Gate gate;
  std::atomic<int> reads{0};
  const std::string key0 = KeyOf(0);
  auto top = std::make_unique<HookedTier>(std::make_unique<DramTier>(1 * kEntry), TierTraits{});
  HookedTier* top_ptr = top.get();
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::move(top));
  tiers.push_back(std::make_unique<MemoryTier>(Remote(4, false)));
  auto s = Open(std::move(tiers));
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Save(Job(0)).ok());
  // The first read of j0 from the top tier waits at the gate.
  top_ptr->before_get = [&](const std::string& key) {
    if (key == key0 && reads.fetch_add(1) == 0) gate.Pass();
  };
  gate.Hold();
  Gate::ReleaseAtExit release{&gate};
  StatusOr<KvEntry> loaded = NotFoundError("not run");
  std::thread loader([&] { loaded = s->Load(key0); });
  gate.WaitArrivals(1);
  // Meanwhile j1's save demotes j0 (its source read passes the gate: not the first).
  ASSERT_TRUE(s->Save(Job(1)).ok());
  ASSERT_EQ(s->TierOf(key0), TierLevel::kSsd);
  gate.Release();
  loader.join();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->k, Job(0).k);
  StoreStats st = s->Stats();
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.corrupt, 0u);
  EXPECT_EQ(st.read_errors, 0u);
}

// The lower tier is a shared remote one in these: DRAM holds one entry, so j0 is on the
// remote tier once j1 is saved.
struct WithRemote {
  MemoryTier* remote = nullptr;
  std::unique_ptr<KvStore> store;
  explicit WithRemote(MemoryTierOptions o) {
    auto r = std::make_unique<MemoryTier>(o);
    remote = r.get();
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(std::make_unique<DramTier>(1 * kEntry));
    tiers.push_back(std::move(r));
    store = Open(std::move(tiers));
    EXPECT_TRUE(store->Save(Job(0)).ok());
    EXPECT_TRUE(store->Save(Job(1)).ok());
    EXPECT_EQ(store->TierOf(KeyOf(0)), TierLevel::kSsd);
  }
};

TEST(KvStoreTiers, TransientFailureOfALowerTierIsAMissAndTheEntryStays) {
  WithRemote t(Remote(4));
  KvStore& s = *t.store;
  for (const Status& fault : {UnavailableError("connection reset"), Status(StatusCode::kDeadlineExceeded, "timeout")}) {
    t.remote->FailNextReads(1, fault);
    const uint64_t reads = t.remote->reads();
    auto f = s.Fetch(KeyOf(0));
    EXPECT_EQ(f.status().code(), StatusCode::kUnavailable) << f.status().ToString();
    EXPECT_EQ(t.remote->reads(), reads + 1);  // one try: a timeout is a miss, not a retry loop
    EXPECT_TRUE(s.Contains(KeyOf(0)));
    EXPECT_EQ(s.TierOf(KeyOf(0)), TierLevel::kSsd);
  }
  StoreStats st = s.Stats();
  EXPECT_EQ(st.read_errors, 2u);
  EXPECT_EQ(st.corrupt, 0u);
  EXPECT_EQ(st.vanished, 0u);
  // Next time it reads.
  ExpectLoads(s, 0);
  EXPECT_EQ(s.TierOf(KeyOf(0)), TierLevel::kDram);
}

TEST(KvStoreTiers, AnEntryGoneFromASelfEvictingTierIsDroppedQuietly) {
  WithRemote t(Remote(4, /*shared=*/false, /*evicts_itself=*/true));
  KvStore& s = *t.store;
  t.remote->Vanish(KeyOf(0));  // maxmemory or a TTL took it
  auto m = s.Lookup("default", "j0", Prompt(0));
  ASSERT_TRUE(m.has_value());  // the index cannot know yet
  EXPECT_EQ(s.Fetch(m->key).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(s.Contains(KeyOf(0)));
  EXPECT_FALSE(s.Lookup("default", "j0", Prompt(0)).has_value());
  StoreStats st = s.Stats();
  EXPECT_EQ(st.vanished, 1u);
  EXPECT_EQ(st.corrupt, 0u);
  EXPECT_EQ(st.entries, 1u);
}

TEST(KvStoreTiers, ASelfEvictingTierMakesItsOwnRoom) {
  // Remote holds 2 entries and evicts its oldest itself: the store makes no room there
  // (its victims from DRAM go down without displacing anything the store chose), and
  // entries the tier dropped are found missing when read.
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::make_unique<DramTier>(1 * kEntry));
  auto remote = std::make_unique<MemoryTier>(Remote(2, true, true));
  MemoryTier* r = remote.get();
  tiers.push_back(std::move(remote));
  auto s = Open(std::move(tiers));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(s->Save(Job(i)).ok());
  EXPECT_EQ(s->Stats().entries, 5u);      // j4 in DRAM, j0..j3 demoted
  EXPECT_EQ(s->Stats().tiers[1].evictions, 0u);
  EXPECT_LE(r->bytes(), r->capacity());
  EXPECT_FALSE(r->Contains(KeyOf(0)));  // the tier's own evictions
  EXPECT_FALSE(r->Contains(KeyOf(1)));
  for (int n : {0, 1}) EXPECT_EQ(s->Fetch(KeyOf(n)).status().code(), StatusCode::kNotFound);
  ExpectLoads(*s, 2);
  StoreStats st = s->Stats();
  EXPECT_EQ(st.vanished, 2u);
  EXPECT_EQ(st.corrupt, 0u);
}

TEST(KvStoreTiers, CorruptBytesInALowerTierAreDroppedAndCounted) {
  WithRemote t(Remote(4));
  KvStore& s = *t.store;
  auto m = s.Lookup("default", "j0", Prompt(0));
  ASSERT_TRUE(m.has_value());
  t.remote->Corrupt(KeyOf(0), kEntry - 17);  // a byte of the last layer
  EXPECT_EQ(s.Fetch(m->key).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(s.Contains(KeyOf(0)));
  EXPECT_FALSE(t.remote->Contains(KeyOf(0)));  // deleted, not left to be read again
  StoreStats st = s.Stats();
  EXPECT_EQ(st.corrupt, 1u);
  EXPECT_EQ(st.vanished, 0u);
  ExpectLoads(s, 1);
}

TEST(KvStoreTiers, PrefetchFromAFailingTierLeavesTheEntry) {
  // Scheduler-aware: j0 (remote) is prefetched for its queued job; the first attempt
  // times out (kept, no promotion), the next promotes it.
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::make_unique<DramTier>(2 * kEntry));
  auto remote = std::make_unique<MemoryTier>(Remote(4));
  MemoryTier* r = remote.get();
  tiers.push_back(std::move(remote));
  auto s = Open(std::move(tiers), PolicyKind::kSchedulerAware);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->Save(Job(i)).ok());
  ASSERT_EQ(s->TierOf(KeyOf(0)), TierLevel::kSsd);
  s->SetLookAhead({{"default", "j0", Prompt(0)}});
  r->FailNextReads(1, Status(StatusCode::kDeadlineExceeded, "timeout"));
  EXPECT_EQ(s->Prefetch(), 0);
  EXPECT_TRUE(s->Contains(KeyOf(0)));
  EXPECT_EQ(s->Prefetch(), 1);
  EXPECT_EQ(s->TierOf(KeyOf(0)), TierLevel::kDram);
  ExpectWithinCapacity(*s);
}

TEST(KvStoreTiers, ANonEnumerableTierIsNotRebuiltAndADuplicateInASharedTierIsACopy) {
  // A shared tier the store cannot list is not read at open: its entries are unknown.
  {
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(std::make_unique<DramTier>(4 * kEntry));
    auto remote = std::make_unique<MemoryTier>(Remote(4));
    ASSERT_TRUE(remote->Put(KeyOf(5), *SerializeEntry(Job(5))).ok());
    tiers.push_back(std::move(remote));
    auto s = Open(std::move(tiers));
    EXPECT_EQ(s->Stats().entries, 0u);
  }
  // An enumerable shared tier holding an entry DRAM also holds: the lower one is a copy
  // (another instance's), not a corrupt duplicate to delete.
  std::vector<std::unique_ptr<Tier>> tiers;
  auto dram = std::make_unique<DramTier>(4 * kEntry);
  ASSERT_TRUE(dram->Put(KeyOf(5), *SerializeEntry(Job(5))).ok());
  MemoryTierOptions o = Remote(4);
  o.traits.enumerable = true;
  auto remote = std::make_unique<MemoryTier>(o);
  ASSERT_TRUE(remote->Put(KeyOf(5), *SerializeEntry(Job(5))).ok());
  MemoryTier* r = remote.get();
  tiers.push_back(std::move(dram));
  tiers.push_back(std::move(remote));
  auto s = Open(std::move(tiers));
  EXPECT_EQ(s->Stats().entries, 1u);
  EXPECT_EQ(s->Stats().corrupt, 0u);
  EXPECT_TRUE(r->Contains(KeyOf(5)));
  EXPECT_EQ(s->TierOf(KeyOf(5)), TierLevel::kDram);
}

// A read of an entry below that fails because the entry was saved again meanwhile (its
// copy below erased) is read again, even when the new entry is back where the read began
// after as many moves: the same key, tier and move count as the entry the read began on.
// Taking it for that entry made the failed read "unreadable": the valid new entry was
// dropped and counted corrupt (seen once in the concurrent test below, under TSan).
TEST(KvStoreTiers, AReadRacingAResaveThatEndsWhereItBeganReadsAgain) {
  Gate before_read, after_read;  // outlive the store, whose tier's hooks use them
  std::atomic<bool> first{true}, answering{false};
  HookedTier* hooked = nullptr;
  auto s = OpenOverHooked(&hooked);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Save(Job(0)).ok());
  ASSERT_TRUE(s->Save(Job(1)).ok());  // demotes j0: below, after one move
  ASSERT_EQ(s->TierOf(KeyOf(0)), TierAt(1));
  // The first read of j0 below waits before it looks and again before it answers.
  hooked->before_get = [&](const std::string& k) {
    if (k == KeyOf(0) && first.exchange(false)) {
      before_read.Pass();
      answering = true;
    }
  };
  hooked->after_get = [&](const std::string&, const Status&) {
    if (answering.exchange(false)) after_read.Pass();
  };
  before_read.Hold();
  after_read.Hold();
  Gate::ReleaseAtExit release_before{&before_read}, release_after{&after_read};
  StatusOr<KvEntry> loaded = NotFoundError("not run");
  std::thread reader([&] { loaded = s->Load(KeyOf(0)); });
  // EXPECT, not ASSERT, until the reader is joined.
  before_read.WaitArrivals(1);
  EXPECT_TRUE(s->Save(Job(0)).ok());  // saved again: the copy below is erased, the new one in DRAM
  before_read.Release();
  after_read.WaitArrivals(1);         // the read below found nothing
  EXPECT_TRUE(s->Save(Job(2)).ok());  // demotes the new j0: below again, after one move
  EXPECT_EQ(s->TierOf(KeyOf(0)), TierAt(1));
  after_read.Release();
  reader.join();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->k, Job(0).k);
  EXPECT_EQ(loaded->v, Job(0).v);
  EXPECT_EQ(s->Stats().corrupt, 0u);
  EXPECT_TRUE(s->Contains(KeyOf(0)));
  ExpectLoads(*s, 0);
}

// Saves, lookups, loads, prefetches and expiry from several threads over a slow lower
// tier: capacities hold at every moment checked, and a load returns the saved entry or
// a miss, never other bytes.
TEST(KvStoreTiers, ConcurrentUseKeepsCapacitiesAndNeverServesWrongBytes) {
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::make_unique<DramTier>(3 * kEntry));
  MemoryTierOptions o = Remote(5, false);
  o.latency = std::chrono::microseconds(200);
  tiers.push_back(std::make_unique<MemoryTier>(o));
  auto s = Open(std::move(tiers), PolicyKind::kSchedulerAware);
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, over{0};
  auto check = [&] {
    for (const auto& t : s->Stats().tiers)
      if (t.bytes > t.capacity) ++over;
  };
  std::thread saver([&] {
    for (int i = 0; i < 300; ++i) {
      s->Save(Job(i % 12)).IgnoreError();
      check();
    }
    stop = true;
  });
  std::thread reader([&] {
    std::mt19937 rng(3);
    while (!stop) {
      const int n = static_cast<int>(rng() % 12);
      auto m = s->Lookup("default", "j" + std::to_string(n), Prompt(n));
      if (!m) continue;
      auto e = s->Load(m->key);
      if (e.ok() && (e->k != Job(n).k || e->v != Job(n).v)) ++wrong;
      check();
    }
  });
  std::thread prefetcher([&] {
    int i = 0;
    while (!stop) {
      s->SetLookAhead({{"default", "j" + std::to_string(i % 12), Prompt(i % 12)},
                       {"default", "j" + std::to_string((i + 5) % 12), Prompt((i + 5) % 12)}});
      s->Prefetch();
      if (++i % 10 == 0) s->EraseSession("default", "j" + std::to_string(i % 12)).IgnoreError();
      check();
    }
  });
  saver.join();
  reader.join();
  prefetcher.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(over.load(), 0);
  EXPECT_EQ(s->Stats().corrupt, 0u);
  for (int n = 0; n < 12; ++n)
    if (s->Contains(KeyOf(n))) ExpectLoads(*s, n);
}

}  // namespace
}  // namespace attic::store
