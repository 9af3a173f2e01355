// Faults of a real cluster (the `redis_cluster` fixture) under RedisTier and the store:
// a master killed (SIGKILL) while its slots hold an entry -- calls fail within their
// budget until the replica is promoted, then the entry is read from it; the whole
// cluster stopped and started again (empty: no persistence) -- the store's reads are
// misses bounded by the timeout, saves stay local, and the cluster is used again once
// it is back. Each test leaves the cluster whole (6 nodes, cluster_state:ok).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "attic/store/kv_store.h"
#include "attic/store/redis_tier.h"
#include "store/redis/cluster_client.h"
#include "store/redis/key_slot.h"
#include "store/redis/redis_test_util.h"
#include "store/store_test_util.h"

namespace attic::store {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using redis::testing::FreshPrefix;
using testing::MakeEntry;
using testing::Range;
using testing::TierTestOptions;

RedisTierOptions Options(const std::string& prefix) {
  RedisTierOptions o;
  o.url = "redis://" + redis::testing::TestNodes();
  o.prefix = prefix;
  o.capacity = 64 << 20;
  o.command_timeout = 300ms;
  o.retry_budget = 800ms;
  return o;
}

// Whether every node of the fixture answers cluster_state:ok.
bool ClusterOk() {
  for (const std::string& node : redis::testing::TestSeeds()) {
    std::string host;
    int port = 0;
    if (!redis::ParseAddress(node, &host, &port).ok()) return false;
    auto c = redis::Connection::Open(host, port, 200ms, 500ms);
    if (!c.ok()) return false;
    auto r = (*c)->Run({"CLUSTER", "INFO"});
    if (!r.ok() || redis::ReplyText(**r).find("cluster_state:ok") == std::string_view::npos) return false;
  }
  return true;
}

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(100ms);
  }
  return cond();
}

TEST(RedisFaults, AKilledMasterFailsOverAndItsEntryIsReadFromTheReplica) {
  ATTIC_REQUIRE_REDIS();
  ASSERT_TRUE(WaitFor(ClusterOk, 20s));
  auto tier = std::move(RedisTier::Open(Options(FreshPrefix()))).value();
  KvEntry e = MakeEntry(Range(0, 64), "failover", "default", 3, 8);
  const std::string key = e.key().ToString();
  const std::string bytes = *SerializeEntry(e);
  ASSERT_TRUE(tier->Put(key, bytes).ok());
  const std::string hk = tier->HashKey(key);
  // The write is on the replica too before the master dies (replication is asynchronous).
  // (A client of its own: WAIT may take longer than the tier's reply timeout while a
  // replica of a cluster created moments ago still synchronizes.)
  redis::ClusterOptions patient;
  patient.command_timeout = 6s;
  patient.retry_budget = 8s;
  auto waiter = redis::testing::TestClient(patient);
  ASSERT_NE(waiter, nullptr);
  // A replica still in its first full synchronization (the fixture's cluster is seconds
  // old, and under a parallel ctest the machine is busy) acknowledges later: asked again,
  // up to 20 s in all.
  long long acked = 0;
  for (int attempt = 0; attempt < 4 && acked < 1; ++attempt) {
    auto waited = waiter->Run(hk, {"WAIT", "1", "5000"});
    ASSERT_TRUE(waited.ok()) << waited.status().ToString();
    acked = (*waited)->integer;
  }
  ASSERT_EQ(acked, 1);
  const std::string master = tier->client().NodeOfSlot(redis::KeySlot(hk));
  const std::string port = master.substr(master.rfind(':') + 1);
  const std::string node_dir = std::string(ATTIC_REDIS_CLUSTER_DIR) + "/" + port;
  std::ifstream pid_file(node_dir + "/redis.pid");
  pid_t pid = 0;
  ASSERT_TRUE(pid_file >> pid) << node_dir;
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  // Until the replica is promoted (cluster-node-timeout 2 s) calls fail, each within its
  // budget; then the entry is there, byte for byte.
  bool served = false;
  const auto start = Clock::now();
  while (!served && Clock::now() - start < 30s) {
    // (Each call ends within its budget by the client's deadlines, which
    // cluster_client_test asserts as statuses; not timed here.)
    auto r = tier->GetShared(key);
    if (r.ok()) {
      EXPECT_TRUE((*r)->view() == bytes);
      served = true;
    } else {
      EXPECT_EQ(ClassifyReadError(r.status()), ReadError::kTransient) << r.status().ToString();
      std::this_thread::sleep_for(200ms);  // a poll for the promotion; 30 s is a backstop
    }
  }
  EXPECT_TRUE(served) << "no failover within 30 s";
  EXPECT_NE(tier->client().NodeOfSlot(redis::KeySlot(hk)), master);
  // Writes go to the new master.
  ASSERT_TRUE(tier->Put(key, bytes).ok());
  // The old master comes back (as a replica of the new one): the cluster is whole again.
  ASSERT_EQ(std::system(("redis-server " + node_dir + "/redis.conf").c_str()), 0);
  EXPECT_TRUE(WaitFor(ClusterOk, 30s));
}

