// SharedContextCacheRegistry against the real Redis Cluster of ctest's `redis_cluster`
// fixture: two registries on one cluster stand for two Attic instances. What one creates,
// patches or deletes, the other sees; tenants and models stay apart; expiry is Redis's;
// chunks are released once, when no cache of the tenant names them any more.
#include "attic/pic/shared_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "store/redis/redis_test_util.h"

namespace attic::pic {
namespace {

using namespace std::chrono_literals;
using store::redis::testing::FreshPrefix;
using store::redis::testing::TestClient;
using store::redis::testing::TestNodes;

const std::string kModel = "stories260K";
const std::string kScope = "fp-stories260K";

int64_t NowMs() { return store::SystemClock().NowMs(); }

std::unique_ptr<SharedContextCacheRegistry> OpenShared(const std::string& prefix, const std::string& scope = kScope,
                                                       RegistryOptions limits = {},
                                                       const store::Clock* clock = nullptr) {
  SharedRegistryOptions o;
  o.url = "redis://" + TestNodes();
  o.prefix = prefix;
  o.scope = scope;
  o.limits = limits;
  auto r = SharedContextCacheRegistry::Open(o, clock);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

ContextCache NewCache(const std::string& tenant, std::vector<std::vector<int32_t>> chunks, int64_t expires_at_ms) {
  ContextCache c;
  c.tenant = tenant;
  c.model = kModel;
  c.display_name = "docs of " + tenant;
  c.expires_at_ms = expires_at_ms;
  for (auto& t : chunks) c.chunks.push_back(CachedChunk{"", std::move(t), ""});
  return c;
}

ChunkKey Key(const std::string& tenant, const std::vector<int32_t>& tokens) {
  return ChunkKey{tenant, kModel, ChunkStoreSession(tokens, true)};
}

std::vector<std::string> Ids(const StatusOr<CachePage>& page) {
  EXPECT_TRUE(page.ok()) << page.status().ToString();
  std::vector<std::string> ids;
  if (page.ok())
    for (const ContextCache& c : page->data) ids.push_back(c.id);
  return ids;
}

#define EXPECT_NOT_FOUND(expr) EXPECT_EQ((expr).code(), StatusCode::kNotFound)

TEST(SharedContextCacheRegistry, WhatOneInstanceCreatesEveryInstanceReadsPatchesAndDeletes) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  auto a = OpenShared(prefix), b = OpenShared(prefix);
  ASSERT_TRUE(a && b);
  const std::vector<int32_t> doc1{5, 6, 7}, doc2{8, 9};
  const int64_t expires = NowMs() + 600'000;
  auto created = a->Create(NewCache("alice", {doc1, doc2}, expires));
  ASSERT_TRUE(created.ok()) << created.status().ToString();

  auto seen = b->Get("alice", created->id);
  ASSERT_TRUE(seen.ok()) << seen.status().ToString();
  EXPECT_EQ(seen->id, created->id);
  EXPECT_EQ(seen->display_name, "docs of alice");
  EXPECT_EQ(seen->model, kModel);
  EXPECT_EQ(seen->expires_at_ms, expires);
  EXPECT_EQ(seen->created_at_ms, created->created_at_ms);
  ASSERT_EQ(seen->chunks.size(), 2u);
  EXPECT_EQ(seen->chunks[0].tokens, doc1);
  EXPECT_EQ(seen->chunks[1].tokens, doc2);
  EXPECT_EQ(seen->chunks[1].id, created->id + "-c1");
  EXPECT_EQ(seen->chunks[1].store_session, ChunkStoreSession(doc2, true));
  auto one = b->Resolve("alice", created->id + "-c1");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].tokens, doc2);
  EXPECT_NOT_FOUND(b->Resolve("alice", created->id + "-c2").status());
  EXPECT_EQ(Ids(b->List("alice", "", 10)), std::vector<std::string>{created->id});

  // A patch on B is what A reads; Redis's expiry of the record moves with it.
  const int64_t later = NowMs() + 1'200'000;
  auto patched = b->SetExpiry("alice", created->id, later);
  ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  EXPECT_EQ(patched->expires_at_ms, later);
  EXPECT_EQ(a->Get("alice", created->id)->expires_at_ms, later);
  auto client = TestClient();
  ASSERT_TRUE(client);
  const std::string rec = a->RecordKey("alice", created->id);
  auto pexpiretime = client->Run(rec, {"PEXPIRETIME", rec});
  ASSERT_TRUE(pexpiretime.ok());
  EXPECT_EQ((*pexpiretime)->integer, later);
  EXPECT_EQ(b->SetExpiry("alice", created->id, NowMs() - 1).status().code(), StatusCode::kInvalidArgument);

