// Several choices of one request (GenerationRequest::n): the prompt is prefilled once and
// the n sequences fork from it, sharing its KV blocks (copy-on-write). The reference is
// the unforked path: each choice must be exactly what one request alone
// (Session::Generate) samples with that choice's seed -- greedy, all n equal it. Sampled
// choices write different rows into the prompt's last block: a fork that shared it
// instead of copying it, or copied it wrong, changes their tokens (with greedy choices
// the rows written are the same, so only the seeded test can see that).
#include <gtest/gtest.h>

#include <set>

#include "attic/engine/scheduler.h"
#include "stories.h"

namespace attic::engine {
namespace {

using namespace std::chrono_literals;

constexpr int kBlock = 16;

// stories260K (tests/stories.h) with an 8 MiB KV cache in blocks of kBlock.
std::unique_ptr<Engine> LoadStories() {
  EngineOptions o;
  o.max_batch_tokens = 64;
  o.kv_cache_bytes = 8 << 20;
  o.kv_block_size = kBlock;
  return attic::testing::LoadStories(o);
}

struct Choice {
  std::string text;
  std::string finish_reason;
  TokenUsage usage;
  Status status;
  bool ended = false;
};

// Runs the scheduler until every choice of every channel has ended.
std::vector<std::vector<Choice>> RunChoices(Scheduler& s, const std::vector<std::shared_ptr<ResultChannel>>& chans,
                                     const std::vector<int>& n) {
  std::vector<std::vector<Choice>> out(chans.size());
  for (size_t c = 0; c < chans.size(); ++c) out[c].resize(n[c]);
  auto all_ended = [&] {
    for (const auto& v : out)
      for (const auto& x : v)
        if (!x.ended) return false;
    return true;
  };
  for (int step = 0; step < 5000 && !all_ended(); ++step) {
    s.Step();
    for (size_t c = 0; c < chans.size(); ++c) {
      GenerationEvent ev;
      while (chans[c]->Pop(&ev, 0ms)) {
        EXPECT_GE(ev.index, 0);
        EXPECT_LT(ev.index, n[c]);
        Choice& x = out[c][ev.index];
        EXPECT_FALSE(x.ended) << "event after the choice ended";
        if (ev.kind == GenerationEvent::Kind::kText) {
          x.text += ev.text;
        } else {
          x.ended = true;
          x.finish_reason = ev.finish_reason;
          x.usage = ev.usage;
          x.status = ev.status;
          // An error before the fork is the request's only event.
          if (ev.kind == GenerationEvent::Kind::kError && !x.status.ok())
            for (auto& other : out[c]) other.ended = true;
        }
      }
    }
  }
  EXPECT_TRUE(all_ended());
  return out;
}

GenerationResult Alone(Engine& e, const std::vector<int32_t>& prompt, const SamplingParams& p) {
  Session s(e);
  auto r = s.Generate(prompt, p);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : GenerationResult{};
}

// A prompt of exactly n tokens (BOS and story text).
std::vector<int32_t> Prompt(Engine& e, int n) {
  std::vector<int32_t> ids = *e.Tokenize(
      "Once upon a time, there was a little dog named Max. Max liked to run in the park with his friend "
      "Lily. One day they found a big red ball under a tree, and they played with it all afternoon.",
      true);
  EXPECT_GE(static_cast<int>(ids.size()), n);
  ids.resize(n);
  return ids;
}

// Greedy: every choice is the request alone, token for token. Prompts of 27 tokens (the
// last of two blocks partly filled: each choice copies it before writing) and of 32
// (both blocks full: nothing is copied, the choices' first tokens open new blocks).
TEST(Choices, GreedyChoicesEachEqualTheRequestAlone) {
  for (int n_prompt : {27, 32}) {
    SCOPED_TRACE("prompt of " + std::to_string(n_prompt) + " tokens");
    auto e = LoadStories();
    ASSERT_NE(e, nullptr);
    const std::vector<int32_t> prompt = Prompt(*e, n_prompt);
    SamplingParams p;
    p.max_tokens = 40;
    const GenerationResult ref = Alone(*e, prompt, p);
    ASSERT_FALSE(ref.tokens.empty());
    Scheduler s(*e, SchedulerOptions{});
    GenerationRequest req;
    req.prompt = prompt;
    req.sampling = p;
    req.n = 4;
    auto ch = s.Submit(std::move(req));
    ASSERT_TRUE(ch.ok()) << ch.status().ToString();
    auto out = RunChoices(s, {*ch}, {4});
    const int stop_token = ref.finish_reason == "stop" ? 1 : 0;
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE("choice " + std::to_string(i));
      const Choice& c = out[0][i];
      EXPECT_TRUE(c.status.ok()) << c.status.ToString();
      EXPECT_EQ(c.text, ref.text);
      EXPECT_EQ(c.finish_reason, ref.finish_reason);
      EXPECT_EQ(c.usage.completion_tokens, static_cast<int>(ref.tokens.size()) + stop_token);
      // The prompt counts in choice 0's usage only.
      EXPECT_EQ(c.usage.prompt_tokens, i == 0 ? n_prompt : 0);
    }
    const SchedulerStats st = s.Stats();
    // Computed once, not four times.
    EXPECT_EQ(st.prompt_tokens_computed, static_cast<uint64_t>(n_prompt));
    // They decoded together.
    EXPECT_EQ(st.peak_decode_batch, 4);
    // The other choices released their KV: what is left is choice 0's, resident, alone.
    EXPECT_EQ(st.resident_sequences, 1);
    EXPECT_EQ(st.kv_blocks_used, st.kv_blocks_resident);
    const int slots = n_prompt + static_cast<int>(ref.tokens.size()) + stop_token - 1;
    EXPECT_EQ(st.kv_blocks_used, (slots + kBlock - 1) / kBlock);
  }
}

// Sampling: choice i is the request alone seeded ChoiceSeed(seed, i); the choices differ;
// the same request again gives the same choices.
TEST(Choices, SeededChoicesDifferAndAreReproducible) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = Prompt(*e, 21);
  SamplingParams p;
  p.max_tokens = 30;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 42;
  std::vector<std::string> ref;
  for (int i = 0; i < 4; ++i) {
    SamplingParams pi = p;
    pi.seed = ChoiceSeed(p.seed, i);
    ref.push_back(Alone(*e, prompt, pi).text);
  }
  EXPECT_EQ(ChoiceSeed(p.seed, 0), p.seed);  // choice 0 samples what n = 1 samples
  EXPECT_EQ(std::set<std::string>(ref.begin(), ref.end()).size(), 4u) << "the choices should differ";
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    Scheduler s(*e, SchedulerOptions{});
    GenerationRequest req;
    req.prompt = prompt;
    req.sampling = p;
    req.n = 4;
    auto ch = s.Submit(std::move(req));
    ASSERT_TRUE(ch.ok()) << ch.status().ToString();
    auto out = RunChoices(s, {*ch}, {4});
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[0][i].text, ref[i]) << "choice " << i;
    EXPECT_EQ(s.Stats().prompt_tokens_computed, prompt.size());
  }
}