TEST(RedisFaults, AStoppedClusterIsAMissBoundedByTheTimeoutAndIsUsedAgainWhenBack) {
  ATTIC_REQUIRE_REDIS();
  ASSERT_TRUE(WaitFor(ClusterOk, 20s));
  const std::string prefix = FreshPrefix();
  VirtualClock clock;  // the clients' fail-fast window after the cluster was found down
  auto open = [&] {
    StoreOptions o = TierTestOptions();
    o.write_through = true;
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(std::make_unique<DramTier>(1 << 20));
    RedisTierOptions ro = Options(prefix);
    ro.clock = &clock;
    tiers.push_back(std::move(RedisTier::Open(ro)).value());
    return std::move(KvStore::Open(o, std::move(tiers), nullptr)).value();
  };
  auto a = open();
  auto b = open();
  ASSERT_TRUE(a->Save(MakeEntry(Range(0, 32), "before")).ok());
  auto found = b->Lookup("default", "before", Range(0, 33));  // indexed by B in the remote tier
  ASSERT_TRUE(found.has_value());
  ASSERT_EQ(redis::testing::ClusterScript("down"), 0);
  // Down: B's read of the remote entry is a transient miss (the entry stays indexed), a
  // session B never saw is a miss, A's saves stay in its DRAM (each call ends by the
  // client's deadlines; statuses, not durations, are asserted).
  auto load = b->Load(found->key);
  EXPECT_EQ(load.status().code(), StatusCode::kUnavailable) << load.status().ToString();
  EXPECT_TRUE(b->Contains(found->key));
  EXPECT_FALSE(b->Lookup("default", "during", Range(100, 33)).has_value());
  ASSERT_TRUE(a->Save(MakeEntry(Range(100, 32), "during")).ok());
  EXPECT_GE(a->Stats().write_through_errors, 1u);
  EXPECT_GE(b->Stats().read_errors, 1u);
  auto m = a->Lookup("default", "during", Range(100, 33));
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(a->Load(m->key).ok());  // served from A's DRAM
  // Back, empty (no persistence): the old entry is gone (dropped quietly); new saves are
  // shared again.
  ASSERT_EQ(redis::testing::ClusterScript("up"), 0);
  ASSERT_TRUE(WaitFor(ClusterOk, 20s));
  clock.Advance(redis::ClusterOptions{}.down_backoff.count() + 1);  // past the clients' fail-fast window
  EXPECT_EQ(b->Load(found->key).status().code(), StatusCode::kNotFound);
  EXPECT_GE(b->Stats().vanished, 1u);
  ASSERT_TRUE(a->Save(MakeEntry(Range(200, 32), "after")).ok());
  EXPECT_GE(a->Stats().write_throughs, 2u);
  auto after = b->Lookup("default", "after", Range(200, 33));
  ASSERT_TRUE(after.has_value());
  auto loaded = b->Load(after->key);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->tokens, Range(200, 32));
}

}  // namespace
}  // namespace attic::store
