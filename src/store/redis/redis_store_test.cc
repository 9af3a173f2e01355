// KvStore with RedisTier as its shared bottom tier, on the real cluster of the
// `redis_cluster` fixture: demotion to the cluster and back, two stores (two server
// instances) sharing sessions through it with tenancy intact, a damaged value as a miss
// that is dropped, and a cluster that is not there as misses, never errors or hangs.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <utility>

#include "attic/store/kv_store.h"
#include "attic/store/redis_tier.h"
#include "attic/tensor/dtype.h"
#include "store/redis/cluster_client.h"
#include "store/redis/redis_test_util.h"
#include "store/store_test_util.h"

namespace attic::store {
namespace {

using namespace std::chrono_literals;
using redis::testing::FreshPrefix;
using testing::MakeEntry;
using testing::Range;
using testing::TierTestOptions;

const uint64_t kEntry = MakeEntry(Range(0, 32)).SerializedBytes();

KvEntry Job(int n, const std::string& tenant = "default") {
  return MakeEntry(Range(n * 1000, 32), "j" + std::to_string(n), tenant, 2, 8, "fp-A", n);
}

struct Instance {
  RedisTier* remote = nullptr;  // owned by the store
  std::unique_ptr<KvStore> store;
};

// A store of DRAM (`dram_entries` entries) over the remote tier, as `attic serve
// --kv-dram ... --kv-remote ...` makes it.
Instance Open(const std::string& prefix, uint64_t dram_entries, bool write_through,
              const std::string& url = "redis://" + redis::testing::TestNodes(),
              PolicyKind policy = PolicyKind::kLru, const std::string& write_through_session_prefix = "",
              bool stream_layers = true, KvDtype kv_dtype = KvDtype::kF32) {
  StoreOptions o = TierTestOptions(policy);
  o.kv_dtype = kv_dtype;
  o.write_through = write_through;
  o.write_through_session_prefix = write_through_session_prefix;
  o.stream_layers = stream_layers;
  RedisTierOptions r;
  r.url = url;
  r.prefix = prefix;
  r.capacity = 64 << 20;
  r.retry_budget = 500ms;
  r.command_timeout = 300ms;
  auto tier = RedisTier::Open(r);
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  Instance in;
  in.remote = tier->get();
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::make_unique<DramTier>(dram_entries * kEntry));
  tiers.push_back(std::move(*tier));
  auto s = KvStore::Open(o, std::move(tiers), nullptr);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  in.store = std::move(*s);
  return in;
}

void ExpectLoads(KvStore& s, int n, const std::string& tenant = "default") {
  auto m = s.Lookup(tenant, "j" + std::to_string(n), Range(n * 1000, 33));
  ASSERT_TRUE(m.has_value()) << n;
  EXPECT_EQ(m->n_tokens, 32);
  auto e = s.Load(m->key);
  ASSERT_TRUE(e.ok()) << n << ": " << e.status().ToString();
  EXPECT_EQ(e->k, Job(n).k) << n;
  EXPECT_EQ(e->v, Job(n).v) << n;
}

TEST(KvStoreOnRedis, DemotedEntriesComeBackFromTheCluster) {
  ATTIC_REQUIRE_REDIS();
  Instance a = Open(FreshPrefix(), 2, /*write_through=*/false);
  ASSERT_NE(a.store, nullptr);
  EXPECT_EQ(a.store->tier_name(TierAt(1)), "remote");
  for (int n = 0; n < 5; ++n) ASSERT_TRUE(a.store->Save(Job(n)).ok()) << n;
  // DRAM holds the last two; the first three were demoted to the cluster (write-back).
  for (int n = 0; n < 3; ++n) EXPECT_EQ(a.store->TierOf(Job(n).key().ToString()), TierAt(1)) << n;
  EXPECT_EQ(a.remote->stats().puts, 3u);
  for (int n = 0; n < 5; ++n) ExpectLoads(*a.store, n);
  EXPECT_GE(a.store->Stats().tiers[1].hits, 3u);
  EXPECT_EQ(a.store->Stats().corrupt, 0u);
}

TEST(KvStoreOnRedis, ASessionSavedByOneStoreIsFoundByAnotherOfTheSameTenantOnly) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  Instance a = Open(prefix, 8, /*write_through=*/true);
  Instance b = Open(prefix, 8, /*write_through=*/true);
  ASSERT_TRUE(a.store->Save(Job(1, "tenant-1")).ok());
  EXPECT_EQ(a.store->Stats().write_throughs, 1u);
  EXPECT_EQ(a.store->TierOf(Job(1, "tenant-1").key().ToString()), TierAt(0));  // and a copy in the cluster
  // Another tenant asking for the same session id finds nothing, on either instance.
  EXPECT_FALSE(b.store->Lookup("tenant-2", "j1", Range(1000, 33)).has_value());
  EXPECT_FALSE(a.store->Lookup("tenant-2", "j1", Range(1000, 33)).has_value());
  // The same tenant on instance B finds A's save in the cluster and loads it.
  auto m = b.store->Lookup("tenant-1", "j1", Range(1000, 33));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->tier, TierAt(1));
  EXPECT_EQ(m->n_tokens, 32);
  auto e = b.store->Load(m->key);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->k, Job(1, "tenant-1").k);
  EXPECT_EQ(e->tenant, "tenant-1");
  EXPECT_EQ(b.store->Stats().shared_found, 1u);
  EXPECT_EQ(b.store->TierOf(m->key), TierAt(0));  // promoted to B's DRAM
  // B's next turn of the session replaces it for both.
  KvEntry turn2 = MakeEntry(Range(1000, 48), "j1", "tenant-1", 2, 8, "fp-A", 9);
  ASSERT_TRUE(b.store->Save(turn2).ok());
  Instance c = Open(prefix, 8, true);
  auto m2 = c.store->Lookup("tenant-1", "j1", Range(1000, 49));
  ASSERT_TRUE(m2.has_value());
  EXPECT_EQ(m2->entry_tokens, 48);
}

