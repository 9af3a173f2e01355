// RedisTier on the real cluster of the `redis_cluster` fixture: the tier contract
// (tier_contract.h), the layout (one hash per entry, one part per layer, read part by
// part), expirations from the entry header, damaged values as DataLoss, session
// pointers across instances, and a cluster that is not there.
#include "attic/store/redis_tier.h"

#include <chrono>
#include <thread>

#include "store/redis/cluster_client.h"
#include "store/redis/redis_test_util.h"
#include "store/tier_contract.h"

namespace attic::store {
namespace {

using namespace std::chrono_literals;
using redis::testing::FreshPrefix;

std::unique_ptr<RedisTier> OpenTier(uint64_t capacity, const std::string& prefix = FreshPrefix()) {
  RedisTierOptions o;
  o.url = "redis://" + redis::testing::TestNodes();
  o.capacity = capacity;
  o.prefix = prefix;
  auto t = RedisTier::Open(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

INSTANTIATE_TEST_SUITE_P(
    Redis, TierContract,
    ::testing::Values(TierCase{"redis", [](const std::string&, uint64_t cap) -> std::unique_ptr<Tier> { return OpenTier(cap); },
                               [] { return redis::testing::TestNodes().empty() ? "no Redis Cluster (run through ctest)" : ""; }}),
    [](const ::testing::TestParamInfo<TierCase>& info) { return info.param.name; });

TEST(RedisTier, IsSharedSelfEvictingAndNotEnumerable) {
  auto t = RedisTier::Open({.url = "redis://127.0.0.1:1"});
  ASSERT_TRUE(t.ok()) << t.status().ToString();  // no connection at open
  EXPECT_EQ((*t)->name(), "remote");
  EXPECT_TRUE((*t)->traits().shared);
  EXPECT_TRUE((*t)->traits().evicts_itself);
  EXPECT_FALSE((*t)->traits().enumerable);
  EXPECT_FALSE((*t)->traits().local_memory);
  EXPECT_EQ(RedisTier::Open({.url = "redis://nohost"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RedisTier::Open({.url = "redis://h:1", .prefix = "a{b}"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RedisTier::Open({.url = "redis://h:1", .capacity = 0}).status().code(), StatusCode::kInvalidArgument);
}

TEST(RedisTier, ANoClusterIsATransientErrorNotAHang) {
  RedisTierOptions o;
  o.url = "redis://127.0.0.1:1,127.0.0.1:2";
  auto t = std::move(RedisTier::Open(o)).value();
  const std::string key = MakeEntry(Range(0, 8)).key().ToString();
  // Every call returns (a hang is the ctest TIMEOUT's to fail), each with the error.
  EXPECT_EQ(t->Put(key, "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(t->Get(key).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(t->GetRange(key, 0, 1).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(ClassifyReadError(t->GetShared(key).status()), ReadError::kTransient);
  EXPECT_FALSE(t->Contains(key));
  EXPECT_EQ(t->SizeOf(key), -1);
  EXPECT_GE(t->stats().errors, 3u);
}

// One hash per entry: the manifest and the header, one part per layer, the tail.
TEST(RedisTier, AnEntryIsAHashOfLayersAndALayerReadFetchesOnlyThatLayer) {
  ATTIC_REQUIRE_REDIS();
  auto tier = OpenTier(64 << 20);
  ASSERT_NE(tier, nullptr);
  KvEntry e = MakeEntry(Range(0, 300), "s1", "default", 4, 16, "fp-A", 3);
  e.attachments.push_back({"pq-index", std::make_shared<const std::string>("codes and codebooks")});
  const std::string key = e.key().ToString();
  const std::string bytes = *SerializeEntry(e);
  ASSERT_TRUE(tier->Put(key, bytes).ok());
  const std::string hk = tier->HashKey(key);
  auto hlen = tier->client().Run(hk, {"HLEN", hk});
  ASSERT_TRUE(hlen.ok());
  EXPECT_EQ((*hlen)->integer, 1 + 1 + 4 + 1);  // manifest, header, 4 layers, attachments
  EXPECT_EQ(tier->SizeOf(key), static_cast<int64_t>(bytes.size()));
  EXPECT_TRUE(tier->Contains(key));
  auto h = ReadEntryHeader(*tier, key, "fp-A");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const uint64_t before = tier->stats().bytes_read;
  auto layer = ReadEntryLayer(*tier, key, *h, 2);
  ASSERT_TRUE(layer.ok()) << layer.status().ToString();
  EXPECT_EQ(tier->stats().bytes_read - before, h->layer_bytes);  // that layer, nothing else
  EXPECT_TRUE(std::equal(layer->k, layer->k + e.k[2].size(), e.k[2].begin()));
  auto whole = tier->GetShared(key);
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE((*whole)->view() == bytes);
  auto back = DeserializeEntry((*whole)->view(), "fp-A");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_NE(back->attachment("pq-index"), nullptr);
  EXPECT_EQ(*back->attachment("pq-index")->bytes, "codes and codebooks");
}

// A manifest is the cluster's word: one that claims more bytes than the tier ever
// writes (its capacity) is not allocated for, it is a corrupt value (another instance,
// an operator or an attacker with access to the cluster may have written it).
TEST(RedisTier, AManifestBeyondTheCapacityIsCorruptNotAnAllocation) {
  ATTIC_REQUIRE_REDIS();
  auto tier = OpenTier(1 << 20);
  ASSERT_NE(tier, nullptr);
  const std::string key = MakeEntry(Range(0, 8)).key().ToString();
  const std::string hk = tier->HashKey(key);
  auto set = tier->client().Run(hk, {"HSET", hk, "m", "ATTICR1 1000000000000", "0", "x"});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  auto got = tier->GetShared(key);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss) << got.status().ToString();
  EXPECT_EQ(tier->stats().errors, 1u);
  (void)tier->client().Run(hk, {"DEL", hk});
}

// ReadInto receives the parts a range covers wholly straight into the caller's buffer
// (Attic's own reply reader) and copies the edge parts: any range reads the value's
// bytes; the reply reader's errors are the tier's usual ones.
TEST(RedisTier, ReadIntoReadsAnyRangeOfTheValueInPlace) {
  ATTIC_REQUIRE_REDIS();
  auto tier = OpenTier(64 << 20);
  ASSERT_NE(tier, nullptr);
  KvEntry e = MakeEntry(Range(0, 300), "into", "default", 4, 16, "fp-A", 5);
  e.attachments.push_back({"pq-index", std::make_shared<const std::string>("codes and codebooks")});
  const std::string key = e.key().ToString();
  const std::string bytes = *SerializeEntry(e);
  ASSERT_TRUE(tier->Put(key, bytes).ok());
  auto h = ReadEntryHeader(*tier, key, "fp-A");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const uint64_t n = bytes.size(), l1 = EntryLayerOffset(*h, 1), l2 = EntryLayerOffset(*h, 2);
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, n}, {l2, h->layer_bytes}, {l1 + 5, h->layer_bytes}, {l1 - 7, 2 * h->layer_bytes + 9}, {n - 3, 3},
      {0, 10}, {n, 0}};
  for (const auto& [offset, length] : ranges) {
    std::string out(length, '\x55');
    Status st = tier->ReadInto(key, offset, length, out.data());
    ASSERT_TRUE(st.ok()) << offset << "+" << length << ": " << st.ToString();
    EXPECT_TRUE(out == bytes.substr(offset, length)) << offset << "+" << length;
  }
  std::string four(4, '\0');
  EXPECT_EQ(tier->ReadInto(key, n - 3, 4, four.data()).code(), StatusCode::kOutOfRange);
  // Layer 2 (part 3) cut short: DataLoss; the hash gone: NotFound; a string where the
  // hash was (an error reply to HMGET): transient.
  const std::string hk = tier->HashKey(key);
  auto& c = tier->client();
  ASSERT_TRUE(c.Run(hk, {"HSET", hk, "3", "short"}).ok());
  std::string layer(h->layer_bytes, '\0');
  EXPECT_EQ(tier->ReadInto(key, l2, h->layer_bytes, layer.data()).code(), StatusCode::kDataLoss);
  EXPECT_TRUE(tier->ReadInto(key, l1, h->layer_bytes, layer.data()).ok());
  ASSERT_TRUE(c.Run(hk, {"DEL", hk}).ok());
  EXPECT_EQ(tier->ReadInto(key, l1, h->layer_bytes, layer.data()).code(), StatusCode::kNotFound);
  ASSERT_TRUE(c.Run(hk, {"SET", hk, "a string"}).ok());
  EXPECT_EQ(ClassifyReadError(tier->ReadInto(key, 0, 10, layer.data())), ReadError::kTransient);
  // The connection the error came back on is still in step: the next call works.
  ASSERT_TRUE(c.Run(hk, {"DEL", hk}).ok());
  ASSERT_TRUE(tier->Put(key, bytes).ok());
  std::string again(n, '\0');
  ASSERT_TRUE(tier->ReadInto(key, 0, n, again.data()).ok());
  EXPECT_TRUE(again == bytes);
}

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TEST(RedisTier, TheEntrysExpiryIsTheKeysExpiration) {
  ATTIC_REQUIRE_REDIS();
  auto tier = OpenTier(64 << 20);
  ASSERT_NE(tier, nullptr);
  KvEntry e = MakeEntry(Range(0, 16), "ttl");
  e.expires_at_ms = SystemNowMs() + 1000;
  const std::string key = e.key().ToString();
  ASSERT_TRUE(tier->Put(key, *SerializeEntry(e)).ok());
  const std::string hk = tier->HashKey(key), pk = tier->SessionPointerKey(e.key());
  for (const std::string& k : {hk, pk}) {
    auto ttl = tier->client().Run(k, {"PTTL", k});
    ASSERT_TRUE(ttl.ok());
    // -2 (gone) only once the entry's time has passed (a machine stalled for a second).
    if ((*ttl)->integer == -2) EXPECT_GE(SystemNowMs(), e.expires_at_ms) << k;
    else EXPECT_GT((*ttl)->integer, 0) << k;
    EXPECT_LE((*ttl)->integer, 1000) << k;
  }
  KvEntry forever = MakeEntry(Range(0, 16), "forever");
  ASSERT_TRUE(tier->Put(forever.key().ToString(), *SerializeEntry(forever)).ok());
  const std::string fk = tier->HashKey(forever.key().ToString());
  EXPECT_EQ((*tier->client().Run(fk, {"PTTL", fk}))->integer, -1);  // no expiry
  // Redis drops both keys at their expiry: polled until it has (each EXISTS expires a due
  // key), not slept past it. The try count is a backstop, not a bound on when.
  bool gone = false;
  for (int i = 0; i < 6000 && !gone; ++i) {
    gone = (*tier->client().Run(hk, {"EXISTS", hk}))->integer == 0 &&
           (*tier->client().Run(pk, {"EXISTS", pk}))->integer == 0;
    if (!gone) std::this_thread::sleep_for(10ms);  // a poll, not a deadline
  }
  ASSERT_TRUE(gone);
  EXPECT_GE(SystemNowMs(), e.expires_at_ms);  // not before the entry's time
  EXPECT_EQ(tier->Get(key).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->FindSession(e.key()).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(tier->Get(forever.key().ToString()).ok());
}

TEST(RedisTier, DamagedValuesAreDataLoss) {
  ATTIC_REQUIRE_REDIS();
  auto tier = OpenTier(64 << 20);
  ASSERT_NE(tier, nullptr);
  KvEntry e = MakeEntry(Range(0, 64), "dmg", "default", 3, 8);
  const std::string key = e.key().ToString();
  const std::string bytes = *SerializeEntry(e);
  const std::string hk = tier->HashKey(key);
  auto& c = tier->client();
  ASSERT_TRUE(tier->Put(key, bytes).ok());
  auto h = ReadEntryHeader(*tier, key, "fp-A");
  ASSERT_TRUE(h.ok());
  // A flipped bit in layer 1 (part 2): the layer's checksum catches it.
  std::string layer1 = bytes.substr(EntryLayerOffset(*h, 1), h->layer_bytes);
  layer1[7] ^= 0x10;
  ASSERT_TRUE(c.Run(hk, {"HSET", hk, "2", layer1}).ok());
  EXPECT_EQ(ReadEntryLayer(*tier, key, *h, 1).status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(ReadEntryLayer(*tier, key, *h, 0).ok());
  EXPECT_EQ(VerifyEntry((*tier->GetShared(key))->view(), "fp-A").status().code(), StatusCode::kDataLoss);
  // A part cut short, a part missing, a manifest that is not one.
  ASSERT_TRUE(c.Run(hk, {"HSET", hk, "2", layer1.substr(0, 100)}).ok());
  EXPECT_EQ(tier->GetShared(key).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ReadEntryLayer(*tier, key, *h, 1).status().code(), StatusCode::kDataLoss);
  ASSERT_TRUE(c.Run(hk, {"HDEL", hk, "2"}).ok());
  EXPECT_EQ(tier->GetShared(key).status().code(), StatusCode::kDataLoss);
  ASSERT_TRUE(c.Run(hk, {"HSET", hk, "m", "ATTICR1 lots"}).ok());
  EXPECT_EQ(tier->GetShared(key).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(tier->GetRange(key, 0, 10).status().code(), StatusCode::kDataLoss);
  // Not a hash at all.
  ASSERT_TRUE(c.Run(hk, {"DEL", hk}).ok());
  ASSERT_TRUE(c.Run(hk, {"SET", hk, "a string"}).ok());
  EXPECT_EQ(ClassifyReadError(tier->GetShared(key).status()), ReadError::kTransient);  // WRONGTYPE: not ours
  ASSERT_TRUE(tier->Erase(key).ok());
  EXPECT_EQ(tier->Get(key).status().code(), StatusCode::kNotFound);
}

TEST(RedisTier, AnotherInstanceFindsTheSessionsNewestEntry) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  auto a = OpenTier(64 << 20, prefix);
  auto b = OpenTier(64 << 20, prefix);  // a second instance on the same cluster
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  KvEntry turn1 = MakeEntry(Range(0, 16), "conv", "tenant-x");
  KvEntry turn2 = MakeEntry(Range(0, 40), "conv", "tenant-x");
  ASSERT_TRUE(a->Put(turn1.key().ToString(), *SerializeEntry(turn1)).ok());
  ASSERT_TRUE(a->Put(turn2.key().ToString(), *SerializeEntry(turn2)).ok());
  auto found = b->FindSession(turn1.key());  // any token hash: the session's newest
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, turn2.key().ToString());
  auto bytes = b->GetShared(*found);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(DeserializeEntry((*bytes)->view(), "fp-A")->tokens, turn2.tokens);
  // Tenancy and identity: another tenant, model or session finds nothing.
  KvEntry other_tenant = turn2;
  other_tenant.tenant = "tenant-y";
  EXPECT_EQ(b->FindSession(other_tenant.key()).status().code(), StatusCode::kNotFound);
  KvEntry other_model = turn2;
  other_model.fingerprint = "fp-B";
  EXPECT_EQ(b->FindSession(other_model.key()).status().code(), StatusCode::kNotFound);
  // A pointer that names some other session's entry is never followed.
  const std::string pk = b->SessionPointerKey(turn2.key());
  ASSERT_TRUE(b->client().Run(pk, {"SET", pk, other_tenant.key().ToString()}).ok());
  EXPECT_EQ(b->FindSession(turn2.key()).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace attic::store
