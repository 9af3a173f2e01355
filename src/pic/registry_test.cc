#include "attic/pic/registry.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "test_util.h"

namespace attic::pic {
namespace {

namespace fs = std::filesystem;
using store::VirtualClock;

constexpr int64_t kT0 = 1'700'000'000'000;  // the tests' "now" at the start (unix ms)
const std::string kModel = "stories260K";

ContextCache NewCache(const std::string& tenant, std::vector<std::vector<int32_t>> chunks, int64_t expires_at_ms,
                      const std::string& model = kModel) {
  ContextCache c;
  c.tenant = tenant;
  c.model = model;
  c.display_name = "docs of " + tenant;
  c.expires_at_ms = expires_at_ms;
  for (auto& t : chunks) c.chunks.push_back(CachedChunk{"", std::move(t), ""});
  return c;
}

std::unique_ptr<LocalContextCacheRegistry> OpenOrDie(const std::string& dir, const VirtualClock* clock,
                                                RegistryOptions options = {}) {
  auto r = ContextCacheRegistry::Open(dir, clock, options);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

ChunkKey Key(const std::string& tenant, const std::vector<int32_t>& tokens, bool bos = true,
             const std::string& model = kModel) {
  return ChunkKey{tenant, model, ChunkStoreSession(tokens, bos)};
}

std::vector<ChunkKey> Sorted(std::vector<ChunkKey> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::vector<std::string> Ids(const CachePage& page) {
  std::vector<std::string> ids;
  for (const ContextCache& c : page.data) ids.push_back(c.id);
  return ids;
}

std::vector<std::string> Ids(const StatusOr<CachePage>& page) {
  EXPECT_TRUE(page.ok()) << page.status().ToString();
  return page.ok() ? Ids(*page) : std::vector<std::string>{};
}

TEST(ChunkStoreSession, EqualForEqualTokensAndBosDifferentOtherwise) {
  const std::vector<int32_t> a{1, 2, 3}, b{1, 2, 4}, swapped{2, 1, 3}, longer{1, 2, 3, 0};
  EXPECT_EQ(ChunkStoreSession(a, true), ChunkStoreSession(std::vector<int32_t>{1, 2, 3}, true));
  EXPECT_NE(ChunkStoreSession(a, true), ChunkStoreSession(a, false));
  EXPECT_NE(ChunkStoreSession(a, true), ChunkStoreSession(b, true));
  EXPECT_NE(ChunkStoreSession(a, true), ChunkStoreSession(swapped, true));
  EXPECT_NE(ChunkStoreSession(a, true), ChunkStoreSession(longer, true));
  EXPECT_TRUE(std::regex_match(ChunkStoreSession(a, true), std::regex("ctx:[0-9a-f]{16}")));
  EXPECT_TRUE(IsChunkStoreSession(ChunkStoreSession(a, false)));
  EXPECT_FALSE(IsChunkStoreSession("conversation-1"));
  EXPECT_FALSE(IsChunkStoreSession("ctx-0123"));
}

TEST(ContextCacheRegistry, CreateAssignsIdsAndGetAndResolveFindThem) {
  VirtualClock clock(kT0);
  auto reg = OpenOrDie("", &clock);
  auto made = reg->Create(NewCache("alice", {{5, 6, 7}, {8, 9}}, kT0 + 60'000));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const ContextCache& c = *made;
  EXPECT_TRUE(std::regex_match(c.id, std::regex("ctx-[0-9a-f]{24}"))) << c.id;
  EXPECT_EQ(c.created_at_ms, kT0);
  EXPECT_EQ(c.expires_at_ms, kT0 + 60'000);
  EXPECT_EQ(c.n_tokens(), 5);
  ASSERT_EQ(c.chunks.size(), 2u);
  EXPECT_EQ(c.chunks[0].id, c.id + "-c0");
  EXPECT_EQ(c.chunks[1].id, c.id + "-c1");
  EXPECT_EQ(c.chunks[0].store_session, ChunkStoreSession({5, 6, 7}, true));
  EXPECT_EQ(c.chunks[1].store_session, ChunkStoreSession({8, 9}, true));

  auto got = reg->Get("alice", c.id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->display_name, "docs of alice");
  EXPECT_EQ(got->model, kModel);
  EXPECT_EQ(got->chunks[1].tokens, (std::vector<int32_t>{8, 9}));

  auto all = reg->Resolve("alice", c.id);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].tokens, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ((*all)[1].id, c.id + "-c1");
  auto one = reg->Resolve("alice", c.id + "-c1");
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].tokens, (std::vector<int32_t>{8, 9}));
  for (const std::string& bad :
       {c.id + "-c2", c.id + "-c01", c.id + "-c", c.id + "-c-1", c.id + "x", std::string("ctx-")})
    EXPECT_EQ(reg->Resolve("alice", bad).status().code(), StatusCode::kNotFound) << bad;

  // Another cache gets another id; the same chunk tokens give the same store session.
  auto other = reg->Create(NewCache("alice", {{8, 9}}, kT0 + 60'000));
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->id, c.id);
  EXPECT_EQ(other->chunks[0].store_session, c.chunks[1].store_session);
}

TEST(ContextCacheRegistry, CreateRejectsBadCachesAndStoresNothing) {
  VirtualClock clock(kT0);
  auto reg = OpenOrDie("", &clock);
  EXPECT_EQ(reg->Create(NewCache("alice", {}, kT0 + 1000)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reg->Create(NewCache("alice", {{1}, {}}, kT0 + 1000)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reg->Create(NewCache("alice", {{1}}, kT0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reg->Create(NewCache("alice", {{1}}, kT0 - 5)).status().code(), StatusCode::kInvalidArgument);
  ContextCache bad_name = NewCache("alice", {{1}}, kT0 + 1000);
  bad_name.display_name = std::string("\xff\xfe", 2);  // not UTF-8: could not be persisted as JSON
  EXPECT_EQ(reg->Create(bad_name).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(reg->List("alice", "", 10)->data.empty());
  EXPECT_TRUE(reg->LiveChunks().empty());
  EXPECT_TRUE(reg->ExpireNow().empty());
}

TEST(ContextCacheRegistry, AnotherTenantGetsNotFoundLikeAnUnknownId) {
  VirtualClock clock(kT0);
  auto reg = OpenOrDie("", &clock);
  auto c = reg->Create(NewCache("alice", {{1, 2}}, kT0 + 1000));
  ASSERT_TRUE(c.ok());
  const Status seen_by_bob = reg->Get("bob", c->id).status();
  EXPECT_EQ(seen_by_bob.code(), StatusCode::kNotFound);
  EXPECT_EQ(reg->Resolve("bob", c->id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg->Resolve("bob", c->id + "-c0").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg->SetExpiry("bob", c->id, kT0 + 5000).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg->Delete("bob", c->id).code(), StatusCode::kNotFound);
  EXPECT_TRUE(reg->List("bob", "", 10)->data.empty());
  // Bob's attempts changed nothing of alice's.
  auto still = reg->Get("alice", c->id);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->expires_at_ms, kT0 + 1000);
  // What bob saw is exactly what he sees once the id exists nowhere.
  ASSERT_TRUE(reg->Delete("alice", c->id).ok());
  const Status unknown = reg->Get("bob", c->id).status();
  EXPECT_EQ(seen_by_bob.ToString(), unknown.ToString());
}

TEST(ContextCacheRegistry, ListPagesInCreationOrder) {
  VirtualClock clock(kT0);
  auto reg = OpenOrDie("", &clock);
  std::vector<std::string> created;
  for (int i = 0; i < 7; ++i) {
    if (i % 3 == 0) clock.Advance(1);  // some created in the same millisecond, some not
    auto c = reg->Create(NewCache("alice", {{i + 1}}, kT0 + 100'000));
    ASSERT_TRUE(c.ok());
    created.push_back(c->id);
    ASSERT_TRUE(reg->Create(NewCache("bob", {{i + 1}}, kT0 + 100'000)).ok());  // interleaved, not listed
  }
  CachePage p1 = *reg->List("alice", "", 3);
  EXPECT_EQ(Ids(p1), (std::vector<std::string>(created.begin(), created.begin() + 3)));
  EXPECT_TRUE(p1.has_more);
  CachePage p2 = *reg->List("alice", p1.data.back().id, 3);
  EXPECT_EQ(Ids(p2), (std::vector<std::string>(created.begin() + 3, created.begin() + 6)));
  EXPECT_TRUE(p2.has_more);
  CachePage p3 = *reg->List("alice", p2.data.back().id, 3);
  EXPECT_EQ(Ids(p3), (std::vector<std::string>{created[6]}));
  EXPECT_FALSE(p3.has_more);
  // Exactly a page's worth left: no more after it.
  CachePage exact = *reg->List("alice", created[3], 3);
  EXPECT_EQ(Ids(exact), (std::vector<std::string>(created.begin() + 4, created.end())));
  EXPECT_FALSE(exact.has_more);
  EXPECT_EQ(reg->List("alice", "", 100)->data.size(), 7u);
  EXPECT_EQ(reg->List("alice", "", 0)->data.size(), 1u);  // a limit below 1 counts as 1

  // The cursor is a position: deleting the cache it names does not break the iteration.
  ASSERT_TRUE(reg->Delete("alice", created[2]).ok());
  EXPECT_EQ(Ids(reg->List("alice", created[2], 2)), (std::vector<std::string>{created[3], created[4]}));
  // Expired caches are left out of pages and of has_more.
  auto last = reg->SetExpiry("alice", created[6], kT0 + 50);
  ASSERT_TRUE(last.ok());
  clock.Set(kT0 + 60);
  CachePage tail = *reg->List("alice", created[4], 10);
  EXPECT_EQ(Ids(tail), (std::vector<std::string>{created[5]}));
  EXPECT_FALSE(tail.has_more);
  EXPECT_FALSE(reg->List("alice", created[4], 1)->has_more);
}

TEST(ContextCacheRegistry, ExpiryReportsOnlyChunksNoLongerReferenced) {
  VirtualClock clock(kT0);
  auto reg = OpenOrDie("", &clock);
  const std::vector<int32_t> x{10, 11}, y{20, 21, 22}, z{30};
  auto a = reg->Create(NewCache("alice", {x, y, z}, kT0 + 100));
  auto b = reg->Create(NewCache("alice", {y}, kT0 + 1000));            // shares y with a
  auto c = reg->Create(NewCache("bob", {x}, kT0 + 1000));              // x, but bob's
  auto d = reg->Create(NewCache("alice", {z}, kT0 + 1000, "other-model"));  // z, but another model's entry
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  EXPECT_TRUE(reg->ExpireNow().empty());  // nothing expired yet

  clock.Set(kT0 + 99);
  EXPECT_TRUE(reg->Get("alice", a->id).ok());
  clock.Set(kT0 + 100);  // a expires now
  EXPECT_EQ(reg->Get("alice", a->id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg->Resolve("alice", a->id + "-c0").status().code(), StatusCode::kNotFound);
  // x (bob still has his own) and z (the other model's is another entry) leave alice's
  // entries of kModel; y stays: b references it.
  EXPECT_EQ(reg->ExpireNow(), Sorted({Key("alice", x), Key("alice", z)}));
  EXPECT_TRUE(reg->ExpireNow().empty());  // reported once

  clock.Set(kT0 + 1000);
  EXPECT_EQ(reg->ExpireNow(), Sorted({Key("alice", y), Key("bob", x), Key("alice", z, true, "other-model")}));
  EXPECT_TRUE(reg->LiveChunks().empty());
}

TEST(ContextCacheRegistry, SameChunkTwiceInOneCacheIsReportedOnceWhenItGoes) {
  VirtualClock clock(kT0);
  auto reg = OpenOrDie("", &clock);
  auto a = reg->Create(NewCache("alice", {{1, 2}, {3}, {1, 2}}, kT0 + 100));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->chunks[0].store_session, a->chunks[2].store_session);
  EXPECT_EQ(reg->LiveChunks().size(), 2u);
  clock.Set(kT0 + 100);
  EXPECT_EQ(reg->ExpireNow(), Sorted({Key("alice", {1, 2}), Key("alice", {3})}));
}

TEST(ContextCacheRegistry, SetExpiryExtendsAndShortens) {
  VirtualClock clock(kT0);
  auto reg = OpenOrDie("", &clock);
  auto a = reg->Create(NewCache("alice", {{1}}, kT0 + 100));
  ASSERT_TRUE(a.ok());
  auto longer = reg->SetExpiry("alice", a->id, kT0 + 500);
  ASSERT_TRUE(longer.ok());
  EXPECT_EQ(longer->expires_at_ms, kT0 + 500);
  EXPECT_EQ(longer->created_at_ms, kT0);
  clock.Set(kT0 + 200);
  EXPECT_TRUE(reg->ExpireNow().empty());
  auto got = reg->Get("alice", a->id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->expires_at_ms, kT0 + 500);
  EXPECT_EQ(reg->SetExpiry("alice", a->id, kT0 + 200).status().code(), StatusCode::kInvalidArgument);  // not future
  EXPECT_EQ(reg->Get("alice", a->id)->expires_at_ms, kT0 + 500);  // unchanged by the refused call
  ASSERT_TRUE(reg->SetExpiry("alice", a->id, kT0 + 300).ok());     // shorter is allowed
  clock.Set(kT0 + 300);
  EXPECT_EQ(reg->Get("alice", a->id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg->SetExpiry("alice", a->id, kT0 + 900).status().code(), StatusCode::kNotFound);  // expired: gone
  EXPECT_EQ(reg->ExpireNow(), (std::vector<ChunkKey>{Key("alice", {1})}));
}

TEST(ContextCacheRegistry, DeleteRemovesAndReportsChunksUnlessReferencedAgain) {
  VirtualClock clock(kT0);
  auto reg = OpenOrDie("", &clock);
  auto a = reg->Create(NewCache("alice", {{1}, {2}}, kT0 + 1000));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(reg->Delete("alice", a->id).ok());
  EXPECT_EQ(reg->Get("alice", a->id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg->Delete("alice", a->id).code(), StatusCode::kNotFound);
  // {2} is referenced again before ExpireNow runs: only {1} may be erased.
  ASSERT_TRUE(reg->Create(NewCache("alice", {{2}}, kT0 + 1000)).ok());
  EXPECT_EQ(reg->ExpireNow(), (std::vector<ChunkKey>{Key("alice", {1})}));
}

TEST(ContextCacheRegistry, ImplicitRecordsExtendNeverShortenAndExpire) {
  VirtualClock clock(kT0);
  auto reg = OpenOrDie("", &clock);
  const std::vector<int32_t> doc{7, 8, 9};
  const std::string session = ChunkStoreSession(doc, true);
  EXPECT_FALSE(reg->HasImplicit("alice", kModel, session));
  ASSERT_TRUE(reg->TouchImplicit("alice", kModel, doc, true, kT0 + 100).ok());
  EXPECT_TRUE(reg->HasImplicit("alice", kModel, session));
  EXPECT_FALSE(reg->HasImplicit("bob", kModel, session));
  EXPECT_FALSE(reg->HasImplicit("alice", "other-model", session));
  EXPECT_FALSE(reg->HasImplicit("alice", kModel, ChunkStoreSession(doc, false)));
  EXPECT_EQ(reg->TouchImplicit("alice", kModel, {}, true, kT0 + 100).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reg->TouchImplicit("alice", kModel, doc, true, kT0).code(), StatusCode::kInvalidArgument);

  ASSERT_TRUE(reg->TouchImplicit("alice", kModel, doc, true, kT0 + 50).ok());  // does not shorten
  clock.Set(kT0 + 60);
  EXPECT_TRUE(reg->HasImplicit("alice", kModel, session));
  ASSERT_TRUE(reg->TouchImplicit("alice", kModel, doc, true, kT0 + 300).ok());  // extends
  clock.Set(kT0 + 200);
  EXPECT_TRUE(reg->HasImplicit("alice", kModel, session));
  EXPECT_TRUE(reg->ExpireNow().empty());
  ASSERT_EQ(reg->LiveChunks().size(), 1u);
  EXPECT_EQ(reg->LiveChunks()[0].key, Key("alice", doc));
  EXPECT_EQ(reg->LiveChunks()[0].tokens, doc);

  clock.Set(kT0 + 300);
  EXPECT_FALSE(reg->HasImplicit("alice", kModel, session));
  EXPECT_EQ(reg->ExpireNow(), (std::vector<ChunkKey>{Key("alice", doc)}));
}

TEST(ContextCacheRegistry, ImplicitRecordAndCacheOfOneChunkKeepItTogether) {
  VirtualClock clock(kT0);
  auto reg = OpenOrDie("", &clock);
  const std::vector<int32_t> doc{4, 4, 4};
  ASSERT_TRUE(reg->TouchImplicit("alice", kModel, doc, true, kT0 + 100).ok());
  auto a = reg->Create(NewCache("alice", {doc, {5}}, kT0 + 200));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reg->LiveChunks().size(), 2u);  // doc once, {5}
  clock.Set(kT0 + 100);
  EXPECT_TRUE(reg->ExpireNow().empty());  // the cache still holds doc
  clock.Set(kT0 + 200);
  EXPECT_EQ(reg->ExpireNow(), Sorted({Key("alice", doc), Key("alice", {5})}));
}

TEST(ContextCacheRegistry, PerTenantLimits) {
  VirtualClock clock(kT0);
  RegistryOptions options;
  options.max_caches_per_tenant = 2;
  options.max_implicit_per_tenant = 1;
  auto reg = OpenOrDie("", &clock, options);
  ASSERT_TRUE(reg->Create(NewCache("alice", {{1}}, kT0 + 100)).ok());
  ASSERT_TRUE(reg->Create(NewCache("alice", {{2}}, kT0 + 1000)).ok());
  EXPECT_EQ(reg->Create(NewCache("alice", {{3}}, kT0 + 1000)).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(reg->Create(NewCache("bob", {{3}}, kT0 + 1000)).ok());  // per tenant
  clock.Set(kT0 + 100);  // one of alice's expires: room again, even before ExpireNow
  EXPECT_TRUE(reg->Create(NewCache("alice", {{3}}, kT0 + 1000)).ok());
  EXPECT_EQ(reg->List("alice", "", 10)->data.size(), 2u);

  ASSERT_TRUE(reg->TouchImplicit("alice", kModel, {1}, true, kT0 + 200).ok());
  EXPECT_EQ(reg->TouchImplicit("alice", kModel, {2}, true, kT0 + 200).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(reg->TouchImplicit("alice", kModel, {1}, true, kT0 + 300).ok());  // extending one held is fine
  EXPECT_TRUE(reg->TouchImplicit("bob", kModel, {2}, true, kT0 + 200).ok());
}

TEST(ContextCacheRegistry, RestartFindsLiveRecordsAndDropsExpiredOnes) {
  attic::testing::TempDir tmp;
  const std::string dir = tmp.File("caches");  // created by Open
  VirtualClock clock(kT0);
  std::string a_id, b_id;
  ContextCache b_before;
  {
    auto reg = OpenOrDie(dir, &clock);
    auto a = reg->Create(NewCache("alice", {{1, 2}, {3}}, kT0 + 100));
    auto b = reg->Create(NewCache("alice", {{3}, {4, 5}}, kT0 + 1000));
    ASSERT_TRUE(a.ok() && b.ok());
    a_id = a->id;
    b_id = b->id;
    ASSERT_TRUE(reg->TouchImplicit("bob", kModel, {9, 9}, false, kT0 + 1000).ok());
    ASSERT_TRUE(reg->TouchImplicit("bob", kModel, {8}, true, kT0 + 100).ok());
    ASSERT_TRUE(reg->SetExpiry("alice", b_id, kT0 + 2000).ok());
    b_before = *reg->Get("alice", b_id);
  }
  clock.Set(kT0 + 500);  // a and bob's {8} expired while no registry ran
  auto reg = OpenOrDie(dir, &clock);
  EXPECT_EQ(reg->open_report().caches, 1);
  EXPECT_EQ(reg->open_report().implicit, 1);
  EXPECT_EQ(reg->open_report().expired, 2);
  EXPECT_EQ(reg->open_report().corrupt, 0);
  EXPECT_EQ(reg->Get("alice", a_id).status().code(), StatusCode::kNotFound);
  auto b = reg->Get("alice", b_id);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->tenant, b_before.tenant);
  EXPECT_EQ(b->model, b_before.model);
  EXPECT_EQ(b->display_name, b_before.display_name);
  EXPECT_EQ(b->bos, b_before.bos);
  EXPECT_EQ(b->created_at_ms, kT0);
  EXPECT_EQ(b->expires_at_ms, kT0 + 2000);  // SetExpiry was persisted
  ASSERT_EQ(b->chunks.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(b->chunks[i].id, b_before.chunks[i].id);
    EXPECT_EQ(b->chunks[i].tokens, b_before.chunks[i].tokens);
    EXPECT_EQ(b->chunks[i].store_session, b_before.chunks[i].store_session);
  }
  EXPECT_TRUE(reg->HasImplicit("bob", kModel, ChunkStoreSession({9, 9}, false)));
  EXPECT_FALSE(reg->HasImplicit("bob", kModel, ChunkStoreSession({8}, true)));
  EXPECT_FALSE(fs::exists(dir + "/" + a_id + ".json"));
  EXPECT_TRUE(fs::exists(dir + "/" + b_id + ".json"));
  // What expired while closed is reported by the first ExpireNow: a's {1, 2} and bob's {8};
  // a's {3} is still b's.
  EXPECT_EQ(reg->ExpireNow(), Sorted({Key("alice", {1, 2}), Key("bob", {8})}));
  // New ids still come after the old ones in the list.
  auto c = reg->Create(NewCache("alice", {{6}}, kT0 + 3000));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(Ids(reg->List("alice", "", 10)), (std::vector<std::string>{b_id, c->id}));

  // A deleted cache stays deleted after a restart.
  ASSERT_TRUE(reg->Delete("alice", b_id).ok());
  reg.reset();
  auto again = OpenOrDie(dir, &clock);
  EXPECT_EQ(again->Get("alice", b_id).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(again->Get("alice", c->id).ok());
}

TEST(ContextCacheRegistry, CorruptRecordsAreRemovedAndCountedOthersLoad) {
  attic::testing::TempDir tmp;
  VirtualClock clock(kT0);
  std::string good, garbage, truncated, renamed_copy;
  {
    auto reg = OpenOrDie(tmp.path(), &clock);
    auto a = reg->Create(NewCache("alice", {{1}}, kT0 + 1000));
    auto b = reg->Create(NewCache("alice", {{2}}, kT0 + 1000));
    auto c = reg->Create(NewCache("alice", {{3}}, kT0 + 1000));
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    good = a->id;
    garbage = b->id;
    truncated = c->id;
  }
  WriteAll(tmp.File(garbage + ".json"), "{not json");
  const std::string whole = ReadAll(tmp.File(truncated + ".json"));
  WriteAll(tmp.File(truncated + ".json"), whole.substr(0, whole.size() / 2));
  // A well-formed record under a name that is not its id.
  renamed_copy = "ctx-" + std::string(24, 'a');
  WriteAll(tmp.File(renamed_copy + ".json"), ReadAll(tmp.File(good + ".json")));
  // An implicit record's name pattern with nonsense inside.
  const std::string bad_implicit = "implicit-" + std::string(32, '0') + ".json";
  WriteAll(tmp.File(bad_implicit), R"({"version":1,"tenant":"alice"})");

  auto reg = OpenOrDie(tmp.path(), &clock);
  EXPECT_EQ(reg->open_report().corrupt, 4);
  EXPECT_EQ(reg->open_report().caches, 1);
  EXPECT_TRUE(reg->Get("alice", good).ok());
  EXPECT_EQ(reg->Get("alice", garbage).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg->Get("alice", truncated).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg->Get("alice", renamed_copy).status().code(), StatusCode::kNotFound);
  for (const std::string& name : {garbage + ".json", truncated + ".json", renamed_copy + ".json", bad_implicit})
    EXPECT_FALSE(fs::exists(tmp.File(name))) << name;
  EXPECT_TRUE(fs::exists(tmp.File(good + ".json")));
}

TEST(ContextCacheRegistry, FilesNotOursAreNeverTouched) {
  attic::testing::TempDir tmp;
  VirtualClock clock(kT0);
  // Names that are not of the record patterns, or merely look like them.
  const std::vector<std::string> foreign = {"notes.txt", "ctx-foo.json", "my.json.tmp",
                                            "ctx-" + std::string(24, 'A') + ".json",  // upper-case hex
                                            "ctx-" + std::string(23, 'a') + ".json", "implicit-1234.json",
                                            "ctx-" + std::string(24, 'b') + ".json.bak"};
  for (const std::string& name : foreign) WriteAll(tmp.File(name), "someone else's " + name);
  fs::create_directory(tmp.File("ctx-" + std::string(24, 'c') + ".json"));  // a directory with a record's name
  WriteAll(tmp.File("target"), "link target");
  fs::create_symlink(tmp.File("target"), tmp.File("ctx-" + std::string(24, 'd') + ".json"));
  const std::string stale = "ctx-" + std::string(24, 'e') + ".json.tmp";  // ours: a write a crash interrupted
  WriteAll(tmp.File(stale), "{");
  {
    auto reg = OpenOrDie(tmp.path(), &clock);
    EXPECT_EQ(reg->open_report().foreign, static_cast<int>(foreign.size()) + 3);  // + directory, target, link
    EXPECT_EQ(reg->open_report().stale_tmp, 1);
    EXPECT_EQ(reg->open_report().corrupt, 0);
    auto a = reg->Create(NewCache("alice", {{1}}, kT0 + 10));
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(reg->Delete("alice", a->id).ok());
    ASSERT_TRUE(reg->Create(NewCache("alice", {{1}}, kT0 + 10)).ok());
    clock.Set(kT0 + 10);
    EXPECT_EQ(reg->ExpireNow().size(), 1u);
  }
  auto again = OpenOrDie(tmp.path(), &clock);
  for (const std::string& name : foreign) EXPECT_EQ(ReadAll(tmp.File(name)), "someone else's " + name) << name;
  EXPECT_TRUE(fs::is_directory(tmp.File("ctx-" + std::string(24, 'c') + ".json")));
  EXPECT_TRUE(fs::is_symlink(tmp.File("ctx-" + std::string(24, 'd') + ".json")));
  EXPECT_EQ(ReadAll(tmp.File("target")), "link target");
  EXPECT_FALSE(fs::exists(tmp.File(stale)));
  // Only the foreign names are left.
  size_t n = 0;
  for (const auto& de : fs::directory_iterator(tmp.path())) {
    (void)de;
    ++n;
  }
  EXPECT_EQ(n, foreign.size() + 3);
}

TEST(ContextCacheRegistry, RecordsOfANewerVersionAreLeftAlone) {
  attic::testing::TempDir tmp;
  VirtualClock clock(kT0);
  const std::string id = "ctx-" + std::string(24, 'f');
  const std::string text = R"({"version":2,"id":")" + id + R"(","something":"new"})";
  WriteAll(tmp.File(id + ".json"), text);
  auto reg = OpenOrDie(tmp.path(), &clock);
  EXPECT_EQ(reg->open_report().newer, 1);
  EXPECT_EQ(reg->open_report().corrupt, 0);
  EXPECT_EQ(ReadAll(tmp.File(id + ".json")), text);
  EXPECT_TRUE(reg->List("", "", 10)->data.empty());
}

TEST(ContextCacheRegistry, LiveChunksListsEachReferencedChunkOnce) {
  VirtualClock clock(kT0);
  auto reg = OpenOrDie("", &clock);
  ASSERT_TRUE(reg->Create(NewCache("alice", {{1}, {2, 3}}, kT0 + 1000)).ok());
  ASSERT_TRUE(reg->Create(NewCache("alice", {{2, 3}}, kT0 + 100)).ok());
  ASSERT_TRUE(reg->TouchImplicit("alice", kModel, {1}, true, kT0 + 1000).ok());
  ASSERT_TRUE(reg->TouchImplicit("bob", kModel, {1}, false, kT0 + 1000).ok());
  std::vector<ChunkKey> keys;
  for (const LiveChunk& c : reg->LiveChunks()) keys.push_back(c.key);
  // The sessions as tests/data/store/make_golden_entry.py's own XXH3-64 gives them (see
  // ChunkStoreSessionIsTheHashOfBosAndTokens), not as ChunkStoreSession does.
  EXPECT_EQ(keys, Sorted({ChunkKey{"alice", kModel, "ctx:03036954137dc302"},
                          ChunkKey{"alice", kModel, "ctx:d8efbbd0b9f7f32a"},
                          ChunkKey{"bob", kModel, "ctx:2d1f67ec38718ecb"}}));
  for (const LiveChunk& c : reg->LiveChunks()) EXPECT_EQ(ChunkStoreSession(c.tokens, c.bos), c.key.store_session);
}

// "ctx:" and 16 lowercase hex digits of XXH3-64 (seed 0) over a bos byte (1 or 0) and the
// tokens as little-endian u32 (docs/linking.md), against values computed by the XXH3-64
// written from the xxHash spec in tests/data/store/make_golden_entry.py (which checks
// itself against the published vectors):
//   python3 -c "import importlib.util,struct; s=importlib.util.spec_from_file_location('g',
//     'tests/data/store/make_golden_entry.py'); g=importlib.util.module_from_spec(s);
//     s.loader.exec_module(g); print('ctx:%016x' % g.xxh3_64(bytes([1])+struct.pack('<I',1)))"
TEST(ContextCacheRegistry, ChunkStoreSessionIsTheHashOfBosAndTokens) {
  EXPECT_EQ(ChunkStoreSession({1}, true), "ctx:03036954137dc302");
  EXPECT_EQ(ChunkStoreSession({2, 3}, true), "ctx:d8efbbd0b9f7f32a");
  EXPECT_EQ(ChunkStoreSession({1}, false), "ctx:2d1f67ec38718ecb");
  EXPECT_EQ(ChunkStoreSession({}, true), "ctx:e12ef9d2eb86ceeb");
  EXPECT_EQ(ChunkStoreSession({-1, 511, 70000}, false), "ctx:5a90720f4eda2f6a");
}

TEST(ContextCacheRegistry, ConcurrentCallsKeepCountsConsistent) {
  attic::testing::TempDir tmp;
  VirtualClock clock(kT0);
  auto reg = OpenOrDie(tmp.path(), &clock);
  constexpr int kThreads = 4, kEach = 20;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string tenant = "tenant" + std::to_string(t % 2);
      for (int i = 0; i < kEach; ++i) {
        auto c = reg->Create(NewCache(tenant, {{t, i}, {99}}, kT0 + 1000));
        ASSERT_TRUE(c.ok());
        ASSERT_TRUE(reg->Get(tenant, c->id).ok());
        (void)reg->List(tenant, "", 5);
        if (i % 2 == 0) {
          ASSERT_TRUE(reg->Delete(tenant, c->id).ok());
        }
        ASSERT_TRUE(reg->TouchImplicit(tenant, kModel, {t, i, 0}, true, kT0 + 10 + i).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  // Each thread kept kEach / 2 caches; {99} is still referenced by every tenant's.
  EXPECT_EQ(reg->List("tenant0", "", 100)->data.size(), static_cast<size_t>(kEach));
  EXPECT_EQ(reg->List("tenant1", "", 100)->data.size(), static_cast<size_t>(kEach));
  std::set<ChunkKey> reported;
  for (const ChunkKey& k : reg->ExpireNow()) reported.insert(k);
  // The deleted caches' own chunks {t, i} (even i), and nothing else.
  std::set<ChunkKey> expected;
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kEach; i += 2) expected.insert(Key("tenant" + std::to_string(t % 2), {t, i}));
  EXPECT_EQ(reported, expected);
  clock.Set(kT0 + 10 + kEach);  // every implicit record expired
  EXPECT_EQ(reg->ExpireNow().size(), static_cast<size_t>(kThreads * kEach));
}

}  // namespace
}  // namespace attic::pic
