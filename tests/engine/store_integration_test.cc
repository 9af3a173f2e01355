// Scheduler + KV store (paper 001): a conversation's next turn reuses its stored KV from
// DRAM, from SSD after demotion, and after a restart; greedy outputs equal recompute.
// Resident (compute-buffer) reuse is disabled so that every reuse comes from the store.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>

#include "attic/engine/kv_features.h"
#include "attic/engine/scheduler.h"
#include "attic/store/kv_store.h"
#include "attic/store/store_planner.h"
#include "store/store_test_util.h"
#include "test_util.h"

namespace attic::engine {
namespace {

using attic::testing::SharedDir;
using namespace std::chrono_literals;

// kv_dtype_v: V's type in the compute buffer when it differs from K's (kv_dtype).
std::unique_ptr<Engine> LoadStories(DType kv_dtype = DType::kF32, std::optional<DType> kv_dtype_v = std::nullopt) {
  EngineOptions o;
  o.model_path = SharedDir() + "/models/stories260K-hf";
  o.n_threads = 2;
  o.kv_dtype = kv_dtype;
  o.kv_dtype_v = kv_dtype_v;
  o.max_batch_tokens = 64;
  o.kv_cache_bytes = 8 << 20;
  auto e = Engine::Load(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

struct Turn {
  std::string text;
  TokenUsage usage;
  bool finished = false;
};

struct TurnSpec {
  std::vector<int32_t> prompt;
  std::string session;
  int max_tokens = 0;
};

std::shared_ptr<ResultChannel> SubmitTurn(Scheduler& s, const TurnSpec& spec) {
  GenerationRequest req;
  req.prompt = spec.prompt;
  req.sampling.max_tokens = spec.max_tokens;
  req.session_id = spec.session;
  auto chan = s.Submit(std::move(req));
  EXPECT_TRUE(chan.ok()) << chan.status().ToString();
  return chan.ok() ? *chan : nullptr;
}

// Moves the events `chan` has now into `turn` (text, then usage at the finish).
void Drain(ResultChannel* chan, Turn* turn) {
  GenerationEvent ev;
  while (chan != nullptr && !turn->finished && chan->Pop(&ev, 0ms)) {
    if (ev.kind == GenerationEvent::Kind::kText) {
      turn->text += ev.text;
    } else {
      EXPECT_EQ(ev.kind, GenerationEvent::Kind::kFinish) << ev.status.ToString();
      turn->usage = ev.usage;
      turn->finished = true;
    }
  }
}

// Submits every turn at once and steps the scheduler until all have finished.
std::vector<Turn> RunTurns(Scheduler& s, const std::vector<TurnSpec>& specs) {
  std::vector<std::shared_ptr<ResultChannel>> chans;
  for (const TurnSpec& spec : specs) chans.push_back(SubmitTurn(s, spec));
  std::vector<Turn> turns(specs.size());
  auto all_done = [&] { return std::all_of(turns.begin(), turns.end(), [](const Turn& t) { return t.finished; }); };
  for (int step = 0; step < 5000 && !all_done(); ++step) {
    s.Step();
    for (size_t i = 0; i < chans.size(); ++i) Drain(chans[i].get(), &turns[i]);
  }
  return turns;
}

Turn RunTurn(Scheduler& s, const std::vector<int32_t>& prompt, const std::string& session, int max_tokens) {
  return RunTurns(s, {{prompt, session, max_tokens}})[0];
}

std::string Recompute(Engine& e, const std::vector<int32_t>& prompt, int max_tokens) {
  Session s(e);
  SamplingParams p;
  p.max_tokens = max_tokens;
  auto r = s.Generate(prompt, p);
  EXPECT_TRUE(r.ok());
  return r.ok() ? r->text : "";
}

SchedulerOptions NoResident() {
  SchedulerOptions o;
  o.max_resident = 0;
  return o;
}

// `before_save`: StoreOptions::before_async_save (a test's gate on the writer).
std::unique_ptr<store::KvStore> OpenStore(const Engine& e, uint64_t dram, const std::string& ssd_dir = "",
                                          std::function<void()> before_save = nullptr,
                                          store::KvDtype kv_dtype = store::KvDtype::kF32) {
  store::StoreOptions o;
  o.fingerprint = e.model().fingerprint();
  o.kv_dtype = kv_dtype;
  o.dram_bytes = dram;
  o.ssd_dir = ssd_dir;
  o.before_async_save = std::move(before_save);
  o.ssd_bytes = 64 << 20;
  auto s = store::KvStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

// A scheduler (no resident KV) over a store whose writer stops at `gate` while it is
// held; members in destruction order: the gate opens, then the store drains.
struct GatedStore {
  std::unique_ptr<Engine> e = LoadStories();
  store::testing::Gate gate;
  std::unique_ptr<store::KvStore> store = e ? OpenStore(*e, 64 << 20, "", gate.Hook()) : nullptr;
  store::testing::Gate::ReleaseAtExit release{&gate};
  std::unique_ptr<Scheduler> s = store ? MakeScheduler() : nullptr;

  bool ok() const { return s != nullptr; }
  std::unique_ptr<Scheduler> MakeScheduler() {
    auto sched = std::make_unique<Scheduler>(*e, NoResident());
    sched->set_store(store.get());
    return sched;
  }
};

// Turn 2 = turn 1's prompt + its reply + a new user message.
// (A reply that ends with a stop token had all its tokens fed; one that hit max_tokens
// had all but the last.)
std::vector<int32_t> NextTurn(Engine& e, const std::vector<int32_t>& first, int max_tokens, const std::string& more,
                              int* n_reply = nullptr) {
  Session s(e);
  SamplingParams p;
  p.max_tokens = max_tokens;
  auto r = s.Generate(first, p);
  std::vector<int32_t> next = first;
  next.insert(next.end(), r->tokens.begin(), r->tokens.end());
  if (n_reply != nullptr) *n_reply = static_cast<int>(r->tokens.size());
  auto m = *e.Tokenize(more, false);
  next.insert(next.end(), m.begin(), m.end());
  return next;
}

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_((std::filesystem::temp_directory_path() / ("attic-engine-store-" + name + "-" +
                                                         std::to_string(::getpid()))).string()) {
    std::filesystem::remove_all(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(StoreIntegration, NextTurnReusesHistoryFromDram) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  auto store = OpenStore(*e, 64 << 20);
  Scheduler s(*e, NoResident());
  s.set_store(store.get());
  std::vector<int32_t> first = *e->Tokenize("Lily had a red ball. She", true);
  Turn a = RunTurn(s, first, "conv", 20);
  EXPECT_EQ(a.usage.cached_tokens, 0);
  store->Flush();
  EXPECT_EQ(store->Stats().entries, 1u);
  std::vector<int32_t> second = NextTurn(*e, first, 20, " Then they went home.");
  Turn b = RunTurn(s, second, "conv", 20);
  EXPECT_EQ(b.usage.cached_tokens, static_cast<int>(first.size()) + 20 - 1);
  EXPECT_EQ(b.text, Recompute(*e, second, 20));
  EXPECT_EQ(store->Stats().hits_dram, 1u);
  // The entered bytes: every layer's pre-RoPE K and V rows of the reused tokens, f32.
  const model::ModelConfig& cfg = e->model().config();
  EXPECT_EQ(s.Stats().kv.Value<store::KvLoadStats>().entered_bytes,
            2ull * b.usage.cached_tokens * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * sizeof(float));
  EXPECT_GT(s.Stats().kv.Value<store::KvLoadStats>().enter_seconds, 0);
  store->Flush();
  EXPECT_EQ(store->Stats().entries, 1u);  // the new turn replaced the old entry
  // Without a session id the longest stored prefix is found too.
  std::vector<int32_t> third = second;
  third.push_back(third.back());
  Turn c = RunTurn(s, third, "", 8);
  EXPECT_GE(c.usage.cached_tokens, static_cast<int>(second.size()) - 1);
  EXPECT_EQ(c.text, Recompute(*e, third, 8));
}

// A conversation over a kivi4 store (K per channel over groups of tokens): each turn
// extends the stored entry and shares its rows in place (the store flushed between
// turns: the entry is serialized), so the stored K groups stay as written -- the new
// entry's groups are the previous entry's, then the turn's own rows in groups of up to
// 128 tokens -- and the shared rows read back bit for bit. A last turn that may find the
// previous save still queued (no flush) writes a valid entry as well.
TEST(StoreIntegration, AKivi4ConversationKeepsItsStoredGroupsAcrossTurns) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  auto store = OpenStore(*e, 64 << 20, "", nullptr, store::KvDtype::kKivi4);
  Scheduler s(*e, NoResident());
  s.set_store(store.get());
  std::string text;
  for (int i = 0; i < 6; ++i) text += "Lily and Tom went to the park. They played with a red ball all day. ";
  std::vector<int32_t> prompt = *e->Tokenize(text, true);
  ASSERT_GT(prompt.size(), 128u);  // the first turn's own rows make more than one group
  std::vector<int32_t> prev_ends;
  std::vector<std::vector<float>> prev_k;  // the previous entry's K rows as read, per layer
  const int kvd = e->kv_pool().shape().kv_dim(), n_layers = e->kv_pool().shape().n_layers;
  for (int turn = 0; turn < 4; ++turn) {
    SCOPED_TRACE("turn " + std::to_string(turn));
    Turn t = RunTurn(s, prompt, "conv", 24);
    EXPECT_EQ(t.usage.cached_tokens, turn == 0 ? 0 : static_cast<int>(prev_k[0].size() / kvd));
    if (turn == 3) break;  // not flushed: checked below
    store->Flush();
    auto info = store->GetSession("default", "conv");
    ASSERT_TRUE(info.ok());
    auto entry = store->Load(info->key);
    ASSERT_TRUE(entry.ok()) << entry.status().ToString();
    const std::vector<int32_t> ends = entry->KGroupEnds();
    ASSERT_FALSE(ends.empty());
    EXPECT_EQ(ends.back(), entry->n_tokens());
    for (size_t g = 0; g < ends.size(); ++g) EXPECT_LE(ends[g] - (g ? ends[g - 1] : 0), 128) << g;
    if (turn == 0) {
      EXPECT_EQ(ends.front(), 128);
    }
    ASSERT_GE(ends.size(), prev_ends.size());
    EXPECT_TRUE(std::equal(prev_ends.begin(), prev_ends.end(), ends.begin()));
    std::vector<std::vector<float>> k(n_layers, std::vector<float>(entry->n_tokens() * kvd));
    for (int l = 0; l < n_layers; ++l) {
      for (int r = 0; r < entry->n_tokens(); ++r) entry->KRowF32(l, r, k[l].data() + r * kvd);
      if (!prev_k.empty()) {
        EXPECT_EQ(0, std::memcmp(k[l].data(), prev_k[l].data(), prev_k[l].size() * sizeof(float))) << "layer " << l;
      }
    }
    prev_ends = ends;
    prev_k = std::move(k);
    prompt = entry->tokens;
    const std::vector<int32_t> more = *e->Tokenize(" Then they went home and ate.", false);
    prompt.insert(prompt.end(), more.begin(), more.end());
  }
  store->Flush();
  auto info = store->GetSession("default", "conv");
  ASSERT_TRUE(info.ok());
  auto last = store->Load(info->key);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_GE(last->n_tokens(), static_cast<int>(prompt.size()));
  const std::vector<int32_t> ends = last->KGroupEnds();
  for (size_t g = 0; g < ends.size(); ++g) EXPECT_LE(ends[g] - (g ? ends[g - 1] : 0), 128) << g;
}

// A conversation's next turn arriving while its previous turn is still in the write
// buffer reads that turn's KV from there (paper 3.2: the next job never waits for a
// save), turn after turn, with or without stored history under it.
TEST(StoreIntegration, NextTurnReadsItsQueuedSaveWithoutWaiting) {
  GatedStore g;
  ASSERT_TRUE(g.ok());
  std::vector<int32_t> t1 = *g.e->Tokenize("Lily had a red ball. She", true);
  g.gate.Hold();  // no save is stored until the gate opens
  ASSERT_TRUE(RunTurn(*g.s, t1, "conv", 12).finished);
  // Turn 2 while turn 1's save is queued; another conversation decodes meanwhile.
  auto bg_chan = SubmitTurn(*g.s, {*g.e->Tokenize("Once upon a time", true), "other", 40});
  ASSERT_NE(bg_chan, nullptr);
  g.s->Step();
  // Each next turn reuses all that was computed before it and answers as recomputation.
  auto next_turn = [&](const std::vector<int32_t>& prev, const std::string& more) {
    std::vector<int32_t> p = NextTurn(*g.e, prev, 12, more);
    Turn t = RunTurn(*g.s, p, "conv", 12);
    EXPECT_TRUE(t.finished);
    EXPECT_EQ(t.usage.cached_tokens, static_cast<int>(prev.size()) + 12 - 1);
    EXPECT_EQ(t.text, Recompute(*g.e, p, 12));
    return p;
  };
  std::vector<int32_t> t2 = next_turn(t1, " Then they went home.");
  // Turn 3 reads turn 2's queued save, whose first rows are turn 1's queued save, shared.
  std::vector<int32_t> t3 = next_turn(t2, " The sun was warm.");
  EXPECT_TRUE(g.store->SavePending("default", "conv", t3));  // nothing was stored yet
  EXPECT_EQ(g.s->Stats().kv.Value<store::KvLoadStats>().write_buffer_loads, 2u);
  EXPECT_EQ(g.s->Stats().kv.Value<store::KvLoadStats>().deferred_for_save, 0u);
  EXPECT_EQ(g.store->Stats().write_buffer_hits, 2u);
  EXPECT_EQ(g.store->Stats().hits_dram, 2u);  // a read from the write buffer is a DRAM hit (metrics.md)
  EXPECT_EQ(g.store->Stats().lookup_waits, 0u);

  g.gate.Release();
  g.store->Flush();
  auto stored = g.store->SessionTokens("default", "conv");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(static_cast<int>(stored->size()), static_cast<int>(t3.size()) + 12 - 1);  // turn 3's save replaced the others
  // Turn 4 loads the stored entry; its save is queued again, and turn 5 reads it: the
  // stored history in place under the queued turn's own rows.
  g.gate.Hold();
  std::vector<int32_t> t5 = next_turn(next_turn(t3, " Lily smiled."), " Then she slept.");
  EXPECT_EQ(g.s->Stats().kv.Value<store::KvLoadStats>().write_buffer_loads, 3u);
  g.gate.Release();
  g.store->Flush();
  for (int step = 0; step < 500 && g.s->Stats().running + g.s->Stats().waiting > 0; ++step) g.s->Step();  // bg finishes
  g.store->Flush();
  stored = g.store->SessionTokens("default", "conv");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(static_cast<int>(stored->size()), static_cast<int>(t5.size()) + 12 - 1);
}

// Turns that follow each other faster than the writer stores them: each reads the
// previous turn's queued save, a chain of unserialized entries that admission cuts by
// copying once it is deeper than a few (the step loop never copies a whole history).
TEST(StoreIntegration, ALongRunOfTurnsReadingQueuedSavesStaysExact) {
  GatedStore g;
  ASSERT_TRUE(g.ok());
  std::vector<int32_t> prompt = *g.e->Tokenize("Lily had a red ball. She", true);
  g.gate.Hold();
  ASSERT_TRUE(RunTurn(*g.s, prompt, "conv", 6).finished);
  const int kTurns = 11;  // deeper than the chain admission keeps
  for (int turn = 2; turn <= kTurns; ++turn) {
    std::vector<int32_t> next = NextTurn(*g.e, prompt, 6, " Then she ran.");
    Turn t = RunTurn(*g.s, next, "conv", 6);
    ASSERT_TRUE(t.finished);
    EXPECT_EQ(t.usage.cached_tokens, static_cast<int>(prompt.size()) + 6 - 1) << "turn " << turn;
    EXPECT_EQ(t.text, Recompute(*g.e, next, 6)) << "turn " << turn;
    prompt = std::move(next);
  }
  EXPECT_EQ(g.s->Stats().kv.Value<store::KvLoadStats>().write_buffer_loads, static_cast<uint64_t>(kTurns - 1));
  g.gate.Release();
  g.store->Flush();
  // The last save holds every row; the next turn loads it from the store.
  auto stored = g.store->SessionTokens("default", "conv");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(static_cast<int>(stored->size()), static_cast<int>(prompt.size()) + 6 - 1);
  std::vector<int32_t> last = NextTurn(*g.e, prompt, 6, " The end.");
  Turn t = RunTurn(*g.s, last, "conv", 6);
  EXPECT_EQ(t.usage.cached_tokens, static_cast<int>(prompt.size()) + 6 - 1);
  EXPECT_EQ(t.text, Recompute(*g.e, last, 6));
}

// Without a session id a lookup is a prefix search over the tenant's entries: a turn that
// would extend its match with a queued save waits in the queue for it while others decode.
TEST(StoreIntegration, SessionlessNextTurnWaitsForTheSaveItExtendsWithoutStallingOthers) {
  GatedStore g;
  ASSERT_TRUE(g.ok());
  std::vector<int32_t> first = *g.e->Tokenize("Lily had a red ball. She", true);
  g.gate.Hold();  // turn 1's save stays queued
  Turn a = RunTurn(*g.s, first, "", 20);
  ASSERT_TRUE(a.finished);
  ASSERT_TRUE(g.store->SavePending("default", "", first));
  // Another conversation decodes; then the next turn arrives.
  auto bg_chan = SubmitTurn(*g.s, {*g.e->Tokenize("Once upon a time", true), "other", 60});
  ASSERT_NE(bg_chan, nullptr);
  g.s->Step();  // bg admitted and prefilled
  std::vector<int32_t> second = NextTurn(*g.e, first, 20, " Then they went home.");
  auto next_chan = SubmitTurn(*g.s, {second, "", 20});
  ASSERT_NE(next_chan, nullptr);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(g.s->Step(), 1);  // bg's decode rows only: the next turn waits
  EXPECT_EQ(g.s->Stats().kv.Value<store::KvLoadStats>().deferred_for_save, 1u);
  GenerationEvent ev;
  EXPECT_FALSE(next_chan->Pop(&ev, 0ms));
  g.gate.Release();
  g.store->Flush();
  Turn b;
  for (int step = 0; step < 500 && !b.finished; ++step) {
    g.s->Step();
    Drain(next_chan.get(), &b);
  }
  ASSERT_TRUE(b.finished);
  EXPECT_EQ(b.usage.cached_tokens, static_cast<int>(first.size()) + 20 - 1);
  EXPECT_EQ(b.text, Recompute(*g.e, second, 20));
}

TEST(StoreIntegration, NextTurnReusesHistoryFromSsdAfterDemotion) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  ScratchDir dir("ssd");
  std::vector<int32_t> first = *e->Tokenize("Once upon a time, there was a little dog named Max.", true);
  std::vector<int32_t> other = *e->Tokenize("The cat and the mouse were friends. Every morning they", true);
  // DRAM holds about one entry: saving the second session demotes the first to SSD.
  const uint64_t kv_per_token = 2ull * e->model().config().n_layers * e->kv_pool().shape().kv_dim() * 4;
  auto store = OpenStore(*e, 4096 + kv_per_token * (first.size() + 24), dir.path());
  Scheduler s(*e, NoResident());
  s.set_store(store.get());
  RunTurn(s, first, "a", 16);
  RunTurn(s, other, "b", 16);
  store->Flush();  // b's save (which demotes a) is done
  auto info = store->GetSession("default", "a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tier, store::TierLevel::kSsd);
  int n_reply = 0;
  std::vector<int32_t> second = NextTurn(*e, first, 16, " Max was happy.", &n_reply);
  Turn b = RunTurn(s, second, "a", 16);
  EXPECT_GE(b.usage.cached_tokens, static_cast<int>(first.size()) + n_reply - 1);
  EXPECT_EQ(b.text, Recompute(*e, second, 16));
  EXPECT_EQ(store->Stats().hits_ssd, 1u);
  store->Flush();
  store::StoreStats st = store->Stats();
  EXPECT_LE(st.dram_bytes, st.dram_capacity);
  EXPECT_LE(st.ssd_bytes, st.ssd_capacity);
}

TEST(StoreIntegration, SessionSurvivesRestart) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  ScratchDir dir("restart");
  std::vector<int32_t> first = *e->Tokenize("Sara had a big red ball. She liked to", true);
  {
    auto store = OpenStore(*e, 0, dir.path());  // DRAM of 0 bytes: straight to SSD
    Scheduler s(*e, NoResident());
    s.set_store(store.get());
    RunTurn(s, first, "conv", 12);
    s.Shutdown();
  }
  auto store = OpenStore(*e, 64 << 20, dir.path());
  ASSERT_TRUE(store->GetSession("default", "conv").ok());
  Scheduler s(*e, NoResident());
  s.set_store(store.get());
  int n_reply = 0;
  std::vector<int32_t> second = NextTurn(*e, first, 12, " They played all day.", &n_reply);
  Turn b = RunTurn(s, second, "conv", 12);
  EXPECT_GE(b.usage.cached_tokens, static_cast<int>(first.size()) + n_reply - 1);
  EXPECT_EQ(b.text, Recompute(*e, second, 12));
}

// A quantized store's session across a restart over its SSD directory (q8_0, q4_0,
// q8_0/q4_0): the second turn after the restart reuses the first turn's entry, read back
// from the file, and gives exactly the tokens the same second turn gives without a
// restart (both enter the same stored bytes: the file holds the entry the first server
// saved, bit for bit).
TEST(StoreIntegration, AQuantizedSessionSurvivesARestartBitForBit) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> first = *e->Tokenize("Sara had a big red ball. She liked to", true);
  for (store::KvDtype dt : {store::KvDtype::kQ8_0, store::KvDtype::kQ4_0, store::KvDtype::kQ8_0Q4_0}) {
    SCOPED_TRACE(store::KvDtypeName(dt));
    std::string text[2];
    int cached[2] = {0, 0};
    std::vector<uint8_t> rows[2];  // layer 0's K and V rows of the first turn's entry, as loaded
    std::vector<int32_t> second;
    int n_reply = 0;
    for (bool restart : {false, true}) {
      ScratchDir dir(restart ? "q-restart" : "q-no-restart");
      auto store = OpenStore(*e, 0, dir.path(), nullptr, dt);  // DRAM of 0 bytes: straight to SSD
      auto scheduler = std::make_unique<Scheduler>(*e, NoResident());
      scheduler->set_store(store.get());
      RunTurn(*scheduler, first, "conv", 12);
      if (second.empty()) second = NextTurn(*e, first, 12, " They played all day.", &n_reply);
      if (restart) {
        scheduler->Shutdown();
        scheduler.reset();
        store.reset();
        store = OpenStore(*e, 64 << 20, dir.path(), nullptr, dt);
        scheduler = std::make_unique<Scheduler>(*e, NoResident());
        scheduler->set_store(store.get());
      }
      store->Flush();
      auto info = store->GetSession("default", "conv");
      ASSERT_TRUE(info.ok()) << info.status().ToString();
      EXPECT_TRUE(store::EntryKeyHasDtype(info->key, dt)) << info->key;
      auto entry = store->Load(info->key);
      ASSERT_TRUE(entry.ok()) << entry.status().ToString();
      for (int r = 0; r < entry->n_tokens(); ++r) {
        const char* k = entry->k_row_bytes(0, r);
        const char* v = entry->v_row_bytes(0, r);
        rows[restart].insert(rows[restart].end(), k, k + entry->k_row_size());
        rows[restart].insert(rows[restart].end(), v, v + entry->v_row_size());
      }
      Turn b = RunTurn(*scheduler, second, "conv", 12);
      text[restart] = b.text;
      cached[restart] = b.usage.cached_tokens;
      scheduler->Shutdown();
    }
    EXPECT_GE(cached[1], static_cast<int>(first.size()) + n_reply - 1);
    EXPECT_EQ(cached[1], cached[0]);
    EXPECT_FALSE(rows[0].empty());
    EXPECT_EQ(rows[1], rows[0]);
    EXPECT_EQ(text[1], text[0]);
  }
}

// An f16 store (StoreOptions::kv_dtype) over an f16 compute buffer: entries hold half
// the KV bytes of the f32 store's, a returning turn loaded from DRAM or, after a
// restart, from SSD gives recompute's greedy tokens, and a store of the other dtype
// does not use them.
TEST(StoreIntegration, F16StoreHalvesEntryBytesAndNextTurnsMatchRecompute) {
  auto e = LoadStories(DType::kF16);
  ASSERT_NE(e, nullptr);
  std::vector<int32_t> first = *e->Tokenize("Lily had a red ball. She", true);
  int n_reply = 0;
  std::vector<int32_t> second = NextTurn(*e, first, 20, " Then they went home.", &n_reply);
  const std::string want = Recompute(*e, second, 20);
  uint64_t bytes[2] = {0, 0};
  for (store::KvDtype dt : {store::KvDtype::kF32, store::KvDtype::kF16}) {
    auto store = OpenStore(*e, 64 << 20, "", nullptr, dt);
    Scheduler s(*e, NoResident());
    s.set_store(store.get());
    RunTurn(s, first, "conv", 20);
    store->Flush();
    auto info = store->GetSession("default", "conv");
    ASSERT_TRUE(info.ok());
    EXPECT_TRUE(store::EntryKeyHasDtype(info->key, dt)) << info->key;
    bytes[dt == store::KvDtype::kF16] = info->bytes;
    Turn b = RunTurn(s, second, "conv", 20);
    EXPECT_EQ(b.usage.cached_tokens, static_cast<int>(first.size()) + n_reply - 1) << store::KvDtypeName(dt);
    EXPECT_EQ(b.text, want) << store::KvDtypeName(dt);
  }
  // Same 4096-byte header; the KV after it is half as many bytes. (The reply's last
  // token was not fed: max_tokens.)
  const uint64_t n_tokens = first.size() + n_reply - 1;
  const uint64_t kv32 = 2ull * e->model().config().n_layers * n_tokens * e->kv_pool().shape().kv_dim() * 4;
  EXPECT_EQ(bytes[0], 4096 + kv32);
  EXPECT_EQ(bytes[1], 4096 + kv32 / 2);
  std::printf("entry of %llu tokens: f32 %llu bytes, f16 %llu bytes\n", static_cast<unsigned long long>(n_tokens),
              static_cast<unsigned long long>(bytes[0]), static_cast<unsigned long long>(bytes[1]));

  // Through the SSD tier, across restarts.
  ScratchDir dir("f16");
  {
    auto store = OpenStore(*e, 0, dir.path(), nullptr, store::KvDtype::kF16);  // straight to SSD
    Scheduler s(*e, NoResident());
    s.set_store(store.get());
    RunTurn(s, first, "conv", 20);
    s.Shutdown();
  }
  {  // An f32 store on the same directory keeps the f16 entry but does not use it.
    auto store = OpenStore(*e, 64 << 20, dir.path(), nullptr, store::KvDtype::kF32);
    EXPECT_FALSE(store->Lookup("default", "conv", second).has_value());
    Scheduler s(*e, NoResident());
    s.set_store(store.get());
    Turn b = RunTurn(s, second, "other", 20);
    EXPECT_EQ(b.usage.cached_tokens, 0);
    EXPECT_EQ(b.text, want);
    s.Shutdown();
  }
  auto store = OpenStore(*e, 64 << 20, dir.path(), nullptr, store::KvDtype::kF16);
  Scheduler s(*e, NoResident());
  s.set_store(store.get());
  Turn b = RunTurn(s, second, "conv", 20);
  EXPECT_EQ(b.usage.cached_tokens, static_cast<int>(first.size()) + n_reply - 1);
  EXPECT_EQ(b.text, want);
}

// With resident reuse on, turns that adopt or copy resident KV still save complete,
// exact pre-RoPE KV: a second scheduler without resident reuse continues from the store.
TEST(StoreIntegration, TurnsBuiltOnResidentKvSaveExactEntries) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  auto store = OpenStore(*e, 64 << 20);
  std::vector<int32_t> first = *e->Tokenize("Once upon a time, there was a little dog named Max.", true);
  std::vector<int32_t> second, branch;
  {
    Scheduler s(*e, SchedulerOptions{});
    s.set_store(store.get());
    RunTurn(s, first, "conv", 16);
    second = NextTurn(*e, first, 16, " Max was happy.");
    Turn b = RunTurn(s, second, "conv", 16);  // adopts the resident sequence
    EXPECT_GT(b.usage.cached_tokens, 0);
    // Another session sharing only the first prompt copies the resident prefix.
    branch = first;
    auto more = *e->Tokenize(" The sky was blue and", false);
    branch.insert(branch.end(), more.begin(), more.end());
    Turn c = RunTurn(s, branch, "other", 16);
    EXPECT_GE(c.usage.cached_tokens, static_cast<int>(first.size()) - 1);
    s.Shutdown();
  }
  store->Flush();
  Scheduler s2(*e, NoResident());
  s2.set_store(store.get());
  for (auto [prompt, session] : {std::pair{second, std::string("conv")}, std::pair{branch, std::string("other")}}) {
    int n_reply = 0;
    std::vector<int32_t> next = NextTurn(*e, prompt, 16, " They went home.", &n_reply);
    Turn t = RunTurn(s2, next, session, 16);
    EXPECT_GE(t.usage.cached_tokens, static_cast<int>(prompt.size()) + n_reply - 1) << session;
    EXPECT_EQ(t.text, Recompute(*e, next, 16)) << session;
  }
}

// A conversation that stays resident saves each turn from the rows it shares with its
// previous save (nothing copied at turn end): while the writer is held the saves chain
// (cut by copying one level once deeper than a few), once they are placed a save reads
// its history from the DRAM tier's bytes. Every save stays exact: a scheduler without
// resident reuse continues from the last one.
TEST(StoreIntegration, ALongResidentConversationSavesExactEntries) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  store::testing::Gate gate;
  auto store = OpenStore(*e, 64 << 20, "", gate.Hook());
  store::testing::Gate::ReleaseAtExit release{&gate};
  std::vector<int32_t> prompt = *e->Tokenize("Lily had a red ball. She", true);
  {
    Scheduler s(*e, SchedulerOptions{});
    s.set_store(store.get());
    gate.Hold();
    ASSERT_TRUE(RunTurn(s, prompt, "conv", 6).finished);
    const int kHeld = 10, kPlaced = 3;  // turns while the writer is held, then after
    for (int turn = 2; turn <= kHeld + kPlaced; ++turn) {
      if (turn == kHeld + 1) {
        gate.Release();
        store->Flush();
      }
      std::vector<int32_t> next = NextTurn(*e, prompt, 6, " Then she ran.");
      Turn t = RunTurn(s, next, "conv", 6);
      ASSERT_TRUE(t.finished);
      EXPECT_EQ(t.usage.cached_tokens, static_cast<int>(prompt.size()) + 6 - 1) << "turn " << turn;
      EXPECT_EQ(t.text, Recompute(*e, next, 6)) << "turn " << turn;
      if (turn > kHeld) store->Flush();  // placed before the next turn ends
      prompt = std::move(next);
    }
    EXPECT_EQ(s.Stats().kv.Value<store::KvLoadStats>().loads, 0u);  // every turn reused resident KV
    s.Shutdown();
  }
  store->Flush();
  Scheduler s2(*e, NoResident());
  s2.set_store(store.get());
  std::vector<int32_t> last = NextTurn(*e, prompt, 6, " The end.");
  Turn t = RunTurn(s2, last, "conv", 6);
  EXPECT_EQ(t.usage.cached_tokens, static_cast<int>(prompt.size()) + 6 - 1);
  EXPECT_EQ(t.text, Recompute(*e, last, 6));
}

// Decoupled truncation (paper 3.4): an overflowing conversation drops its oldest tokens
// (after a kept head) in the stored KV instead of being rejected or recomputed, and the
// drop is sticky so the next turn reuses nearly everything again.
TEST(StoreIntegration, OverflowTruncatesStoredKvInsteadOfRecomputing) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  auto store = OpenStore(*e, 64 << 20);
  SchedulerOptions o = NoResident();
  KvFeatureOptions fo;
  fo.truncate_ratio = 0.5;
  fo.truncate_keep_first = 4;
  o.kv_connector = KvFeatures(fo);
  Scheduler s(*e, o);
  s.set_store(store.get());
  const int ctx = e->context_length();
  std::string story = "Once upon a time, there was a little dog named Max. Max liked to run in the park. ";
  std::vector<int32_t> first = *e->Tokenize(story, true);
  while (static_cast<int>(first.size()) < ctx * 3 / 4) {
    auto more = *e->Tokenize(story, false);
    first.insert(first.end(), more.begin(), more.end());
  }
  Turn a = RunTurn(s, first, "long", 16);
  EXPECT_EQ(a.usage.cached_tokens, 0);
  // Turn 2 overflows the window.
  std::vector<int32_t> second = NextTurn(*e, first, 16, " One day Max met a cat. The cat was very nice and " 
                                         "they played together all day long in the sun.");
  while (static_cast<int>(second.size()) <= ctx + 20) second.push_back(second[second.size() - 30]);
  ASSERT_GT(static_cast<int>(second.size()), ctx);
  Turn b = RunTurn(s, second, "long", 16);
  EXPECT_LT(b.usage.prompt_tokens, ctx);
  EXPECT_GT(b.usage.cached_tokens, 0);
  // Turn 3 extends the full history again: the earlier drop is reused.
  std::vector<int32_t> third = second;
  {
    store->Flush();
    auto toks = store->SessionTokens("default", "long");
    ASSERT_TRUE(toks.ok());
    EXPECT_LT(static_cast<int>(toks->size()), ctx);
  }
  auto more = *e->Tokenize(" The end.", false);
  third.insert(third.end(), more.begin(), more.end());
  Turn c = RunTurn(s, third, "long", 8);
  EXPECT_LT(c.usage.prompt_tokens, ctx);
  EXPECT_GE(c.usage.cached_tokens, b.usage.prompt_tokens - 8) << "prompt " << c.usage.prompt_tokens;
  // TT (truncate, then recompute): the same tokens are dropped, nothing stored is
  // reused, and the answer is exactly that of prefilling the truncated prompt afresh.
  {
    auto tt_store = OpenStore(*e, 64 << 20);
    SchedulerOptions tto = o;
    KvFeatureOptions tt_fo = fo;
    tt_fo.truncate_recompute = true;
    tto.kv_connector = KvFeatures(tt_fo);
    Scheduler tt(*e, tto);
    tt.set_store(tt_store.get());
    RunTurn(tt, first, "long", 16);
    Turn tb = RunTurn(tt, second, "long", 16);
    EXPECT_EQ(tb.usage.prompt_tokens, b.usage.prompt_tokens);
    EXPECT_EQ(tb.usage.cached_tokens, 0);
    // The kept tokens: the first 4, then the tail of the prompt.
    std::vector<int32_t> kept(second.begin(), second.begin() + 4);
    kept.insert(kept.end(), second.end() - (tb.usage.prompt_tokens - 4), second.end());
    EXPECT_EQ(tb.text, Recompute(*e, kept, 16));
  }
  // Without truncation the same prompt is rejected.
  Scheduler plain(*e, NoResident());
  GenerationRequest req;
  req.prompt = third;
  EXPECT_EQ(plain.Submit(std::move(req)).status().code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace attic::engine

namespace attic::engine {
namespace {

// Every way stored KV can enter the compute buffer -- entered whole before the step
// (sync), layer by layer by the loader thread while the step computes (layerwise), and
// fetched ahead by the read buffer while earlier jobs run -- gives the same tokens as
// recomputing the whole prompt, with an f32 or an f16 compute buffer (stored K is f32
// pre-RoPE either way; entering rounds it exactly as computing it does).
class PreloadModes : public ::testing::TestWithParam<std::tuple<store::Preload, int64_t, DType>> {};

TEST_P(PreloadModes, QueuedNextTurnsEqualRecompute) {
  auto e = LoadStories(std::get<2>(GetParam()));
  ASSERT_NE(e, nullptr);
  auto store = OpenStore(*e, 64 << 20);
  SchedulerOptions o = NoResident();
  o.max_running = 1;  // one job at a time: the read buffer fetches the next ones ahead
  KvFeatureOptions fo;
  fo.kv_preload = std::get<0>(GetParam());
  fo.kv_read_buffer_bytes = std::get<1>(GetParam());
  o.kv_connector = KvFeatures(fo);
  Scheduler s(*e, o);
  s.set_store(store.get());
  const std::vector<std::string> starts = {"Lily had a red ball. She", "Tom saw a big tree in the park.",
                                           "Once upon a time, there was a cat.", "The sun was hot and the sky"};
  std::vector<std::vector<int32_t>> next;
  for (size_t i = 0; i < starts.size(); ++i) {
    std::vector<int32_t> first = *e->Tokenize(starts[i], true);
    RunTurn(s, first, "s" + std::to_string(i), 12);
    next.push_back(NextTurn(*e, first, 12, " They played all day."));
  }
  store->Flush();
  // Queue every next turn at once, then drain.
  std::vector<TurnSpec> specs;
  for (size_t i = 0; i < next.size(); ++i) specs.push_back({next[i], "s" + std::to_string(i), 12});
  const std::vector<Turn> turns = RunTurns(s, specs);
  size_t done = 0;
  for (const Turn& t : turns) done += t.finished ? 1 : 0;
  ASSERT_EQ(done, next.size());
  for (size_t i = 0; i < next.size(); ++i) {
    EXPECT_GT(turns[i].usage.cached_tokens, 0) << i;
    EXPECT_EQ(turns[i].text, Recompute(*e, next[i], 12)) << i;
  }
  const store::KvLoadStats ls = s.Stats().kv.Value<store::KvLoadStats>();
  EXPECT_EQ(ls.loads, next.size());
  EXPECT_EQ(ls.layerwise_loads, fo.kv_preload != store::Preload::kSync ? next.size() : 0u);
  if (fo.kv_read_buffer_bytes != 0) {
    EXPECT_GT(ls.staged_used, 0u);  // later jobs were fetched while earlier ones ran
  } else {
    EXPECT_EQ(ls.staged, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(StoreIntegration, PreloadModes,
                         ::testing::Values(std::make_tuple(store::Preload::kSync, int64_t{0}, DType::kF32),
                                           std::make_tuple(store::Preload::kLayerwise, int64_t{0}, DType::kF32),
                                           std::make_tuple(store::Preload::kLayerwise, int64_t{256} << 20, DType::kF32),
                                           std::make_tuple(store::Preload::kInline, int64_t{0}, DType::kF32),
                                           std::make_tuple(store::Preload::kInline, int64_t{256} << 20, DType::kF32),
                                           std::make_tuple(store::Preload::kSync, int64_t{256} << 20, DType::kF32),
                                           std::make_tuple(store::Preload::kSync, int64_t{0}, DType::kF16),
                                           std::make_tuple(store::Preload::kLayerwise, int64_t{256} << 20, DType::kF16),
                                           std::make_tuple(store::Preload::kInline, int64_t{0}, DType::kF16)));

// A request cancelled while its stored KV is still being entered frees its blocks only
// after the loader is done with them (no write into blocks another sequence owns).
TEST(StoreIntegration, CancelWhileLoadingIsSafe) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  for (store::Preload mode : {store::Preload::kLayerwise, store::Preload::kInline, store::Preload::kSync}) {
    SCOPED_TRACE(static_cast<int>(mode));
    auto store = OpenStore(*e, 64 << 20);
    SchedulerOptions o = NoResident();
    KvFeatureOptions fo;
    fo.kv_preload = mode;
    o.kv_connector = KvFeatures(fo);
    Scheduler s(*e, o);
    s.set_store(store.get());
    std::vector<int32_t> first = *e->Tokenize("Lily had a red ball. She", true);
    RunTurn(s, first, "conv", 20);
    store->Flush();
    std::vector<int32_t> second = NextTurn(*e, first, 20, " Then they went home.");
    for (int i = 0; i < 20; ++i) {
      auto c = SubmitTurn(s, {second, "conv", 4});
      ASSERT_NE(c, nullptr);
      c->Cancel();  // cancelled before (or right after) admission
      for (int k = 0; k < 3; ++k) s.Step();
    }
    // The store's entry and later turns are intact.
    Turn b = RunTurn(s, second, "conv", 20);
    EXPECT_EQ(b.text, Recompute(*e, second, 20));
  }
}

// Every store type enters every compute-buffer type (docs/store.md "Which type is
// stored"): a conversation's second turn reuses its first turn's entry from DRAM, an
// entry holds KvRowBytes of its type a row (q8_0: 8 int8 values and one f16 scale per
// group of head_dim 8 = 12 bytes of stories260K's 8-value heads, q4_0: 4 bytes of codes
// and one scale = 6, against f16's 16), and the greedy tokens of the second turn are
// recompute's for an f32 store (exact whatever the buffer: entering rotates and rounds
// f32 pre-RoPE K as the forward does). For f16 and quantized entries the tokens may part
// from recompute's; how many agree is printed (the fidelity figure docs/store.md
// reports), not asserted.
// The quantized entries' rows are checked against the f32 entry's (the forward's own
// pre-RoPE K and V): q8_0 each value within half its group's step d of the f32 one, d =
// f16(max|x| / 127) <= max|x| / 127 * (1 + 2^-11), plus the f32 rounding of x / d (127 d
// 2^-24) -- the bound kv_q8.h gives; q4_0 within |d'| (1 + 2^-7), |d'| = |f16(m / -8)| <=
// max|x| / 8 * (1 + 2^-11) -- kv_q4.h's bound.
TEST(StoreIntegration, EveryStoreTypeEntersEveryBufferType) {
  // The first prompt of this file's tests, then golden_reference.json's (not chosen for
  // how they come out).
  const char* kPrompts[] = {"Lily had a red ball. She", "Zoo", "Once upon a time, there was a little dog",
                            "Lily and Tom went to the park. They"};
  constexpr int kNew = 40;
  constexpr size_t kTypes = std::size(store::kKvDtypes);
  struct Buffer {
    DType k, v;
    std::string name;
  };
  const Buffer kBuffers[] = {{DType::kF32, DType::kF32, "f32"},
                             {DType::kF16, DType::kF16, "f16"},
                             {DType::kQ8_0, DType::kQ8_0, "q8_0"},
                             {DType::kQ4_0, DType::kQ4_0, "q4_0"},
                             {DType::kQ8_0, DType::kQ4_0, "q8_0/q4_0"}};
  for (const Buffer& buffer : kBuffers) {
    SCOPED_TRACE(buffer.name + " buffer");
    auto e = LoadStories(buffer.k, buffer.v);
    ASSERT_NE(e, nullptr);
    const kv::KvShape& shape = e->kv_pool().shape();
    const int group = attention::KvQ8Group(shape.head_dim);
    store::KvEntry rows[kTypes];  // the first prompt's entries, by store type
    size_t agree_sum[kTypes] = {}, total_sum[kTypes] = {};
    for (const char* prompt : kPrompts) {
      SCOPED_TRACE(prompt);
      std::vector<int32_t> first = *e->Tokenize(prompt, true);
      int n_reply = 0;
      std::vector<int32_t> second = NextTurn(*e, first, 20, " Then they went home.", &n_reply);
      const std::string want = Recompute(*e, second, kNew);
      const std::vector<int32_t> want_tokens = *e->Tokenize(want, false);
      const uint64_t n_tokens = first.size() + n_reply - 1;  // the reply's last token was not fed
      for (store::KvDtype dt : store::kKvDtypes) {
        SCOPED_TRACE(std::string(store::KvDtypeName(dt)) + " store");
        auto store = OpenStore(*e, 64 << 20, "", nullptr, dt);
        Scheduler s(*e, NoResident());
        s.set_store(store.get());
        RunTurn(s, first, "conv", 20);
        store->Flush();
        auto info = store->GetSession("default", "conv");
        ASSERT_TRUE(info.ok());
        EXPECT_TRUE(store::EntryKeyHasDtype(info->key, dt)) << info->key;
        const int g = store::KvDtypeQuantized(dt) ? group : 0;
        if (dt == store::KvDtype::kKivi4) {
          // K: kv_dim / 2 bytes of codes a row, and per group of up to 128 tokens kv_dim f16
          // scales and kv_dim f16 minimums; V's rows q4_0 (codes, then an f16 scale a group).
          const uint64_t groups = (n_tokens + 127) / 128, kvd = shape.kv_dim();
          EXPECT_EQ(info->bytes,
                    4096 + shape.n_layers * (n_tokens * (kvd / 2 + kvd / 2 + 2 * kvd / g) + groups * 4 * kvd));
        } else {
          const size_t row = store::KvRowBytes(store::KvTensorDtype(dt, false), shape.kv_dim(), g) +
                             store::KvRowBytes(store::KvTensorDtype(dt, true), shape.kv_dim(), g);  // K's and V's
          EXPECT_EQ(info->bytes, 4096 + 1ull * shape.n_layers * n_tokens * row);
        }
        auto entry = store->Load(info->key);
        ASSERT_TRUE(entry.ok()) << entry.status().ToString();
        EXPECT_EQ(entry->group, store::KvDtypeQuantized(dt) ? group : 0);
        if (prompt == kPrompts[0]) rows[static_cast<int>(dt)] = std::move(*entry);
        Turn b = RunTurn(s, second, "conv", kNew);
        EXPECT_EQ(b.usage.cached_tokens, static_cast<int>(n_tokens));
        const std::vector<int32_t> got = *e->Tokenize(b.text, false);
        size_t agree = 0;
        while (agree < got.size() && agree < want_tokens.size() && got[agree] == want_tokens[agree]) ++agree;
        agree_sum[static_cast<int>(dt)] += agree;
        total_sum[static_cast<int>(dt)] += want_tokens.size();
        if (dt == store::KvDtype::kF32) {
          EXPECT_EQ(b.text, want);
        }
        s.Shutdown();
      }
    }
    for (store::KvDtype dt : store::kKvDtypes)
      std::printf("[ fidelity ] %s buffer, %s store: second turns from the entries of %zu prompts: %zu of %zu greedy "
                  "tokens agree with recompute (the common prefix of each)\n",
                  buffer.name.c_str(), store::KvDtypeName(dt), std::size(kPrompts), agree_sum[static_cast<int>(dt)],
                  total_sum[static_cast<int>(dt)]);
    // The quantized entries against the f32 one (the same forward's K and V).
    const store::KvEntry& f32 = rows[static_cast<int>(store::KvDtype::kF32)];
    const int kvd = shape.kv_dim();
    std::vector<float> y(kvd);
    for (store::KvDtype dt : {store::KvDtype::kQ8_0, store::KvDtype::kQ4_0, store::KvDtype::kQ8_0Q4_0}) {
      SCOPED_TRACE(std::string(store::KvDtypeName(dt)) + " entry against the f32 one");
      const store::KvEntry& q = rows[static_cast<int>(dt)];
      ASSERT_EQ(q.n_tokens(), f32.n_tokens());
      for (int l = 0; l < f32.n_layers; ++l)
        for (int r = 0; r < f32.n_tokens(); ++r)
          for (bool k : {true, false}) {
            const float* x = k ? f32.k_row(l, r) : f32.v_row(l, r);
            // The row's type: q8_0/q4_0 holds K in q8_0 and V in q4_0.
            const store::KvDtype rt = dt != store::KvDtype::kQ8_0Q4_0 ? dt
                                      : k                              ? store::KvDtype::kQ8_0
                                                                       : store::KvDtype::kQ4_0;
            store::DequantizeRow(rt, reinterpret_cast<const uint8_t*>(k ? q.k_row_bytes(l, r) : q.v_row_bytes(l, r)),
                                 kvd, group, y.data());
            for (int j = 0; j < kvd; ++j) {
              double amax = 0;
              for (int i = j / group * group; i < (j / group + 1) * group; ++i)
                amax = std::max(amax, std::fabs(double{x[i]}));
              double tol;
              if (rt == store::KvDtype::kQ8_0) {
                const double d = amax / 127 * (1 + std::ldexp(1.0, -11));
                tol = d / 2 + 127 * d * std::ldexp(1.0, -24);
              } else {
                tol = amax / 8 * (1 + std::ldexp(1.0, -11)) * (1 + std::ldexp(1.0, -7));
              }
              ASSERT_LE(std::fabs(double{y[j]} - x[j]), tol)
                  << (k ? "K" : "V") << " layer " << l << " row " << r << " value " << j;
            }
          }
    }
    // kivi4's K against the f32 entry's: each channel within half its group's step (the
    // group: up to 128 tokens; its step: the channel's range over the group / 15, f16
    // rounded: store_test_util.h's Kivi4KBound derives the bound), plus the f16 rounding
    // of the minimum; V is q4_0 (checked above for the q4_0 entry).
    const store::KvEntry& kivi = rows[static_cast<int>(store::KvDtype::kKivi4)];
    ASSERT_EQ(kivi.n_tokens(), f32.n_tokens());
    const std::vector<int32_t> ends = kivi.KGroupEnds();
    EXPECT_EQ(ends.back(), f32.n_tokens());
    for (int l = 0; l < f32.n_layers; ++l) {
      int first = 0;
      for (int32_t end : ends) {
        for (int c = 0; c < kvd; ++c) {
          double lo = INFINITY, hi = -INFINITY;
          for (int r = first; r < end; ++r) {
            lo = std::min(lo, double{f32.k_row(l, r)[c]});
            hi = std::max(hi, double{f32.k_row(l, r)[c]});
          }
          const double tol = store::testing::Kivi4KBound(lo, hi);
          for (int r = first; r < end; ++r) {
            kivi.KRowF32(l, r, y.data());
            ASSERT_LE(std::fabs(double{y[c]} - f32.k_row(l, r)[c]), tol) << "kivi4 K layer " << l << " row " << r;
          }
        }
        first = end;
      }
    }
  }
}

}  // namespace
}  // namespace attic::engine
