// Scheduler: continuous batching must give every request exactly what it gets alone
// (Session::Generate is the reference), chunked prefill must not stall decoding streams,
// the queue is bounded and visible, admission respects the KV budget, resident KV is
// reused within a tenant only, and cancellation / timeouts end requests cleanly.
#include <gtest/gtest.h>

#include <thread>

#include "attic/engine/scheduler.h"
#include "test_util.h"

namespace attic::engine {
namespace {

using attic::testing::SharedDir;
using namespace std::chrono_literals;

std::unique_ptr<Engine> LoadStories(int max_batch_tokens, int64_t kv_bytes) {
  EngineOptions o;
  o.model_path = SharedDir() + "/models/stories260K-hf";
  o.n_threads = 2;
  o.max_batch_tokens = max_batch_tokens;
  o.kv_cache_bytes = kv_bytes;
  o.kv_block_size = 16;  // the budget tests below count in blocks of 16 tokens
  auto e = Engine::Load(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

struct Outcome {
  std::string text;
  std::string finish_reason;
  TokenUsage usage;
  Status status;
  bool ended = false;
  int end_step = -1;
};

// Drains every channel without blocking; records the step at which each ended.
void Drain(std::vector<std::shared_ptr<ResultChannel>>& chans, std::vector<Outcome>& out, int step) {
  for (size_t i = 0; i < chans.size(); ++i) {
    GenerationEvent ev;
    while (chans[i]->Pop(&ev, 0ms)) {
      if (ev.kind == GenerationEvent::Kind::kText) {
        out[i].text += ev.text;
      } else {
        out[i].ended = true;
        out[i].end_step = step;
        out[i].finish_reason = ev.finish_reason;
        out[i].usage = ev.usage;
        out[i].status = ev.status;
      }
    }
  }
}

bool AllEnded(const std::vector<Outcome>& out) {
  for (const auto& o : out) {
    if (!o.ended) return false;
  }
  return true;
}

std::vector<Outcome> RunToCompletion(Scheduler& s, std::vector<std::shared_ptr<ResultChannel>>& chans,
                                     int max_steps = 5000) {
  std::vector<Outcome> out(chans.size());
  for (int step = 0; step < max_steps && !AllEnded(out); ++step) {
    s.Step();
    Drain(chans, out, step);
  }
  return out;
}

GenerationResult Alone(Engine& e, const std::vector<int32_t>& prompt, const SamplingParams& p) {
  Session s(e);
  auto r = s.Generate(prompt, p);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : GenerationResult{};
}

std::vector<int32_t> Tok(Engine& e, const std::string& text) { return *e.Tokenize(text, true); }

const char* kPrompts[] = {
    "Once upon a time, there was a little dog named Max.",
    "Lily went to the park",
    "The sun was shining and the birds were singing. Tom wanted to play outside with his friends, but",
    "One day",
    "Sara had a big red ball. She liked to",
    "There was a tree",
    "The cat and the mouse were friends. Every morning they would",
    "Ben",
};

TEST(Scheduler, BatchedGreedyOutputsEqualEachRequestAlone) {
  // max_batch_tokens 24 forces the longer prompts through several prefill chunks,
  // mixed into the same steps as other sequences' decode tokens.
  auto e = LoadStories(24, 8 << 20);
  ASSERT_NE(e, nullptr);
  SamplingParams p;
  p.max_tokens = 40;
  std::vector<GenerationResult> ref;
  for (const char* text : kPrompts) ref.push_back(Alone(*e, Tok(*e, text), p));

  SchedulerOptions so;
  so.max_running = 8;
  Scheduler s(*e, so);
  std::vector<std::shared_ptr<ResultChannel>> chans;
  for (const char* text : kPrompts) {
    GenerationRequest req;
    req.prompt = Tok(*e, text);
    req.sampling = p;
    auto ch = s.Submit(std::move(req));
    ASSERT_TRUE(ch.ok()) << ch.status().ToString();
    chans.push_back(*ch);
  }
  auto out = RunToCompletion(s, chans);
  for (size_t i = 0; i < chans.size(); ++i) {
    SCOPED_TRACE(kPrompts[i]);
    ASSERT_TRUE(out[i].ended);
    EXPECT_TRUE(out[i].status.ok()) << out[i].status.ToString();
    EXPECT_EQ(out[i].text, ref[i].text);
    EXPECT_EQ(out[i].finish_reason, ref[i].finish_reason);
    EXPECT_EQ(out[i].usage.prompt_tokens, ref[i].n_prompt_tokens);
    int stop_token = ref[i].finish_reason == "stop" ? 1 : 0;
    EXPECT_EQ(out[i].usage.completion_tokens, static_cast<int>(ref[i].tokens.size()) + stop_token);
    EXPECT_EQ(out[i].usage.cached_tokens, 0);
  }
  auto st = s.Stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
}

TEST(Scheduler, StopStringsAndSamplingMatchSessionAlone) {
  auto e = LoadStories(64, 8 << 20);
  ASSERT_NE(e, nullptr);
  std::vector<SamplingParams> params(3);
  params[0].max_tokens = 60;
  params[0].stop_strings = {".", "!"};
  params[1].max_tokens = 50;
  params[1].temperature = 0.8f;
  params[1].top_p = 0.9f;
  params[1].seed = 42;
  params[2].max_tokens = 30;
  params[2].stop_strings = {" the"};
  std::vector<int32_t> prompt = Tok(*e, "Once upon a time");
  std::vector<GenerationResult> ref;
  for (const auto& p : params) ref.push_back(Alone(*e, prompt, p));
  Scheduler s(*e, SchedulerOptions{});
  std::vector<std::shared_ptr<ResultChannel>> chans;
  for (const auto& p : params) {
    GenerationRequest req;
    req.prompt = prompt;
    req.sampling = p;
    req.tenant = "t" + std::to_string(chans.size());  // no reuse between them
    chans.push_back(*s.Submit(std::move(req)));
  }
  auto out = RunToCompletion(s, chans);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(out[i].text, ref[i].text) << i;
    EXPECT_EQ(out[i].finish_reason, ref[i].finish_reason) << i;
  }
  EXPECT_EQ(out[0].finish_reason, "stop");
}

TEST(Scheduler, LongPrefillIsChunkedAndDecodersAdvanceEveryStep) {
  auto e = LoadStories(32, 8 << 20);
  ASSERT_NE(e, nullptr);
  Scheduler s(*e, SchedulerOptions{});
  std::vector<std::shared_ptr<ResultChannel>> chans;
  SamplingParams p;
  p.max_tokens = 20;
  for (const char* text : {"One day", "Lily went to the park", "Ben"}) {
    GenerationRequest req;
    req.prompt = Tok(*e, text);
    req.sampling = p;
    req.ignore_eos = true;  // exactly max_tokens tokens each
    chans.push_back(*s.Submit(std::move(req)));
  }
  std::vector<Outcome> out(chans.size());
  // One step prefills all three short prompts (their first tokens come from it).
  ASSERT_GT(s.Step(), 0);
  Drain(chans, out, 0);
  ASSERT_EQ(s.Stats().prefilling, 0);
  // A 480-token prompt arrives: with 32 rows per step and 3 of them decoding it needs
  // 17 steps, during which the decoders must keep producing one token per step.
  std::vector<int32_t> long_prompt;
  while (long_prompt.size() < 480) {
    auto more = *e->Tokenize(" The little girl saw a big dog in the garden and smiled.", false);
    long_prompt.insert(long_prompt.end(), more.begin(), more.end());
  }
  long_prompt.resize(480);
  GenerationRequest lr;
  lr.prompt = long_prompt;
  lr.sampling.max_tokens = 1;
  chans.push_back(*s.Submit(std::move(lr)));
  out.emplace_back();
  for (int step = 1; step < 100 && !AllEnded(out); ++step) {
    int rows = s.Step();
    EXPECT_LE(rows, 32);
    Drain(chans, out, step);
  }
  ASSERT_TRUE(AllEnded(out));
  // Tokens 2..20 of each decoder come from steps 1..19, without any pause.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].end_step, 19) << i;
    EXPECT_EQ(out[i].usage.completion_tokens, 20);
  }
  EXPECT_GE(out[3].end_step, 17);  // the long prompt really was split over many steps
}

TEST(Scheduler, QueueIsBoundedAndLookAheadShowsWaitingRequestsInOrder) {
  auto e = LoadStories(64, 8 << 20);
  ASSERT_NE(e, nullptr);
  SchedulerOptions so;
  so.max_running = 1;
  so.max_waiting = 3;
  Scheduler s(*e, so);
  std::vector<std::shared_ptr<ResultChannel>> chans;
  auto submit = [&](const std::string& text, const std::string& session) {
    GenerationRequest req;
    req.prompt = Tok(*e, text);
    req.session_id = session;
    req.tenant = "acme";
    req.sampling.max_tokens = 5;
    return s.Submit(std::move(req));
  };
  chans.push_back(*submit("One day", "s0"));
  s.Step();  // admits the first
  EXPECT_EQ(s.Stats().running, 1);
  for (int i = 1; i <= 3; ++i) {
    auto ch = submit(kPrompts[i], "s" + std::to_string(i));
    ASSERT_TRUE(ch.ok());
    chans.push_back(*ch);
  }
  auto full = submit("Ben", "s4");
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  auto view = s.LookAhead(2);
  ASSERT_EQ(view.size(), 2u);
  EXPECT_EQ(view[0].session_id, "s1");
  EXPECT_EQ(view[1].session_id, "s2");
  EXPECT_EQ(view[0].tenant, "acme");
  EXPECT_LT(view[0].id, view[1].id);
  EXPECT_EQ(*view[0].prompt, Tok(*e, kPrompts[1]));
  EXPECT_EQ(*view[1].prompt, Tok(*e, kPrompts[2]));
  EXPECT_EQ(s.LookAhead(10).size(), 3u);
  EXPECT_EQ(s.Stats().waiting, 3);
  auto out = RunToCompletion(s, chans);
  EXPECT_TRUE(AllEnded(out));
  // FCFS with one running slot: they end in submission order.
  for (size_t i = 1; i < out.size(); ++i) EXPECT_GT(out[i].end_step, out[i - 1].end_step);
  EXPECT_TRUE(s.LookAhead(10).empty());
}

TEST(Scheduler, ReusesResidentPrefixWithinATenantOnlyAndStaysExact) {
  auto e = LoadStories(64, 8 << 20);
  ASSERT_NE(e, nullptr);
  Scheduler s(*e, SchedulerOptions{});
  SamplingParams p;
  p.max_tokens = 24;
  std::vector<int32_t> first = Tok(*e, "Once upon a time, there was a little dog named Max. Max liked to run.");
  auto run_one = [&](const std::string& tenant, const std::vector<int32_t>& prompt) {
    GenerationRequest req;
    req.prompt = prompt;
    req.sampling = p;
    req.tenant = tenant;
    std::vector<std::shared_ptr<ResultChannel>> chans{*s.Submit(std::move(req))};
    return RunToCompletion(s, chans)[0];
  };
  Outcome a = run_one("alice", first);
  EXPECT_EQ(a.usage.cached_tokens, 0);
  // The next turn extends the first prompt.
  std::vector<int32_t> second = first;
  auto more = *e->Tokenize(" One day, Max saw a cat.", false);
  second.insert(second.end(), more.begin(), more.end());
  Outcome b = run_one("alice", second);
  EXPECT_GE(b.usage.cached_tokens, static_cast<int>(first.size()));
  EXPECT_LT(b.usage.cached_tokens, static_cast<int>(second.size()));
  EXPECT_EQ(b.text, Alone(*e, second, p).text);  // reuse is exact
  // Another tenant never sees alice's KV.
  Outcome c = run_one("bob", second);
  EXPECT_EQ(c.usage.cached_tokens, 0);
  EXPECT_EQ(c.text, b.text);
  // Bob now has his own resident copy.
  Outcome d = run_one("bob", second);
  EXPECT_EQ(d.usage.cached_tokens, static_cast<int>(second.size()) - 1);
  EXPECT_EQ(d.text, b.text);
}

TEST(Scheduler, NextTurnAdoptsTheResidentSequence) {
  auto e = LoadStories(64, 8 << 20);
  ASSERT_NE(e, nullptr);
  Scheduler s(*e, SchedulerOptions{});
  SamplingParams p;
  p.max_tokens = 20;
  std::vector<int32_t> first = Tok(*e, "Lily had a red ball. She");
  GenerationResult ref = Alone(*e, first, p);  // the reply's token ids
  ASSERT_EQ(ref.tokens.size(), 20u);
  auto run = [&](const std::vector<int32_t>& prompt, const std::string& session) {
    GenerationRequest req;
    req.prompt = prompt;
    req.sampling = p;
    req.session_id = session;
    std::vector<std::shared_ptr<ResultChannel>> chans{*s.Submit(std::move(req))};
    return RunToCompletion(s, chans)[0];
  };
  Outcome a = run(first, "conv");
  EXPECT_EQ(a.text, ref.text);
  EXPECT_EQ(s.Stats().resident_sequences, 1);
  // Turn 2 = turn 1 + its reply + more: everything that was computed is reused (the last
  // reply token was sampled but never fed), and the resident sequence is adopted.
  std::vector<int32_t> second = first;
  second.insert(second.end(), ref.tokens.begin(), ref.tokens.end());
  auto more = *e->Tokenize(" Then they went home.", false);
  second.insert(second.end(), more.begin(), more.end());
  Outcome b = run(second, "conv");
  EXPECT_EQ(b.usage.cached_tokens, static_cast<int>(first.size() + ref.tokens.size()) - 1);
  EXPECT_EQ(b.text, Alone(*e, second, p).text);
  EXPECT_EQ(s.Stats().resident_sequences, 1);  // adopted, then retired again
}

TEST(Scheduler, AdmissionWaitsForTheKvBudget) {
  // 12 blocks of 16 tokens; each request may need 20 + 79 slots = 7 blocks, so only one
  // fits at a time.
  auto e0 = LoadStories(64, 8 << 20);
  ASSERT_NE(e0, nullptr);
  const int64_t block_bytes = e0->kv_pool().shape().block_bytes();
  e0.reset();
  auto e = LoadStories(64, 12 * block_bytes);
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->kv_pool().n_blocks(), 12);
  SamplingParams p;
  p.max_tokens = 80;
  std::vector<int32_t> pa = Tok(*e, kPrompts[2]), pb = Tok(*e, kPrompts[6]);
  auto ra = Alone(*e, pa, p), rb = Alone(*e, pb, p);
  Scheduler s(*e, SchedulerOptions{});
  std::vector<std::shared_ptr<ResultChannel>> chans;
  for (auto* pr : {&pa, &pb}) {
    GenerationRequest req;
    req.prompt = *pr;
    req.sampling = p;
    req.tenant = "t" + std::to_string(chans.size());
    chans.push_back(*s.Submit(std::move(req)));
  }
  std::vector<Outcome> out(2);
  bool saw_one_waiting = false;
  for (int step = 0; step < 1000 && !AllEnded(out); ++step) {
    s.Step();
    auto st = s.Stats();
    EXPECT_LE(st.running, 1);
    EXPECT_LE(st.kv_blocks_used, 12);
    if (st.running == 1 && st.waiting == 1) saw_one_waiting = true;
    Drain(chans, out, step);
  }
  ASSERT_TRUE(AllEnded(out));
  EXPECT_TRUE(saw_one_waiting);
  EXPECT_EQ(out[0].text, ra.text);
  EXPECT_EQ(out[1].text, rb.text);
  EXPECT_LT(out[0].end_step, out[1].end_step);
}

TEST(Scheduler, ResidentKvIsEvictedLruWhenBlocksAreNeeded) {
  auto e0 = LoadStories(64, 8 << 20);
  const int64_t block_bytes = e0->kv_pool().shape().block_bytes();
  e0.reset();
  auto e = LoadStories(64, 10 * block_bytes);
  ASSERT_NE(e, nullptr);
  Scheduler s(*e, SchedulerOptions{});
  SamplingParams p;
  p.max_tokens = 40;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest req;
    req.prompt = Tok(*e, kPrompts[i]);
    req.sampling = p;
    std::vector<std::shared_ptr<ResultChannel>> chans{*s.Submit(std::move(req))};
    auto out = RunToCompletion(s, chans);
    ASSERT_TRUE(out[0].status.ok()) << out[0].status.ToString();
    auto st = s.Stats();
    EXPECT_LE(st.kv_blocks_used, 10);
    EXPECT_EQ(st.kv_blocks_resident, st.kv_blocks_used);
  }
  EXPECT_GT(s.Stats().evicted_sequences, 0u);
}