// Context-cache chunks (sessions "ctx:...") are written through under write-back, so
// that another instance finds them by session at once (DiscoverSession, as linking asks);
// other sessions stay local until demoted.
TEST(KvStoreOnRedis, SessionsOfTheWriteThroughPrefixReachTheClusterUnderWriteBack) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  Instance a = Open(prefix, 8, /*write_through=*/false, "redis://" + redis::testing::TestNodes(), PolicyKind::kLru,
                    "ctx:");
  Instance b = Open(prefix, 8, /*write_through=*/false);
  const KvEntry chunk = MakeEntry(Range(500, 32), "ctx:00000000000000ab", "default", 2, 8, "fp-A", 7);
  ASSERT_TRUE(a.store->Save(chunk).ok());
  ASSERT_TRUE(a.store->Save(Job(1)).ok());
  EXPECT_EQ(a.store->Stats().write_throughs, 1u);
  EXPECT_EQ(a.remote->stats().puts, 1u);
  EXPECT_EQ(a.store->TierOf(chunk.key().ToString()), TierAt(0));  // and its copy in the cluster
  // B does not index what it never saw until it asks by session.
  EXPECT_FALSE(b.store->Contains(chunk.key().ToString()));
  b.store->DiscoverSession("default", "ctx:00000000000000ab");
  EXPECT_EQ(b.store->TierOf(chunk.key().ToString()), TierAt(1));
  auto e = b.store->Load(chunk.key().ToString());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->k, chunk.k);
  EXPECT_EQ(e->v, chunk.v);
  EXPECT_EQ(e->tokens, chunk.tokens);
  // Another tenant asking for the same session finds nothing; Job(1) never left A.
  b.store->DiscoverSession("tenant-2", "ctx:00000000000000ab");
  b.store->DiscoverSession("default", "j1");
  EXPECT_EQ(b.store->Stats().shared_found, 1u);
  EXPECT_FALSE(b.store->Contains(Job(1).key().ToString()));
}