  // Deleted on A: gone on B, and a second delete anywhere is NotFound.
  ASSERT_TRUE(a->Delete("alice", created->id).ok());
  EXPECT_NOT_FOUND(b->Get("alice", created->id).status());
  EXPECT_NOT_FOUND(b->Resolve("alice", created->id).status());
  EXPECT_NOT_FOUND(b->SetExpiry("alice", created->id, later).status());
  EXPECT_NOT_FOUND(b->Delete("alice", created->id));
  EXPECT_TRUE(Ids(b->List("alice", "", 10)).empty());
  auto exists = client->Run(rec, {"EXISTS", rec});
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ((*exists)->integer, 0);
  // The deleting instance erases the chunks' KV; the other has nothing to erase.
  EXPECT_EQ(a->ExpireNow(), (std::vector<ChunkKey>{std::min(Key("alice", doc1), Key("alice", doc2)),
                                                   std::max(Key("alice", doc1), Key("alice", doc2))}));
  EXPECT_TRUE(b->ExpireNow().empty());
}

TEST(SharedContextCacheRegistry, TenantsAndModelsStayApartOnEveryInstance) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  auto a = OpenShared(prefix), b = OpenShared(prefix), other_model = OpenShared(prefix, "fp-another-model");
  ASSERT_TRUE(a && b && other_model);
  auto c = a->Create(NewCache("alice", {{1, 2, 3}}, NowMs() + 600'000));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (ContextCacheRegistry* r : {a.get(), b.get()}) {
    EXPECT_NOT_FOUND(r->Get("bob", c->id).status());
    EXPECT_NOT_FOUND(r->Resolve("bob", c->id + "-c0").status());
    EXPECT_NOT_FOUND(r->SetExpiry("bob", c->id, NowMs() + 1000).status());
    EXPECT_NOT_FOUND(r->Delete("bob", c->id));
    EXPECT_TRUE(Ids(r->List("bob", "", 10)).empty());
  }
  EXPECT_NOT_FOUND(other_model->Get("alice", c->id).status());
  EXPECT_TRUE(Ids(other_model->List("alice", "", 10)).empty());
  // Bob's failed delete left Alice's cache alone.
  EXPECT_TRUE(b->Get("alice", c->id).ok());
  // Malformed ids never reach a key.
  EXPECT_NOT_FOUND(b->Get("alice", "ctx-*").status());
  EXPECT_NOT_FOUND(b->Get("alice", c->id + "}").status());
}