// The admission reserves what n choices can reach, copies of the shared partly filled
// block included: a second request that would not fit beside them waits, and nothing
// runs out of KV mid-generation.
TEST(Choices, AdmissionReservesEveryChoiceAndItsCopy) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  // 27 prompt tokens + up to 20 sampled (the last one never enters the KV): 46 slots,
  // 3 blocks of 16 per choice, of which the prompt's first (full) block is shared:
  // 1 + 4 * 2 = 9 blocks for n = 4. The other request (10 + 20 - 1 = 29 slots) needs 2.
  const std::vector<int32_t> prompt = Prompt(*e, 27);
  e->ResizeKvCache(e->kv_pool().shape().block_bytes() * (9 + 2 - 1));
  ASSERT_EQ(e->kv_pool().n_blocks(), 10);
  SamplingParams p;
  p.max_tokens = 20;
  p.temperature = 1.0f;
  p.seed = 7;
  SchedulerOptions so;
  so.max_resident = 0;  // nothing stays: the budget is the running requests'
  Scheduler s(*e, so);
  GenerationRequest a;
  a.prompt = prompt;
  a.sampling = p;
  a.ignore_eos = true;  // every choice reaches its 46 slots
  a.n = 4;
  GenerationRequest b;
  b.prompt = Prompt(*e, 10);
  b.sampling = p;
  b.ignore_eos = true;
  b.tenant = "other";
  auto ca = s.Submit(std::move(a));
  auto cb = s.Submit(std::move(b));
  ASSERT_TRUE(ca.ok() && cb.ok());
  s.Step();  // admits a (prefilled whole in this step) but not b
  EXPECT_EQ(s.Stats().waiting, 1);
  auto out = RunChoices(s, {*ca, *cb}, {4, 1});
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(out[0][i].status.ok()) << out[0][i].status.ToString();
    EXPECT_EQ(out[0][i].usage.completion_tokens, 20);
  }
  EXPECT_TRUE(out[1][0].status.ok()) << out[1][0].status.ToString();
  EXPECT_EQ(out[1][0].usage.completion_tokens, 20);
  EXPECT_EQ(s.Stats().kv_blocks_used, 0);
}