// The scheduler-aware prefetcher looks for queued jobs' sessions in the cluster (off the
// step loop) and pulls them to DRAM before their admission; a session nobody saved is
// asked for once, not at every prefetch run.
TEST(KvStoreOnRedis, ThePrefetcherFindsQueuedSessionsInTheClusterAndPullsThemToDram) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  Instance a = Open(prefix, 8, true);
  Instance b = Open(prefix, 8, true, "redis://" + redis::testing::TestNodes(), PolicyKind::kSchedulerAware);
  ASSERT_TRUE(a.store->Save(Job(4)).ok());
  const std::string key = Job(4).key().ToString();
  b.store->SetLookAhead({QueuedJob{"default", "j4", Range(4000, 33), 33}});
  EXPECT_EQ(b.store->Prefetch(), 1);
  EXPECT_EQ(b.store->Stats().shared_found, 1u);
  EXPECT_EQ(b.store->TierOf(key), TierAt(0));  // in B's DRAM before the job is admitted
  auto m = b.store->Lookup("default", "j4", Range(4000, 33));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->tier, TierAt(0));
  EXPECT_EQ(b.store->Stats().shared_found, 1u);  // the lookup did not ask again
  const uint64_t calls = b.remote->client().stats().calls;
  b.store->SetLookAhead({QueuedJob{"default", "nobody-saved-this", Range(9000, 33), 33}});
  b.store->Prefetch();
  b.store->Prefetch();
  EXPECT_EQ(b.remote->client().stats().calls - calls, 1u);  // one FindSession, then not again within 1 s
}

// Turn 1 of session "conv" saved by A; B finds it in the cluster and saves turn 2 (16
// tokens more), which names the session in the cluster now.
std::pair<KvEntry, KvEntry> ContinuedOnB(Instance& a, Instance& b) {
  KvEntry turn1 = MakeEntry(Range(1000, 32), "conv", "default", 2, 8, "fp-A", 1);
  KvEntry turn2 = MakeEntry(Range(1000, 48), "conv", "default", 2, 8, "fp-A", 2);
  EXPECT_TRUE(a.store->Save(turn1).ok());
  EXPECT_TRUE(b.store->Lookup("default", "conv", Range(1000, 33)).has_value());  // turn 1, from the cluster
  EXPECT_TRUE(b.store->Save(turn2).ok());
  return {std::move(turn1), std::move(turn2)};
}

// A conversation that goes A -> B -> A: A indexes its own turn 1, B continues it and
// saves turn 2 to the cluster; back on A, the lookup takes B's turn 2 (it shares more
// of the prompt) instead of A's shorter turn 1, which it drops as a save of turn 2 on A
// would have.
TEST(KvStoreOnRedis, AConversationBackOnAnInstanceTakesTheLaterTurnAnotherSaved) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  Instance a = Open(prefix, 8, true);
  Instance b = Open(prefix, 8, true);
  const auto [turn1, turn2] = ContinuedOnB(a, b);
  const uint64_t found = a.store->Stats().shared_found;
  auto m = a.store->Lookup("default", "conv", Range(1000, 49));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->key, turn2.key().ToString());
  EXPECT_EQ(m->n_tokens, 48);
  EXPECT_EQ(m->tier, TierAt(1));
  EXPECT_EQ(a.store->Stats().shared_found, found + 1);
  EXPECT_EQ(a.store->Stats().shared_superseded, 1u);
  EXPECT_FALSE(a.store->Contains(turn1.key().ToString()));  // replaced, as a save here replaces it
  auto e = a.store->Load(m->key);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->k, turn2.k);
  EXPECT_EQ(e->v, turn2.v);
  // Asked again, the cluster names the entry indexed here: nothing new.
  ASSERT_TRUE(a.store->Lookup("default", "conv", Range(1000, 49)).has_value());
  EXPECT_EQ(a.store->Stats().shared_found, found + 1);
  // Another tenant with the same session id still finds nothing of it.
  EXPECT_FALSE(a.store->Lookup("tenant-2", "conv", Range(1000, 49)).has_value());
}