TEST(Scheduler, CancelEndsARequestAndDeadlinesExpire) {
  auto e = LoadStories(64, 8 << 20);
  ASSERT_NE(e, nullptr);
  Scheduler s(*e, SchedulerOptions{});
  GenerationRequest req;
  req.prompt = Tok(*e, "Once upon a time");
  req.sampling.max_tokens = 200;
  req.ignore_eos = true;
  auto ch = *s.Submit(req);
  for (int i = 0; i < 5; ++i) s.Step();
  EXPECT_EQ(s.Stats().running, 1);
  ch->Cancel();
  s.Step();
  EXPECT_EQ(s.Stats().running, 0);
  GenerationEvent ev;
  while (ch->Pop(&ev, 0ms)) EXPECT_EQ(ev.kind, GenerationEvent::Kind::kText);  // no finish after cancel

  // A deadline in the past: the request fails with DeadlineExceeded (while waiting).
  req.deadline = SchedClock::now();
  auto late = *s.Submit(req);
  s.Step();
  ASSERT_TRUE(late->Pop(&ev, 0ms));
  EXPECT_EQ(ev.kind, GenerationEvent::Kind::kError);
  EXPECT_EQ(ev.status.code(), StatusCode::kDeadlineExceeded);

  // A deadline that passes while running. Not a timing bound: the request's 200 tokens take
  // at least 200 steps of >= 1 ms sleep each, so it cannot finish inside 50 ms however fast
  // the machine; on a slow one the deadline may pass before it runs, also DeadlineExceeded.
  req.deadline = SchedClock::now() + 50ms;
  auto running = *s.Submit(req);
  std::vector<std::shared_ptr<ResultChannel>> chans{running};
  std::vector<Outcome> out(1);
  for (int i = 0; i < 2000 && !out[0].ended; ++i) {
    s.Step();
    std::this_thread::sleep_for(1ms);
    Drain(chans, out, i);
  }
  ASSERT_TRUE(out[0].ended);
  EXPECT_EQ(out[0].status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.Stats().running, 0);
}

TEST(Scheduler, RejectsWhatCanNeverRun) {
  auto e = LoadStories(64, 8 << 20);
  ASSERT_NE(e, nullptr);
  Scheduler s(*e, SchedulerOptions{});
  GenerationRequest req;
  auto r = s.Submit(req);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  req.prompt.assign(513, 100);
  r = s.Submit(req);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  req.prompt = {1, 100000};
  r = s.Submit(req);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  req.prompt = {1, 100};
  req.sampling.top_p = 0;
  r = s.Submit(req);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  req.sampling.top_p = 1;
  s.Shutdown();
  r = s.Submit(req);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace attic::engine
