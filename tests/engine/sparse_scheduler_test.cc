// Sparse decoding in the scheduler (paper 004, PQCache; pq/sparse.h): a request's
// selector is attached to its own batch entry only, so that full attention (method
// full, or PQ with a budget of every slot) reproduces a plain request, a sparse request
// batches with plain ones without changing their outputs, a sparse turn's KV is saved to
// the store intact, bad options are refused at Submit, and finished requests'
// statistics reach SchedulerStats.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "attic/engine/kv_features.h"
#include "attic/engine/scheduler.h"
#include "attic/pq/offload.h"
#include "attic/pq/sparse.h"
#include "attic/pq/sparse_planner.h"
#include "attic/store/kv_store.h"
#include "test_util.h"

namespace attic::engine {
namespace {

using attic::testing::SharedDir;
using namespace std::chrono_literals;

std::unique_ptr<Engine> LoadStories(int max_batch_tokens) {
  EngineOptions o;
  o.model_path = SharedDir() + "/models/stories260K-hf";
  o.n_threads = 2;
  o.max_batch_tokens = max_batch_tokens;
  o.kv_cache_bytes = 8 << 20;
  auto e = Engine::Load(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

std::vector<int32_t> Tok(Engine& e, const std::string& text) { return *e.Tokenize(text, true); }

// About 320 tokens of stories260K's vocabulary (its window is 512).
std::string LongText() {
  std::string s;
  const char* parts[] = {
      "Once upon a time, there was a little girl named Lily. She loved to play in the park with her red ball. ",
      "One day, she saw a big dog under a tree. The dog was sad because it had lost its bone. ",
      "Lily wanted to help, so she looked everywhere: by the pond, behind the swings and under the slide. ",
      "At last she found the bone in the sand, and the dog wagged its tail and licked her hand. ",
  };
  for (int i = 0; i < 2; ++i)
    for (const char* p : parts) s += p;
  return s + "The next morning, Lily";
}

std::shared_ptr<const pq::SparseOptions> Sparse(pq::SparseMethod method, double ratio, int count, int min_slots) {
  auto o = std::make_shared<pq::SparseOptions>();
  o->method = method;
  o->ratio = ratio;
  o->count = count;
  o->min_slots = min_slots;
  return o;
}

struct Outcome {
  std::string text;
  std::string finish_reason;
  TokenUsage usage;
  Status status;
  bool ended = false;
};

std::vector<Outcome> RunAll(Scheduler& s, std::vector<std::shared_ptr<ResultChannel>>& chans) {
  std::vector<Outcome> out(chans.size());
  auto all_ended = [&] {
    for (const auto& o : out)
      if (!o.ended) return false;
    return true;
  };
  for (int step = 0; step < 5000 && !all_ended(); ++step) {
    s.Step();
    for (size_t i = 0; i < chans.size(); ++i) {
      GenerationEvent ev;
      while (chans[i]->Pop(&ev, 0ms)) {
        if (ev.kind == GenerationEvent::Kind::kText) {
          out[i].text += ev.text;
        } else {
          out[i].ended = true;
          out[i].finish_reason = ev.finish_reason;
          out[i].usage = ev.usage;
          out[i].status = ev.status;
        }
      }
    }
  }
  return out;
}

GenerationRequest Request(std::vector<int32_t> prompt, int max_tokens,
                          std::shared_ptr<const pq::SparseOptions> sparse = nullptr) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.ignore_eos = true;  // every request decodes max_tokens steps
  if (sparse != nullptr) r.kv_options.Set(std::move(sparse));
  return r;
}

// Submits `reqs` together to a fresh scheduler and runs them to the end.
std::vector<Outcome> RunTogether(Engine& e, std::vector<GenerationRequest> reqs, SchedulerStats* stats = nullptr,
                                 SchedulerOptions so = {}) {
  so.max_running = 8;
  Scheduler s(e, so);
  std::vector<std::shared_ptr<ResultChannel>> chans;
  for (auto& r : reqs) {
    auto ch = s.Submit(std::move(r));
    EXPECT_TRUE(ch.ok()) << ch.status().ToString();
    if (!ch.ok()) return {};
    chans.push_back(*ch);
  }
  auto out = RunAll(s, chans);
  for (const auto& o : out) {
    EXPECT_TRUE(o.ended);
    EXPECT_TRUE(o.status.ok()) << o.status.ToString();
  }
  if (stats != nullptr) *stats = s.Stats();
  return out;
}

// The selectors that, given a budget of every slot, must attend exactly as full attention.
const pq::SparseMethod kEverySlotMethods[] = {pq::SparseMethod::kPq, pq::SparseMethod::kOracle,
                                               pq::SparseMethod::kStreaming, pq::SparseMethod::kH2o};

TEST(SparseScheduler, FullAndSelectorsWithEverySlotEqualAPlainRequest) {
  auto e = LoadStories(256);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = Tok(*e, LongText());
  ASSERT_GT(prompt.size(), 200u);
  constexpr int kTokens = 24;
  const int min_slots = 64;  // below the prompt: every decode step is a sparse one
  const auto plain = RunTogether(*e, {Request(prompt, kTokens)});
  ASSERT_EQ(plain.size(), 1u);
  // In one batch: method full, each selector at ratio 1, and a plain request.
  std::vector<GenerationRequest> reqs;
  reqs.push_back(Request(prompt, kTokens, Sparse(pq::SparseMethod::kFull, 0.2, 0, min_slots)));
  for (pq::SparseMethod m : kEverySlotMethods) reqs.push_back(Request(prompt, kTokens, Sparse(m, 1.0, 0, min_slots)));
  reqs.push_back(Request(prompt, kTokens));
  const size_t n = reqs.size();
  SchedulerStats stats;
  const auto out = RunTogether(*e, std::move(reqs), &stats);
  pq::SparseDecodeStats sparse = stats.kv.Value<pq::SparseDecodeStats>();
  ASSERT_EQ(out.size(), n);
  for (size_t i = 0; i < out.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(out[i].text, plain[0].text);
    EXPECT_EQ(out[i].usage.completion_tokens, kTokens);
    EXPECT_EQ(out[i].usage.prompt_tokens, static_cast<int>(prompt.size()));
  }
  // Only the selectors had an object (full is full attention: no object, no count); each
  // of their decode steps is counted once, and at ratio 1 they attend to every slot.
  const size_t n_selectors = std::size(kEverySlotMethods);
  EXPECT_EQ(sparse.requests.size(), n_selectors);
  for (pq::SparseMethod m : kEverySlotMethods) EXPECT_EQ(sparse.requests[pq::SparseMethodName(m)], 1u);
  EXPECT_EQ(sparse.sparse_steps + sparse.full_steps, n_selectors * (kTokens - 1));
  EXPECT_EQ(sparse.attended_slots, sparse.context_slots);
}

TEST(SparseScheduler, SparseRequestsBatchWithPlainOnesWithoutChangingThem) {
  auto e = LoadStories(128);  // the long prompt is prefilled over several steps, beside decoding
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> long_prompt = Tok(*e, LongText());
  const char* kShort[] = {"Once upon a time, there was a little dog named Max.", "Lily went to the park",
                          "Sara had a big red ball. She liked to"};
  constexpr int kTokens = 32;
  auto streaming = [&] { return Sparse(pq::SparseMethod::kStreaming, 0.2, 32, 64); };  // 32 of ~330 slots
  auto pq_fifth = [&] { return Sparse(pq::SparseMethod::kPq, 0.2, 0, 64); };
  // Each request alone, in a scheduler of its own.
  std::vector<Outcome> alone;
  for (const char* text : kShort) alone.push_back(RunTogether(*e, {Request(Tok(*e, text), kTokens)})[0]);
  const Outcome streaming_alone = RunTogether(*e, {Request(long_prompt, kTokens, streaming())})[0];
  const Outcome pq_alone = RunTogether(*e, {Request(long_prompt, kTokens, pq_fifth())})[0];

  // All of them in one scheduler: the sparse requests' decode rows share every step with
  // the plain requests' rows.
  std::vector<GenerationRequest> reqs;
  reqs.push_back(Request(long_prompt, kTokens, streaming()));
  reqs.push_back(Request(long_prompt, kTokens, pq_fifth()));
  for (const char* text : kShort) reqs.push_back(Request(Tok(*e, text), kTokens));
  SchedulerStats stats;
  const auto out = RunTogether(*e, std::move(reqs), &stats);
  pq::SparseDecodeStats sparse = stats.kv.Value<pq::SparseDecodeStats>();
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(stats.peak_decode_batch, 5);  // they did decode together
  for (size_t i = 0; i < std::size(kShort); ++i) {
    SCOPED_TRACE(kShort[i]);
    EXPECT_EQ(out[i + 2].text, alone[i].text);
  }
  EXPECT_EQ(out[0].text, streaming_alone.text);
  EXPECT_EQ(out[1].text, pq_alone.text);
  EXPECT_EQ(out[0].usage.completion_tokens, kTokens);
  EXPECT_EQ(out[1].usage.completion_tokens, kTokens);
  // They decoded sparsely: 32 and about 66 of ~330 slots per layer and KV head.
  EXPECT_EQ(sparse.requests["streaming"], 1u);
  EXPECT_EQ(sparse.requests["pq"], 1u);
  EXPECT_EQ(sparse.sparse_steps, 2u * (kTokens - 1));
  EXPECT_EQ(sparse.full_steps, 0u);
  ASSERT_GT(sparse.context_slots, 0u);
  const double share = static_cast<double>(sparse.attended_slots) / sparse.context_slots;
  EXPECT_GT(share, 0.1);
  EXPECT_LT(share, 0.2);
  EXPECT_GT(sparse.clustered_keys, 0u);  // pq's codebooks
  EXPECT_GT(sparse.cluster_seconds, 0.0);
}

TEST(SparseScheduler, TheDefaultAppliesUnlessARequestAsksForFullAttention) {
  auto e = LoadStories(256);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = Tok(*e, LongText());
  KvFeatureOptions fo;
  fo.sparse = Sparse(pq::SparseMethod::kStreaming, 0.2, 32, 64);
  SchedulerOptions so;
  so.kv_connector = KvFeatures(fo);
  SchedulerStats stats;
  RunTogether(*e, {Request(prompt, 8), Request(prompt, 8, Sparse(pq::SparseMethod::kFull, 0.2, 0, 64))}, &stats, so);
  pq::SparseDecodeStats sparse = stats.kv.Value<pq::SparseDecodeStats>();
  EXPECT_EQ(sparse.requests.size(), 1u);
  EXPECT_EQ(sparse.requests["streaming"], 1u);  // the first; the second asked for full
  EXPECT_EQ(sparse.sparse_steps, 7u);
}

// With a KV store the turn saver runs after the selector on the same entry: a sparse
// turn's prompt KV is saved as computed (prefill attends in full), so the next turn
// that reuses it answers exactly as a recompute.
TEST(SparseScheduler, ASparseTurnIsSavedAndItsNextTurnReusesItExactly) {
  auto e = LoadStories(128);
  ASSERT_NE(e, nullptr);
  store::StoreOptions so;
  so.fingerprint = e->model().fingerprint();
  so.dram_bytes = 64 << 20;
  auto st = store::KvStore::Open(so);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  const std::vector<int32_t> first = Tok(*e, LongText());
  std::vector<int32_t> second = first;
  const std::vector<int32_t> more = *e->Tokenize(" She ran home to tell her mother.", false);
  second.insert(second.end(), more.begin(), more.end());
  const Outcome want = RunTogether(*e, {Request(second, 12)})[0];  // no store: computed from scratch
  {
    SchedulerOptions o;
    o.max_resident = 0;  // every reuse comes from the store
    o.max_running = 8;
    Scheduler s(*e, o);
    s.set_store(st->get());
    auto turn = [&](std::vector<int32_t> prompt, std::shared_ptr<const pq::SparseOptions> sparse) {
      GenerationRequest r = Request(std::move(prompt), 12, std::move(sparse));
      r.session_id = "conversation";
      auto ch = s.Submit(std::move(r));
      EXPECT_TRUE(ch.ok()) << ch.status().ToString();
      std::vector<std::shared_ptr<ResultChannel>> chans{*ch};
      return RunAll(s, chans)[0];
    };
    const Outcome one = turn(first, Sparse(pq::SparseMethod::kStreaming, 0.2, 32, 64));
    ASSERT_TRUE(one.ended);
    EXPECT_TRUE(one.status.ok()) << one.status.ToString();
    const Outcome two = turn(second, nullptr);
    ASSERT_TRUE(two.ended);
    EXPECT_GE(two.usage.cached_tokens, static_cast<int>(first.size()) - 16);  // the saved prompt (whole blocks)
    EXPECT_EQ(two.text, want.text);
    EXPECT_EQ(s.Stats().kv.Value<pq::SparseDecodeStats>().requests["streaming"], 1u);
  }
}

TEST(SparseScheduler, InvalidOptionsAreRejectedAtSubmit) {
  auto e = LoadStories(64);
  ASSERT_NE(e, nullptr);
  Scheduler s(*e, SchedulerOptions{});
  auto submit = [&](std::shared_ptr<pq::SparseOptions> o) { return s.Submit(Request({1, 100, 200}, 4, std::move(o))); };
  auto bad = [&](auto edit) {
    auto o = std::make_shared<pq::SparseOptions>();
    edit(*o);
    auto r = submit(o);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << o->ToString();
    EXPECT_EQ(r.status().message().rfind("sparse", 0), 0u) << r.status().message();
  };
  bad([](pq::SparseOptions& o) { o.ratio = 0; });
  bad([](pq::SparseOptions& o) { o.ratio = 1.5; });
  bad([](pq::SparseOptions& o) { o.count = -1; });
  bad([](pq::SparseOptions& o) { o.n_initial = -1; });
  bad([](pq::SparseOptions& o) { o.pq.m = 3; });  // does not divide head_dim 8
  bad([](pq::SparseOptions& o) { o.pq.bits = 9; });
  EXPECT_TRUE(submit(std::make_shared<pq::SparseOptions>()).ok());  // the defaults are valid

  // An invalid default fails every request that does not name its own options.
  auto o = std::make_shared<pq::SparseOptions>();
  o->ratio = 2;
  KvFeatureOptions fo;
  fo.sparse = o;
  SchedulerOptions so;
  so.kv_connector = KvFeatures(fo);
  Scheduler s2(*e, so);
  EXPECT_EQ(s2.Submit(Request({1, 100}, 4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(s2.Submit(Request({1, 100}, 4, Sparse(pq::SparseMethod::kFull, 0.2, 0, 1024))).ok());
}

// Offload (pq/offload.h) in the scheduler: a request whose context does not fit the
// compute buffer decodes with offload, exactly as the same selector with its whole KV
// resident in a larger one; the plain request is refused; bad offload options too. On
// every compute-buffer type (q8_0: staged rows carry their scales).
class SparseSchedulerOffload : public ::testing::TestWithParam<DType> {};

TEST_P(SparseSchedulerOffload, AnOffloadedRequestDecodesAsTheResidentOneInAComputeBufferTooSmallForIt) {
  auto load = [](int64_t kv_bytes) {
    EngineOptions o;
    o.kv_dtype = GetParam();
    o.model_path = SharedDir() + "/models/stories260K-hf";
    o.n_threads = 2;
    o.max_batch_tokens = 64;
    o.kv_block_size = 16;
    o.kv_cache_bytes = kv_bytes;
    auto e = Engine::Load(o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  };
  auto big = load(8 << 20);
  ASSERT_NE(big, nullptr);
  // 12 blocks of 16: 192 slots (q8_0's buffers end in partly used pages: the budget is
  // what 12 blocks map, not 12 x block_bytes()).
  auto small = load(static_cast<int64_t>(kv::BlockPool::MappedBytes(big->kv_pool().shape(), 12)));
  ASSERT_NE(small, nullptr);
  ASSERT_EQ(small->kv_pool().n_blocks(), 12);
  const std::vector<int32_t> prompt = Tok(*big, LongText());
  ASSERT_GT(prompt.size(), 300u);
  constexpr int kTokens = 40;
  auto resident = std::make_shared<pq::SparseOptions>(*pq::ParseSparseOptions("pq-0.2@min=64,local=16,iters=4"));
  auto offload = std::make_shared<pq::SparseOptions>(*resident);
  offload->offload_cache_blocks = 2;
  offload->offload_policy = pq::CachePolicy::kLfu;

  const auto want = RunTogether(*big, {Request(prompt, kTokens, resident)});
  ASSERT_EQ(want.size(), 1u);
  {
    Scheduler s(*small, SchedulerOptions{});
    EXPECT_EQ(s.Submit(Request(prompt, kTokens, resident)).status().code(), StatusCode::kOutOfRange);
  }
  SchedulerStats stats;
  const auto got = RunTogether(*small, {Request(prompt, kTokens, offload)}, &stats);
  pq::SparseDecodeStats sparse = stats.kv.Value<pq::SparseDecodeStats>();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].text, want[0].text);
  EXPECT_EQ(got[0].usage.completion_tokens, kTokens);
  EXPECT_EQ(sparse.offloaded_requests, 1u);
  EXPECT_GE(sparse.offloaded_blocks, 15u);
  EXPECT_GT(sparse.offload_cache_hits + sparse.offload_cache_misses, 0u);
  EXPECT_GT(sparse.offload_fetched_bytes, 0u);
  EXPECT_EQ(sparse.offload_errors, 0u);
  EXPECT_EQ(stats.kv_blocks_used, 0);  // nothing stays resident; the cache went back to the pool

  // Refused at Submit: offload with a selector that reads every key; a context larger
  // than the offload tier; a working set larger than the compute buffer.
  Scheduler s(*small, SchedulerOptions{});
  auto oracle = std::make_shared<pq::SparseOptions>(*offload);
  oracle->method = pq::SparseMethod::kOracle;
  EXPECT_EQ(s.Submit(Request(prompt, kTokens, oracle)).status().code(), StatusCode::kInvalidArgument);
  auto huge_cache = std::make_shared<pq::SparseOptions>(*offload);
  huge_cache->offload_cache_blocks = 12;
  EXPECT_EQ(s.Submit(Request(prompt, kTokens, huge_cache)).status().code(), StatusCode::kOutOfRange);
  KvFeatureOptions tiny_fo;
  // The context needs 23 blocks (f32 in the tier by default, whatever the pool's type).
  tiny_fo.sparse_offload_bytes = 10 * pq::OffloadTierBytes(small->kv_pool().shape(), 16);
  SchedulerOptions tiny_tier;
  tiny_tier.kv_connector = KvFeatures(tiny_fo);
  Scheduler s2(*small, tiny_tier);
  auto r = s2.Submit(Request(prompt, kTokens, offload));
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(r.status().message().find("--sparse-offload-bytes"), std::string::npos) << r.status().message();

  // A tier of a store type (the server's --kv-store-dtype): the same context takes the
  // type's bytes, so a tier sized for it in kivi4 -- less than f32 needs for half of it --
  // admits and decodes it, and refuses it in f32.
  const kv::KvShape& shape = small->kv_pool().shape();
  KvFeatureOptions kivi4_fo;
  kivi4_fo.sparse_offload_dtype = store::KvDtype::kKivi4;
  kivi4_fo.sparse_offload_bytes = pq::OffloadTierBytes(shape, 23 * shape.block_size, store::KvDtype::kKivi4);
  ASSERT_LT(kivi4_fo.sparse_offload_bytes, pq::OffloadTierBytes(shape, 12 * shape.block_size));
  SchedulerOptions kivi4_tier;
  kivi4_tier.kv_connector = KvFeatures(kivi4_fo);
  SchedulerStats kivi4_stats;
  const auto kivi4_got = RunTogether(*small, {Request(prompt, kTokens, offload)}, &kivi4_stats, kivi4_tier);
  ASSERT_EQ(kivi4_got.size(), 1u);
  EXPECT_EQ(kivi4_got[0].usage.completion_tokens, kTokens);
  const pq::SparseDecodeStats kivi4_sparse = kivi4_stats.kv.Value<pq::SparseDecodeStats>();
  EXPECT_GE(kivi4_sparse.offloaded_blocks, 15u);
  EXPECT_EQ(kivi4_sparse.offload_errors, 0u);
  EXPECT_EQ(kivi4_stats.kv_blocks_used, 0);
  KvFeatureOptions f32_fo = kivi4_fo;
  f32_fo.sparse_offload_dtype = store::KvDtype::kF32;
  SchedulerOptions f32_tier;
  f32_tier.kv_connector = KvFeatures(f32_fo);
  Scheduler s3(*small, f32_tier);
  EXPECT_EQ(s3.Submit(Request(prompt, kTokens, offload)).status().code(), StatusCode::kOutOfRange);
}

INSTANTIATE_TEST_SUITE_P(KvTypes, SparseSchedulerOffload, ::testing::Values(DType::kF32, DType::kF16, DType::kQ8_0),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace attic::engine