// The prefetcher asks for queued jobs' sessions indexed here too, and pulls another
// instance's later turn to DRAM before the job's admission. An entry in the cluster that
// serves the prompt less well than the one indexed here (a write-back instance's newer
// turn that never reached the cluster) is left alone.
TEST(KvStoreOnRedis, ThePrefetcherFindsALaterTurnAndKeepsABetterLocalOne) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  const std::string nodes = "redis://" + redis::testing::TestNodes();
  Instance a = Open(prefix, 8, true, nodes, PolicyKind::kSchedulerAware);
  Instance b = Open(prefix, 8, true);
  const auto [turn1, turn2] = ContinuedOnB(a, b);
  a.store->SetLookAhead({QueuedJob{"default", "conv", Range(1000, 49), 49}});
  a.store->Prefetch();
  EXPECT_EQ(a.store->Stats().shared_superseded, 1u);
  EXPECT_EQ(a.store->TierOf(turn2.key().ToString()), TierAt(0));  // in A's DRAM before admission
  EXPECT_FALSE(a.store->Contains(turn1.key().ToString()));
  auto m = a.store->Lookup("default", "conv", Range(1000, 49));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->key, turn2.key().ToString());
  EXPECT_EQ(m->tier, TierAt(0));

  // C writes back: its turn 3 stays local; the cluster still names turn 2.
  Instance c = Open(prefix, 8, /*write_through=*/false, nodes, PolicyKind::kSchedulerAware);
  const KvEntry turn3 = MakeEntry(Range(1000, 64), "conv", "default", 2, 8, "fp-A", 3);
  ASSERT_TRUE(c.store->Save(turn3).ok());
  c.store->SetLookAhead({QueuedJob{"default", "conv", Range(1000, 65), 65}});
  c.store->Prefetch();
  auto m3 = c.store->Lookup("default", "conv", Range(1000, 65));
  ASSERT_TRUE(m3.has_value());
  EXPECT_EQ(m3->key, turn3.key().ToString());
  EXPECT_EQ(m3->n_tokens, 64);
  EXPECT_EQ(c.store->Stats().shared_found, 0u);
  EXPECT_FALSE(c.store->Contains(turn2.key().ToString()));
}

TEST(KvStoreOnRedis, ADamagedValueIsAMissAndIsDropped) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  Instance a = Open(prefix, 8, true);
  Instance b = Open(prefix, 8, true);
  ASSERT_TRUE(a.store->Save(Job(2)).ok());
  const std::string key = Job(2).key().ToString();
  // Layer 1 (field "2": the header is part 0) damaged in the cluster.
  const std::string hk = b.remote->HashKey(key);
  auto part = b.remote->client().Run(hk, {"HGET", hk, "2"});
  ASSERT_TRUE(part.ok());
  std::string bytes(redis::ReplyText(**part));
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() / 2] ^= 0x04;
  ASSERT_TRUE(b.remote->client().Run(hk, {"HSET", hk, "2", bytes}).ok());
  auto m = b.store->Lookup("default", "j2", Range(2000, 33));
  ASSERT_TRUE(m.has_value());  // the header is fine: found
  auto e = b.store->Load(m->key);
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound) << e.status().ToString();  // a miss, never bad KV
  EXPECT_EQ(b.store->Stats().corrupt, 1u);
  EXPECT_FALSE(b.store->Contains(key));
  EXPECT_FALSE(b.remote->Contains(key));  // deleted from the cluster
}

// Polls `done` until it holds (what a store's background thread finishes). No deadline of
// its own: how long the thread takes depends on the machine; one that never finishes is
// a hang, which the test's ctest TIMEOUT fails.
bool Eventually(const std::function<bool()>& done) {
  while (!done()) std::this_thread::sleep_for(1ms);
  return true;
}

