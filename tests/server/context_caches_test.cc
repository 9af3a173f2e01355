// The context-cache service on a real engine, scheduler (its step loop on a thread) and
// KV store: KVGen stores each distinct chunk once, with exactly its tokens after BOS;
// linking places chunks where the prompt has them and prefills a chunk whose KV went
// missing again first; Sweep erases a chunk's entry once no live cache of the tenant uses
// it (and not before); implicit caches become linkable once their background KVGen ran.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "attic/server/context_caches.h"
#include "test_util.h"

namespace attic::server {
namespace {

using attic::testing::SharedDir;
using namespace std::chrono_literals;

class ContextCacheServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine::EngineOptions o;
    o.model_path = SharedDir() + "/models/stories260K-hf";
    o.n_threads = 2;
    o.max_batch_tokens = 64;
    o.kv_cache_bytes = 8 << 20;
    auto e = engine::Engine::Load(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
    store::StoreOptions so;
    so.fingerprint = engine_->model().fingerprint();
    so.dram_bytes = 64 << 20;
    auto st = store::KvStore::Open(so);
    ASSERT_TRUE(st.ok());
    store_ = std::move(*st);
    sched_ = std::make_unique<engine::Scheduler>(*engine_, engine::SchedulerOptions{});
    sched_->set_store(store_.get());
    auto reg = pic::ContextCacheRegistry::Open("");
    ASSERT_TRUE(reg.ok());
    registry_ = std::move(*reg);
    ContextCacheOptions co;
    co.model = "stories";
    service_ = std::make_unique<ContextCacheService>(*engine_, *sched_, *store_, *registry_, co);
    loop_ = std::thread([this] {
      while (!stop_.load())
        if (sched_->WaitForWork(10ms)) sched_->Step();
    });
  }
  void TearDown() override {
    stop_.store(true);
    if (loop_.joinable()) loop_.join();
  }

  std::vector<int32_t> Tok(const std::string& s) {
    auto t = engine_->Tokenize(s, false);
    EXPECT_TRUE(t.ok());
    return *t;
  }
  engine::SchedClock::time_point Deadline() { return engine::SchedClock::now() + 60s; }
  int64_t In(int64_t ms) { return store::SystemClock().NowMs() + ms; }

  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<store::KvStore> store_;
  std::unique_ptr<engine::Scheduler> sched_;
  std::unique_ptr<pic::ContextCacheRegistry> registry_;
  std::unique_ptr<ContextCacheService> service_;
  std::atomic<bool> stop_{false};
  std::thread loop_;
};

TEST_F(ContextCacheServiceTest, KvGenStoresEachDistinctChunkOnceAfterBos) {
  const auto a = Tok("Once upon a time there was a cat."), b = Tok("The dog ran to the park.");
  int computed = 0;
  auto c = service_->Create("t", "two", {a, b, a}, In(60000), Deadline(), &computed);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(computed, static_cast<int>(a.size() + b.size()));  // each distinct chunk once (its BOS not counted)
  ASSERT_EQ(c->chunks.size(), 3u);
  for (const auto& tokens : {a, b}) {
    ASSERT_TRUE(service_->Stored("t", tokens, true));
    auto e = store_->Load(service_->StoreKey("t", tokens, true));
    ASSERT_TRUE(e.ok());
    std::vector<int32_t> want = {engine_->tokenizer().bos_id()};
    want.insert(want.end(), tokens.begin(), tokens.end());
    EXPECT_EQ(e->tokens, want);
    EXPECT_EQ(e->expires_at_ms, 0);  // the registry owns its lifetime
  }
  EXPECT_FALSE(service_->Stored("u", a, true));  // tenant-scoped
  // A second cache of the same text prefills nothing.
  auto c2 = service_->Create("t", "again", {b}, In(60000), Deadline(), &computed);
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(computed, 0);
}

TEST_F(ContextCacheServiceTest, ADocumentOfMoreChunksThanTheQueueHoldsIsPrefilledInWaves) {
  // The default queue holds 64 waiting requests; 150 distinct chunks go through anyway.
  std::vector<std::vector<int32_t>> chunks;
  for (int i = 0; i < 150; ++i) chunks.push_back(Tok("Chunk number " + std::to_string(i) + " of the tale."));
  int computed = 0;
  auto c = service_->Create("t", "many", chunks, In(60000), Deadline(), &computed);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->chunks.size(), 150u);
  for (const auto& t : chunks) EXPECT_TRUE(service_->Stored("t", t, true));
}