TEST(SharedContextCacheRegistry, ListsEveryInstancesCachesInCreationOrderPageByPage) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  // The two instances' clocks agree and tick between creations: distinct creation stamps
  // across the instances, whatever the machine's speed.
  store::VirtualClock clock(NowMs());
  auto a = OpenShared(prefix, kScope, {}, &clock), b = OpenShared(prefix, kScope, {}, &clock);
  ASSERT_TRUE(a && b);
  std::vector<std::string> created;
  for (int i = 0; i < 7; ++i) {
    SharedContextCacheRegistry& r = i % 2 == 0 ? *a : *b;
    auto c = r.Create(NewCache("alice", {{100 + i}}, NowMs() + 600'000));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    created.push_back(c->id);
    clock.Advance(1);
  }
  auto p1 = a->List("alice", "", 3);
  ASSERT_TRUE(p1.ok());
  EXPECT_EQ(Ids(p1), (std::vector<std::string>(created.begin(), created.begin() + 3)));
  EXPECT_TRUE(p1->has_more);
  auto p2 = b->List("alice", created[2], 3);
  EXPECT_EQ(Ids(p2), (std::vector<std::string>(created.begin() + 3, created.begin() + 6)));
  EXPECT_TRUE(p2->has_more);
  auto p3 = a->List("alice", created[5], 3);
  EXPECT_EQ(Ids(p3), (std::vector<std::string>{created[6]}));
  EXPECT_FALSE(p3->has_more);
  EXPECT_FALSE(a->List("alice", created[5], 1)->has_more);
  // A deleted cursor is still a position; deleted caches are skipped.
  ASSERT_TRUE(b->Delete("alice", created[3]).ok());
  ASSERT_TRUE(a->Delete("alice", created[4]).ok());
  EXPECT_EQ(Ids(a->List("alice", created[3], 2)), (std::vector<std::string>{created[5], created[6]}));
  EXPECT_EQ(Ids(b->List("alice", created[2], 1)), (std::vector<std::string>{created[5]}));
  EXPECT_EQ(b->List("alice", "", 0)->data.size(), 1u);  // a limit below 1 counts as 1
}

TEST(SharedContextCacheRegistry, ExpiresOnEveryInstanceAtItsTimeAndReleasesItsChunksOnce) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  auto a = OpenShared(prefix), b = OpenShared(prefix);
  ASSERT_TRUE(a && b);
  const std::vector<int32_t> shared{1, 1, 2}, own{3, 5};
  auto keep = b->Create(NewCache("alice", {shared}, NowMs() + 600'000));
  auto brief = a->Create(NewCache("alice", {shared, own}, NowMs() + 600'000));
  ASSERT_TRUE(keep.ok() && brief.ok());
  EXPECT_TRUE(b->Get("alice", brief->id).ok());
  // B moves A's cache to expire in 1 s (B finds it live to do so).
  const int64_t expires_at_ms = NowMs() + 1000;
  ASSERT_TRUE(b->SetExpiry("alice", brief->id, expires_at_ms).ok());
  auto client = TestClient();
  const std::string rec = a->RecordKey("alice", brief->id);
  // Redis drops the record itself (no instance sweeps): polled until it has (EXISTS expires
  // a due key), not slept past it; the try count is a backstop, not a bound on when.
  bool gone = false;
  for (int i = 0; i < 6000 && !gone; ++i) {
    auto exists = client->Run(rec, {"EXISTS", rec});
    ASSERT_TRUE(exists.ok());
    gone = (*exists)->integer == 0;
    if (!gone) std::this_thread::sleep_for(10ms);  // a poll, not a deadline
  }
  ASSERT_TRUE(gone);
  EXPECT_GE(NowMs(), expires_at_ms);  // not before its time
  EXPECT_NOT_FOUND(a->Get("alice", brief->id).status());
  EXPECT_NOT_FOUND(b->Get("alice", brief->id).status());
  EXPECT_NOT_FOUND(b->SetExpiry("alice", brief->id, NowMs() + 600'000).status());
  EXPECT_EQ(Ids(a->List("alice", "", 10)), std::vector<std::string>{keep->id});
  // Whichever instance sweeps first gets the chunk only the expired cache named; the chunk
  // the live cache still names is never released.
  EXPECT_EQ(b->ExpireNow(), std::vector<ChunkKey>{Key("alice", own)});
  EXPECT_TRUE(a->ExpireNow().empty());
  ASSERT_TRUE(a->Delete("alice", keep->id).ok());
  EXPECT_EQ(a->ExpireNow(), std::vector<ChunkKey>{Key("alice", shared)});
}

TEST(SharedContextCacheRegistry, TheTenantLimitCountsEveryInstancesLiveCaches) {
  ATTIC_REQUIRE_REDIS();
  const std::string prefix = FreshPrefix();
  RegistryOptions limits;
  limits.max_caches_per_tenant = 2;
  auto a = OpenShared(prefix, kScope, limits), b = OpenShared(prefix, kScope, limits);
  ASSERT_TRUE(a && b);
  auto first = a->Create(NewCache("alice", {{1}}, NowMs() + 600'000));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(b->Create(NewCache("alice", {{2}}, NowMs() + 600'000)).ok());
  EXPECT_EQ(a->Create(NewCache("alice", {{3}}, NowMs() + 600'000)).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(b->Create(NewCache("bob", {{3}}, NowMs() + 600'000)).ok());  // per tenant
  ASSERT_TRUE(b->Delete("alice", first->id).ok());
  EXPECT_TRUE(a->Create(NewCache("alice", {{3}}, NowMs() + 600'000)).ok());
  EXPECT_EQ(a->Create(NewCache("alice", {}, NowMs() + 600'000)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Create(NewCache("alice", {{4}}, NowMs() - 1)).status().code(), StatusCode::kInvalidArgument);
}

TEST(SharedContextCacheRegistry, AClusterThatDoesNotAnswerIsAnErrorNeverNotFound) {
  SharedRegistryOptions o;
  o.url = "redis://127.0.0.1:1";  // nothing listens on port 1
  o.scope = kScope;
  o.retry_budget = 200ms;
  auto r = SharedContextCacheRegistry::Open(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();  // connects lazily
  const std::string id = "ctx-0123456789abcdef01234567";
  for (Status st : {(*r)->Get("alice", id).status(), (*r)->List("alice", "", 5).status(),
                    (*r)->Create(NewCache("alice", {{1}}, NowMs() + 1000)).status(), (*r)->Delete("alice", id)}) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.code(), StatusCode::kNotFound) << st.ToString();
  }
  EXPECT_TRUE((*r)->ExpireNow().empty());
  o.scope = "";
  EXPECT_EQ(SharedContextCacheRegistry::Open(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attic::pic