// A turn's entry on the cluster (saved by another store) streams in: OpenForTurn returns
// at once with the header checked, each layer is readable once it arrived and equals
// what was saved, and the finished read is promoted to DRAM like a fetched entry.
TEST(KvStoreOnRedis, ATurnsEntryFromTheClusterStreamsInLayerByLayer) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  Instance a = Open(prefix, 8, true);
  Instance b = Open(prefix, 8, true);
  const KvEntry saved = MakeEntry(Range(3000, 32), "j3", "default", 4, 8, "fp-A", 3);
  ASSERT_TRUE(a.store->Save(saved).ok());
  const std::string key = saved.key().ToString();
  auto hit = b.store->FindForTurn("default", "j3", Range(3000, 33), /*read_queued=*/false);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->n_tokens, 32);
  auto src = b.store->OpenForTurn(*hit);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_TRUE((*src)->streamed());
  EXPECT_EQ((*src)->n_rows(), 32);
  for (int l = 0; l < 4; ++l) {
    ASSERT_TRUE((*src)->AwaitLayer(l).ok()) << l;
    const KvSource::Layer layer = (*src)->layer(l);
    for (int row = 0; row < 32; ++row) {
      EXPECT_TRUE(std::equal(layer.K(row), layer.K(row) + 8, saved.k[l].begin() + row * 8)) << l << " " << row;
      EXPECT_TRUE(std::equal(layer.V(row), layer.V(row) + 8, saved.v[l].begin() + row * 8)) << l << " " << row;
    }
  }
  ASSERT_TRUE((*src)->AwaitAll().ok());
  EXPECT_TRUE((*src)->bytes()->view() == *SerializeEntry(saved));  // a whole serialized entry
  EXPECT_EQ(b.store->Stats().streamed_loads, 1u);
  EXPECT_TRUE(Eventually([&] { return b.store->TierOf(key) == TierLevel::kDram; }));
  // From DRAM now: read whole, not streamed.
  auto again = b.store->OpenForTurn(*b.store->FindForTurn("default", "j3", Range(3000, 33), false));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE((*again)->streamed());
  // With streaming off, a cluster entry is read whole before the turn starts.
  Instance c = Open(prefix, 8, true, "redis://" + redis::testing::TestNodes(), PolicyKind::kLru, "", false);
  auto whole = c.store->OpenForTurn(*c.store->FindForTurn("default", "j3", Range(3000, 33), false));
  ASSERT_TRUE(whole.ok());
  EXPECT_FALSE((*whole)->streamed());
  EXPECT_EQ(c.store->Stats().streamed_loads, 0u);
}

// A layer damaged in the cluster is found when it arrives, after the turn started: the
// source fails from that layer on (the layers before it were good and stay readable),
// never hands out the bad one, and the entry is dropped as corrupt.
TEST(KvStoreOnRedis, AStreamedLayerFoundDamagedFailsTheSourceFromThatLayerOn) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  Instance a = Open(prefix, 8, true);
  Instance b = Open(prefix, 8, true);
  const KvEntry saved = MakeEntry(Range(4000, 32), "j4", "default", 4, 8, "fp-A", 4);
  ASSERT_TRUE(a.store->Save(saved).ok());
  const std::string key = saved.key().ToString();
  // Layer 2 (field "3": the header is part 0) with a flipped bit.
  const std::string hk = b.remote->HashKey(key);
  auto part = b.remote->client().Run(hk, {"HGET", hk, "3"});
  ASSERT_TRUE(part.ok());
  std::string bytes(redis::ReplyText(**part));
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() / 3] ^= 0x20;
  ASSERT_TRUE(b.remote->client().Run(hk, {"HSET", hk, "3", bytes}).ok());
  auto hit = b.store->FindForTurn("default", "j4", Range(4000, 33), false);
  ASSERT_TRUE(hit.has_value());
  auto src = b.store->OpenForTurn(*hit);
  ASSERT_TRUE(src.ok()) << src.status().ToString();  // the header is fine
  ASSERT_TRUE((*src)->streamed());
  EXPECT_TRUE((*src)->AwaitLayer(1).ok());
  EXPECT_TRUE(std::equal((*src)->layer(1).K(0), (*src)->layer(1).K(0) + 8, saved.k[1].begin()));
  EXPECT_EQ((*src)->AwaitLayer(2).code(), StatusCode::kDataLoss);
  EXPECT_EQ((*src)->AwaitLayer(3).code(), StatusCode::kDataLoss);
  EXPECT_EQ((*src)->AwaitAll().code(), StatusCode::kDataLoss);
  // The streamer counts the failure last, after the entry is dropped and counted corrupt.
  EXPECT_TRUE(Eventually([&] { return b.store->Stats().stream_failures == 1; }));
  EXPECT_FALSE(b.store->Contains(key));
  const StoreStats st = b.store->Stats();
  EXPECT_EQ(st.corrupt, 1u);
  EXPECT_EQ(st.stream_failures, 1u);
  EXPECT_FALSE(b.remote->Contains(key));  // deleted from the cluster
  EXPECT_FALSE(b.store->FindForTurn("default", "j4", Range(4000, 33), false).has_value());
}

