// Reuse exactness (DESIGN.md decision 3): a continuation generated in two calls, with the
// first call's KV saved pre-RoPE, copied to fresh memory and re-entered into a new
// sequence, gives exactly the tokens of one uninterrupted call.
#include <gtest/gtest.h>

#include <cstring>

#include "attic/engine/engine.h"
#include "test_util.h"

namespace attic::engine {
namespace {

using attic::testing::SharedDir;

TEST(Reuse, SavedPreRopeKvReenteredGivesIdenticalTokens) {
  EngineOptions o;
  o.model_path = SharedDir() + "/models/stories260K-hf";
  o.n_threads = 2;
  o.max_batch_tokens = 64;
  auto eng = Engine::Load(o);
  ASSERT_TRUE(eng.ok()) << eng.status().ToString();
  Engine& e = **eng;
  Transformer& tf = e.transformer();
  const auto& cfg = e.model().config();
  const int kvd = cfg.kv_dim();
  auto prompt = *e.Tokenize("Once upon a time, there was a little dog named Max.", true);

  // Reference: one call, 80 greedy tokens.
  std::vector<int32_t> one_call;
  {
    Session s(e);
    SamplingParams p;
    p.max_tokens = 80;
    auto r = s.Generate(prompt, p);
    ASSERT_TRUE(r.ok());
    one_call = r->tokens;
    ASSERT_EQ(one_call.size(), 80u);
  }

  // First call: prompt + 30 tokens, capturing every layer's pre-RoPE K and V as the
  // tokens enter (what the store would save).
  std::vector<std::vector<float>> saved_k(cfg.n_layers), saved_v(cfg.n_layers);
  std::vector<int32_t> history;
  kv::KvObserverHooks saver([&](int layer, int entry, const float* k, const float* v, int n) {
    saved_k[layer].insert(saved_k[layer].end(), k, k + static_cast<size_t>(n) * kvd);
    saved_v[layer].insert(saved_v[layer].end(), v, v + static_cast<size_t>(n) * kvd);
  });
  kv::SequenceKv first(&e.kv_pool());
  std::vector<float> logits;
  {
    std::vector<BatchEntry> b(1);
    b[0].seq = &first;
    b[0].tokens = prompt;
    ASSERT_TRUE(tf.Forward(b, &logits, &saver).ok());
    history = prompt;
  }
  std::vector<int32_t> got;
  for (int i = 0; i < 30; ++i) {
    int32_t t = Argmax(logits.data(), cfg.vocab_size);
    got.push_back(t);
    if (i == 29) break;  // the 30th token is not fed yet: the second call starts with it
    std::vector<BatchEntry> b(1);
    b[0].seq = &first;
    b[0].tokens = {t};
    ASSERT_TRUE(tf.Forward(b, &logits, &saver).ok());
    history.push_back(t);
  }
  first.Release();  // the compute buffer is gone; only the saved copy remains

  // Copy to fresh memory (as a tier would), then re-enter into a new sequence.
  std::vector<std::vector<float>> copy_k(cfg.n_layers), copy_v(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    copy_k[l].resize(saved_k[l].size());
    std::memcpy(copy_k[l].data(), saved_k[l].data(), saved_k[l].size() * 4);
    copy_v[l].resize(saved_v[l].size());
    std::memcpy(copy_v[l].data(), saved_v[l].data(), saved_v[l].size() * 4);
    std::vector<float>().swap(saved_k[l]);
    std::vector<float>().swap(saved_v[l]);
  }
  kv::SequenceKv second(&e.kv_pool());
  const int n_hist = static_cast<int>(history.size());
  ASSERT_EQ(copy_k[0].size(), static_cast<size_t>(n_hist) * kvd);
  std::vector<int32_t> pos(n_hist);
  for (int i = 0; i < n_hist; ++i) pos[i] = i;
  ASSERT_TRUE(second.Append(history.data(), pos.data(), n_hist).ok());
  for (int l = 0; l < cfg.n_layers; ++l) tf.EnterKv(&second, l, 0, n_hist, copy_k[l].data(), copy_v[l].data());

  // Second call continues from the 30th token.
  int32_t t = got.back();
  while (got.size() < one_call.size()) {
    std::vector<BatchEntry> b(1);
    b[0].seq = &second;
    b[0].tokens = {t};
    ASSERT_TRUE(tf.Forward(b, &logits).ok());
    t = Argmax(logits.data(), cfg.vocab_size);
    got.push_back(t);
  }
  EXPECT_EQ(got, one_call);
}

}  // namespace
}  // namespace attic::engine