TEST(Choices, RejectsWhatCannotFork) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  e->ResizeKvCache(e->kv_pool().shape().block_bytes() * 8);
  Scheduler s(*e, SchedulerOptions{});
  auto submit = [&](int n, int max_tokens, std::shared_ptr<LogitsProcessor> processor = nullptr) {
    GenerationRequest req;
    req.prompt = Prompt(*e, 27);
    req.sampling.max_tokens = max_tokens;
    req.n = n;
    req.processor = std::move(processor);
    return s.Submit(std::move(req)).status();
  };
  EXPECT_EQ(submit(0, 5).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(submit(kMaxChoices + 1, 5).code(), StatusCode::kInvalidArgument);
  // 4 choices of up to 46 slots need 9 blocks; the cache holds 8.
  Status too_big = submit(4, 20);
  EXPECT_EQ(too_big.code(), StatusCode::kOutOfRange);
  EXPECT_NE(too_big.message().find("9 KV blocks"), std::string::npos) << too_big.message();
  EXPECT_TRUE(submit(3, 20).ok());  // 1 + 3 * 2 = 7 blocks fit
  struct AnyToken : LogitsProcessor {
    void Apply(float*, int) override {}
    void Accept(int32_t) override {}
    bool Complete() const override { return false; }
  };
  EXPECT_EQ(submit(2, 5, std::make_shared<AnyToken>()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(submit(1, 5, std::make_shared<AnyToken>()).ok());
}

// A full channel coalesces text into the last pending text event of the same choice,
// never into another choice's.
TEST(Choices, AFullChannelCoalescesTextPerChoice) {
  ResultChannel ch(2);
  auto text = [](int index, const std::string& t) {
    GenerationEvent ev;
    ev.index = index;
    ev.text = t;
    return ev;
  };
  ch.Push(text(0, "a"));
  ch.Push(text(1, "b"));
  ch.Push(text(0, "c"));  // full: joins "a"
  ch.Push(text(1, "d"));  // full: joins "b"
  GenerationEvent fin;
  fin.kind = GenerationEvent::Kind::kFinish;
  fin.index = 1;
  ch.Push(fin);
  ch.Push(text(1, "e"));  // the last pending event of choice 1 is its finish: kept apart
  std::vector<std::pair<int, std::string>> got;
  GenerationEvent ev;
  while (ch.Pop(&ev, 0ms)) got.emplace_back(ev.index, ev.kind == GenerationEvent::Kind::kText ? ev.text : "<fin>");
  const std::vector<std::pair<int, std::string>> want = {{0, "ac"}, {1, "bd"}, {1, "<fin>"}, {1, "e"}};
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace attic::engine