TEST(KvStoreOnRedis, NoClusterMeansMissesNotErrors) {
  Instance a = Open(FreshPrefix(), 8, true, "redis://127.0.0.1:1,127.0.0.1:2");
  ASSERT_NE(a.store, nullptr);
  // Every call returns (a hang is the ctest TIMEOUT's to fail), with misses, not errors.
  ASSERT_TRUE(a.store->Save(Job(3)).ok());  // kept in DRAM; the write-through failed
  EXPECT_EQ(a.store->Stats().write_through_errors, 1u);
  ExpectLoads(*a.store, 3);
  EXPECT_FALSE(a.store->Lookup("default", "unknown", Range(0, 33)).has_value());
}

// MakeEntry's rows as an f16 or a quantized entry (kv_dim 16: two groups of 8 a row).
KvEntry Typed(KvDtype dtype, int n, int n_tokens) {
  KvEntry e = MakeEntry(Range(n * 1000, n_tokens), "j" + std::to_string(n), "default", 2, 16, "fp-A", n);
  e.dtype = dtype;
  if (dtype == KvDtype::kKivi4) {  // K f32 until serialized (per-channel groups), V q4_0
    e.group = 8;
    const size_t vrow = KvRowBytes(KvDtype::kQ4_0, 16, 8);
    for (int l = 0; l < e.n_layers; ++l) {
      e.vq.emplace_back(n_tokens * vrow);
      for (int r = 0; r < n_tokens; ++r)
        QuantizeRow(KvDtype::kQ4_0, e.v[l].data() + r * 16, 16, 8, e.vq[l].data() + r * vrow);
    }
    e.v.clear();
    return e;
  }
  for (int l = 0; l < e.n_layers; ++l) {
    if (dtype == KvDtype::kF16) {
      e.k16.emplace_back();
      e.v16.emplace_back();
      for (size_t i = 0; i < e.k[l].size(); ++i) {
        e.k16[l].push_back(F32ToF16(e.k[l][i]));
        e.v16[l].push_back(F32ToF16(e.v[l][i]));
      }
    } else {
      e.group = 8;
      const KvDtype kt = KvTensorDtype(dtype, false), vt = KvTensorDtype(dtype, true);
      const size_t krow = KvRowBytes(kt, 16, 8), vrow = KvRowBytes(vt, 16, 8);
      e.kq.emplace_back(n_tokens * krow);
      e.vq.emplace_back(n_tokens * vrow);
      for (int r = 0; r < n_tokens; ++r) {
        QuantizeRow(kt, e.k[l].data() + r * 16, 16, 8, e.kq[l].data() + r * krow);
        QuantizeRow(vt, e.v[l].data() + r * 16, 16, 8, e.vq[l].data() + r * vrow);
      }
    }
  }
  e.k.clear();
  e.v.clear();
  return e;
}

