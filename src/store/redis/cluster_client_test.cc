// The Redis Cluster client against a real cluster (the `redis_cluster` ctest fixture):
// key slots checked against the server's own CLUSTER KEYSLOT, routing to all three
// masters, -MOVED and -ASK redirects during a real slot migration, a node that stops
// answering (CLIENT PAUSE) and a cluster that is not there: bounded failures, never a hang.
#include "store/redis/cluster_client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <set>

#include "attic/store/entry.h"
#include "store/redis/key_slot.h"
#include "store/redis/redis_test_util.h"

namespace attic::store::redis {
namespace {

using namespace std::chrono_literals;
using testing::AtNode;
using testing::TestClient;

TEST(KeySlot, Crc16IsXmodem) {
  EXPECT_EQ(Crc16("123456789"), 0x31C3);  // the CRC's published check value
  EXPECT_EQ(Crc16(""), 0);
}

TEST(KeySlot, HashTagsFollowTheSpecification) {
  EXPECT_EQ(HashedPart("{user1000}.following"), "user1000");
  EXPECT_EQ(HashedPart("foo{}{bar}"), "foo{}{bar}");  // an empty first tag: the whole key
  EXPECT_EQ(HashedPart("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(HashedPart("foo{bar}{zap}"), "bar");
  EXPECT_EQ(HashedPart("no tag"), "no tag");
  EXPECT_EQ(HashedPart("{open"), "{open");
  EXPECT_EQ(KeySlot("{a}x"), KeySlot("{a}y"));
}

TEST(KeySlot, MatchesTheServersClusterKeyslot) {
  ATTIC_REQUIRE_REDIS();
  auto client = TestClient();
  ASSERT_NE(client, nullptr);
  std::vector<std::string> keys = {"", "a", "foo", "123456789", "{user1000}.following", "foo{}{bar}",
                                   "foo{{bar}}zap", "foo{bar}{zap}", "{", "}", "{}", "a{b}c"};
  EntryKey k;
  k.fingerprint = "fp";
  k.session_id = "s";
  keys.push_back("attic:kv:{" + k.ToString() + "}");
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {  // random binary keys, braces and NULs included
    std::string key(rng() % 24, '\0');
    for (char& c : key) c = "ab{}\0\xff"[rng() % 6];
    keys.push_back(key);
  }
  for (const std::string& key : keys) {
    auto r = client->RunAnywhere({"CLUSTER", "KEYSLOT", key});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ((*r)->type, REDIS_REPLY_INTEGER) << ReplyText(**r);
    EXPECT_EQ(KeySlot(key), (*r)->integer) << "key of " << key.size() << " bytes";
  }
}

TEST(ClusterClient, RoutesToEveryMasterAndKeepsBinaryValues) {
  ATTIC_REQUIRE_REDIS();
  auto client = TestClient();
  ASSERT_NE(client, nullptr);
  std::set<std::string> nodes;
  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
  for (int i = 0; i < 64; ++i) {
    const std::string key = "attic-test:route:" + std::to_string(i);
    nodes.insert(client->NodeOfSlot(KeySlot(key)));
    const std::string value = i == 0 ? big : std::string("v\0") + std::to_string(i);
    auto set = client->Run(key, {"SET", key, value, "PX", "60000"});
    ASSERT_TRUE(set.ok()) << set.status().ToString();
    EXPECT_EQ(ReplyText(**set), "OK");
    auto get = client->Run(key, {"GET", key});
    ASSERT_TRUE(get.ok()) << get.status().ToString();
    EXPECT_EQ(ReplyText(**get), value);
  }
  EXPECT_EQ(nodes.size(), 3u);  // 3 masters, each serving a third of the slots
  EXPECT_EQ(client->stats().moved, 0u);
  // A pipeline of one slot's keys (one hash tag) is answered in order.
  auto replies = client->Pipeline("{t}", {{"SET", "{t}a", "1"}, {"SET", "{t}b", "2"}, {"MGET", "{t}a", "{t}b"}});
  ASSERT_TRUE(replies.ok()) << replies.status().ToString();
  ASSERT_EQ((*replies)[2]->elements, 2u);
  EXPECT_EQ(ReplyText(*(*replies)[2]->element[1]), "2");
  // An error reply is a reply, not a failed call.
  auto wrong = client->Run("{t}a", {"LPUSH", "{t}a", "x"});
  ASSERT_TRUE(wrong.ok());
  EXPECT_TRUE(IsErrorReply(**wrong, "WRONGTYPE"));
  EXPECT_EQ(ReplyStatus(**wrong).code(), StatusCode::kInternal);
}

std::string MyId(const std::string& node) { return std::string(ReplyText(*AtNode(node, {"CLUSTER", "MYID"}))); }

// Moves the (empty) slot `slot` from `src` to `dst`: importing/migrating, then owned by dst.
void SetSlot(const std::string& node, int slot, const char* state, const std::string& id) {
  auto r = AtNode(node, {"CLUSTER", "SETSLOT", std::to_string(slot), state, id});
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(ReplyText(*r), "OK") << node << " SETSLOT " << state;
}

TEST(ClusterClient, FollowsAskDuringAMigrationAndMovedAfterIt) {
  ATTIC_REQUIRE_REDIS();
  auto client = TestClient();
  ASSERT_NE(client, nullptr);
  const std::string key = "attic-test:migrating";
  const int slot = KeySlot(key);
  const std::string src = client->NodeOfSlot(slot);
  std::string dst;
  for (int i = 0; i < 16; ++i)
    if (std::string n = client->NodeOfSlot(i * 1024); n != src) dst = n;
  ASSERT_FALSE(src.empty());
  ASSERT_FALSE(dst.empty());
  AtNode(src, {"DEL", key});
  const std::string src_id = MyId(src), dst_id = MyId(dst);
  SetSlot(dst, slot, "IMPORTING", src_id);
  SetSlot(src, slot, "MIGRATING", dst_id);
  // The key is not on the source: -ASK to the destination, where the write lands.
  auto set = client->Run(key, {"SET", key, "asked"});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(ReplyText(**set), "OK");
  EXPECT_GE(client->stats().asked, 1u);
  // The migration ends: the destination owns the slot; the client's map is stale.
  SetSlot(dst, slot, "NODE", dst_id);
  SetSlot(src, slot, "NODE", dst_id);
  auto get = client->Run(key, {"GET", key});
  ASSERT_TRUE(get.ok()) << get.status().ToString();
  EXPECT_EQ(ReplyText(**get), "asked");
  EXPECT_GE(client->stats().moved, 1u);
  EXPECT_EQ(client->NodeOfSlot(slot), dst);
  // Give the slot back (the key with it) so the cluster is as the fixture made it.
  AtNode(dst, {"DEL", key});
  SetSlot(src, slot, "IMPORTING", dst_id);
  SetSlot(dst, slot, "MIGRATING", src_id);
  SetSlot(src, slot, "NODE", src_id);
  SetSlot(dst, slot, "NODE", src_id);
  auto again = client->Run(key, {"GET", key});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->type, REDIS_REPLY_NIL);
}

TEST(ClusterClient, APausedNodeIsADeadlineNotAHang) {
  ATTIC_REQUIRE_REDIS();
  ClusterOptions o;
  o.command_timeout = 50ms;
  o.retry_budget = 100ms;
  auto client = TestClient(o);
  ASSERT_NE(client, nullptr);
  const std::string key = "attic-test:paused";
  ASSERT_TRUE(client->Run(key, {"SET", key, "x"}).ok());
  const std::string node = client->NodeOfSlot(KeySlot(key));
  // The node holds every client's commands from the moment CLIENT PAUSE answers (no race
  // with the call below) for 10 s, a hundred times the call's budget: the budget is the
  // feature under test, and a reply within the pause can only be the client giving up.
  // (A cluster node's pause cannot be lifted early: CLIENT UNPAUSE is held too.)
  ASSERT_EQ(ReplyText(*AtNode(node, {"CLIENT", "PAUSE", "10000", "ALL"})), "OK");
  auto r = client->Run(key, {"GET", key});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  // Once the pause is over the node serves again (polled: no deadline of the test's own).
  auto after = client->Run(key, {"GET", key});
  while (!after.ok() && (after.status().code() == StatusCode::kDeadlineExceeded ||
                         after.status().code() == StatusCode::kUnavailable))
    after = client->Run(key, {"GET", key});
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(ReplyText(**after), "x");
}

// The back-off runs on a virtual clock: "at once" and "after it" are counted connects.
TEST(ClusterClient, NoClusterIsUnavailableThenFailsAtOnceUntilTheBackoffEnds) {
  store::VirtualClock clock;
  ClusterOptions o;
  o.seeds = {"127.0.0.1:1", "127.0.0.1:2"};  // nothing listens there
  o.down_backoff = 300ms;
  o.clock = &clock;
  auto client = ClusterClient::Create(o);
  ASSERT_TRUE(client.ok());
  // Refused connects: the call returns (a hang is ctest's TIMEOUT) with Unavailable.
  auto r = (*client)->Run("k", {"GET", "k"});
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  const uint64_t connects = (*client)->stats().connects;
  EXPECT_GT(connects, 0u);
  EXPECT_EQ((*client)->Run("k", {"GET", "k"}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ((*client)->stats().connects, connects);  // within down_backoff: no attempt
  clock.Advance(299);
  EXPECT_EQ((*client)->Run("k", {"GET", "k"}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ((*client)->stats().connects, connects);  // still within it
  clock.Advance(1);
  EXPECT_EQ((*client)->Run("k", {"GET", "k"}).status().code(), StatusCode::kUnavailable);
  EXPECT_GT((*client)->stats().connects, connects);  // tried again after it
}

TEST(ClusterClient, BadSeedsAndUrlsAreClearErrors) {
  EXPECT_EQ(ClusterClient::Create({}).status().code(), StatusCode::kInvalidArgument);
  ClusterOptions o;
  o.seeds = {"localhost"};
  EXPECT_EQ(ClusterClient::Create(o).status().code(), StatusCode::kInvalidArgument);
  auto ok = ParseRedisUrl("redis://127.0.0.1:7000,localhost:7001,[::1]:7002");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->size(), 3u);
  EXPECT_EQ(ParseRedisUrl("10.0.0.1:6379")->at(0), "10.0.0.1:6379");
  for (const char* bad : {"", "redis://", "rediss://h:1", "redis://h", "redis://h:0", "redis://h:99999",
                          "redis://h:1,", "redis://u:p@h:1", "redis://h:1/0", "http://h:1", "h:1x"}) {
    auto r = ParseRedisUrl(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace attic::store::redis