TEST_F(ContextCacheServiceTest, LinkPlacesChunksAndPrefillsAMissingOneAgain) {
  const auto a = Tok("Once upon a time there was a cat."), b = Tok("The dog ran to the park."), q = Tok(" Why?");
  int computed = 0;
  ASSERT_TRUE(service_->Create("t", "", {a, b}, In(60000), Deadline(), &computed).ok());
  ASSERT_TRUE(store_->EraseSession("t", pic::ChunkStoreSession(b, true)).ok());
  std::vector<PromptPiece> pieces = {{{1}, false, false}, {b, true, true}, {q, false, false}, {a, true, true}};
  std::vector<int32_t> prompt;
  LinkPrep prep;
  auto spec = service_->Link("t", pieces, pic::LinkOptions{}, Deadline(), &prompt, &prep);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_NE(*spec, nullptr);
  EXPECT_EQ(prep.chunks, 2);
  EXPECT_EQ(prep.regenerated, 1);
  EXPECT_EQ(prep.regenerated_tokens, static_cast<int>(b.size()) + 1);
  EXPECT_EQ(prep.hits_by_tier["dram"], 1);
  EXPECT_TRUE(service_->Stored("t", b, true));
  std::vector<int32_t> want = {1};
  for (const auto* p : {&b, &q, &a}) want.insert(want.end(), p->begin(), p->end());
  EXPECT_EQ(prompt, want);
  ASSERT_EQ((*spec)->chunks.size(), 2u);
  EXPECT_EQ((*spec)->chunks[0].slot, 1);
  EXPECT_EQ((*spec)->chunks[0].n, static_cast<int>(b.size()));
  EXPECT_EQ((*spec)->chunks[0].src_row, 1);
  EXPECT_EQ((*spec)->chunks[1].slot, static_cast<int>(1 + b.size() + q.size()));
  EXPECT_EQ((*spec)->chunks[1].store_key, service_->StoreKey("t", a, true));
}

TEST_F(ContextCacheServiceTest, SweepErasesAChunkOnceNoLiveCacheUsesIt) {
  const auto a = Tok("Once upon a time there was a cat."), b = Tok("The dog ran to the park.");
  int computed = 0;
  auto c1 = service_->Create("t", "", {a, b}, In(60000), Deadline(), &computed);
  auto c2 = service_->Create("t", "", {b}, In(60000), Deadline(), &computed);
  auto other = service_->Create("u", "", {a}, In(60000), Deadline(), &computed);
  ASSERT_TRUE(c1.ok() && c2.ok() && other.ok());
  ASSERT_TRUE(registry_->Delete("t", c1->id).ok());
  EXPECT_EQ(service_->Sweep(), 1);                // a of t; b is still c2's
  EXPECT_FALSE(service_->Stored("t", a, true));
  EXPECT_TRUE(service_->Stored("t", b, true));
  EXPECT_TRUE(service_->Stored("u", a, true));   // another tenant's cache of the same text
  ASSERT_TRUE(registry_->Delete("t", c2->id).ok());
  EXPECT_EQ(service_->Sweep(), 1);
  EXPECT_FALSE(service_->Stored("t", b, true));
}

TEST_F(ContextCacheServiceTest, AnImplicitCacheIsLinkableOnceItsBackgroundPrefillRan) {
  const auto text = Tok("A long system prompt about cats and dogs and the sun.");
  EXPECT_FALSE(service_->ImplicitReady("t", text));
  ASSERT_TRUE(service_->RememberImplicit("t", text, 300000).ok());
  bool ready = false;
  // Polled: the background prefill runs on the scheduler's thread; the try count (60 s)
  // is a backstop against one that never runs, not a bound on how soon it does.
  for (int i = 0; i < 6000 && !ready; ++i) {
    store_->Flush();
    ready = service_->ImplicitReady("t", text);
    if (!ready) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(ready);
  EXPECT_FALSE(service_->ImplicitReady("u", text));
}

}  // namespace
}  // namespace attic::server