// The identity rule on the shared tier across restarts (docs/store.md "Which type is
// stored"): an instance of another store type never serves a session's entry of the
// cluster (the session pointer names the type: it is not even found); f16 -> q8_0 ->
// q4_0 -> kivi4 -> f16 -> q8_0 -> q4_0 -> kivi4 instances on one cluster each find their
// own type's entry, with its rows.
TEST(KvStoreOnRedis, AnInstanceOfAnotherStoreTypeNeverServesTheClustersEntry) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  const KvEntry f16 = Typed(KvDtype::kF16, 3, 32), q8 = Typed(KvDtype::kQ8_0, 3, 24), q4 = Typed(KvDtype::kQ4_0, 3, 20),
                kivi = Typed(KvDtype::kKivi4, 3, 18);
  auto open = [&](KvDtype dtype) {
    return Open(prefix, 8, /*write_through=*/true, "redis://" + redis::testing::TestNodes(), PolicyKind::kLru, "", true,
                dtype);
  };
  {
    Instance a = open(KvDtype::kF16);
    ASSERT_TRUE(a.store->Save(f16).ok());
    EXPECT_EQ(a.store->Stats().write_throughs, 1u);
  }
  {
    Instance b = open(KvDtype::kQ8_0);
    EXPECT_FALSE(b.store->Lookup("default", "j3", Range(3000, 40)).has_value());
    EXPECT_EQ(b.store->Stats().shared_found, 0u);
    ASSERT_TRUE(b.store->Save(q8).ok());
  }
  {
    Instance b = open(KvDtype::kQ4_0);
    EXPECT_FALSE(b.store->Lookup("default", "j3", Range(3000, 40)).has_value());
    EXPECT_EQ(b.store->Stats().shared_found, 0u);
    ASSERT_TRUE(b.store->Save(q4).ok());
  }
  {
    Instance b = open(KvDtype::kKivi4);
    EXPECT_FALSE(b.store->Lookup("default", "j3", Range(3000, 40)).has_value());
    EXPECT_EQ(b.store->Stats().shared_found, 0u);
    ASSERT_TRUE(b.store->Save(kivi).ok());
  }
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kQ8_0, KvDtype::kQ4_0, KvDtype::kKivi4}) {
    SCOPED_TRACE(KvDtypeName(dtype));
    const KvEntry& want = dtype == KvDtype::kF16    ? f16
                          : dtype == KvDtype::kQ8_0 ? q8
                          : dtype == KvDtype::kQ4_0 ? q4
                                                    : kivi;
    Instance c = open(dtype);
    auto m = c.store->Lookup("default", "j3", Range(3000, 40));
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->tier, TierAt(1));
    EXPECT_EQ(m->key, want.key().ToString());
    EXPECT_EQ(m->n_tokens, want.n_tokens());
    auto e = c.store->Load(m->key);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->dtype, dtype);
    if (dtype == KvDtype::kKivi4) {  // its rows are its bytes: serialized again, the same
      KvEntry w = want;
      w.expires_at_ms = e->expires_at_ms;
      EXPECT_TRUE(*SerializeEntry(*e) == *SerializeEntry(w));
      continue;
    }
    EXPECT_EQ(e->k16, want.k16);
    EXPECT_EQ(e->kq, want.kq);
    EXPECT_EQ(e->vq, want.vq);
  }
  // The entries' bytes (what the cluster holds of each): the same 4096-byte header; a
  // q8_0 row of 16 values is 16 + 2 * 2 = 20 bytes, a q4_0 one 8 + 2 * 2 = 12, against
  // f16's 32.
  EXPECT_EQ(f16.SerializedBytes(), 4096u + 2 * 2 * 32 * 32);
  EXPECT_EQ(q8.SerializedBytes(), 4096u + 2 * 2 * 24 * 20);
  EXPECT_EQ(q4.SerializedBytes(), 4096u + 2 * 2 * 20 * 12);
  // kivi4: 8 bytes of K codes and a 12-byte q4_0 V row a token, one K group of 16 scales
  // and 16 minimums (f16) a layer.
  EXPECT_EQ(kivi.SerializedBytes(), 4096u + 2 * (18 * (8 + 12) + 64));
}

}  // namespace
}  // namespace attic::store
