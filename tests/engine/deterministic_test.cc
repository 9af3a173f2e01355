// Deterministic mode (EngineOptions::deterministic, Transformer's row_invariant): a
// sequence's logits must be the same bits whether it runs alone, prefilled in one chunk,
// or in other chunks next to other sequences' prefill chunks and decode rows (steps far
// beyond the GEMV/GEMM crossover). Without it they differ in the last bits, which is
// enough to change a sampled token. Also checks the mode still computes the same model:
// its logits (and the default mode's) are within arch_test's derived bound of the float64
// reference.
//
// The models are tiny random ones written to disk in f32 and in bf16, of two shapes:
// head_dim 64 (so AVX-512 has its few-row decode attention kernel as well as the tile
// kernel), and stories260K's (head_dim 8, intermediate_size 172: rows of the FFN that
// are not a multiple of any vector width, the shape the server's seeded-sampling test
// runs).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attic/backend/kernels.h"
#include "attic/engine/transformer.h"
#include "attic/model/writer.h"
#include "model/test_models.h"
#include "reference/naive_llama.h"
#include "test_util.h"

namespace attic::engine {
namespace {

enum class Shape { kHeadDim64, kStories260K };

// model_test's tiny GQA config, widened to head_dim 64, or stories260K's shape.
model::ModelConfig Config(DType dtype, Shape shape) {
  model::ModelConfig c = model::testing::TinyConfig();
  if (shape == Shape::kHeadDim64) {
    c.hidden_size = 128;
    c.intermediate_size = 256;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 64;
  } else {
    c.hidden_size = 64;
    c.intermediate_size = 172;
    c.n_heads = 8;
    c.n_kv_heads = 4;
    c.head_dim = 8;
  }
  c.vocab_size = 300;
  c.max_position_embeddings = 2048;
  c.torch_dtype = dtype;
  return c;
}

std::unique_ptr<model::Model> WriteAndLoad(const attic::testing::TempDir& dir, DType dtype, Shape shape) {
  model::WriteOptions wo;
  wo.dtype = dtype;
  const std::string path = dir.File(std::string("m-") + DTypeName(dtype));
  EXPECT_TRUE(model::WriteRandomHfModel(path, Config(dtype, shape), model::RandomWeights{7, 0.15f}, wo).ok());
  auto m = model::Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

// The loaded model's weights (as f32) for the float64 reference.
attic::testing::NaiveWeights Reference(const model::Model& m) {
  const model::ModelConfig& c = m.config();
  auto t = model::testing::LoadedTensors(m);
  attic::testing::NaiveWeights w;
  w.embed = t["model.embed_tokens.weight"];
  w.lm_head = t["lm_head.weight"];
  w.final_norm = t["model.norm.weight"];
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    attic::testing::NaiveLayer L;
    L.attn_norm = t[p + "input_layernorm.weight"];
    L.ffn_norm = t[p + "post_attention_layernorm.weight"];
    L.wq = t[p + "self_attn.q_proj.weight"], L.wk = t[p + "self_attn.k_proj.weight"];
    L.wv = t[p + "self_attn.v_proj.weight"], L.wo = t[p + "self_attn.o_proj.weight"];
    L.gate = t[p + "mlp.gate_proj.weight"], L.up = t[p + "mlp.up_proj.weight"], L.down = t[p + "mlp.down_proj.weight"];
    w.layers.push_back(std::move(L));
  }
  return w;
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> u(3, 299);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = u(rng);
  return t;
}

// The logits of `tokens`' last prompt token and of `n_decode` decode steps (feeding the
// given tokens), prefilled in chunks of `chunk`. With `company`, every step also carries
// a 60-token prefill chunk of another sequence and two other decoding sequences.
std::vector<std::vector<float>> StepLogits(Transformer& tf, const std::vector<int32_t>& prompt,
                                    const std::vector<int32_t>& decode, int chunk, bool company) {
  kv::BlockPool kvp(tf.kv_shape(16), 256);
  kv::SequenceKv seq(&kvp), other(&kvp), d1(&kvp), d2(&kvp);
  std::mt19937 rng(99);
  const std::vector<int32_t> other_tokens = RandomTokens(rng, 60 * 20);
  int other_pos = 0;
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  size_t pos = 0;
  const size_t total = prompt.size() + decode.size();
  while (pos < total) {
    std::vector<BatchEntry> b;
    if (company) {
      BatchEntry o;
      o.seq = &other;
      o.tokens.assign(other_tokens.begin() + other_pos, other_tokens.begin() + other_pos + 60);
      other_pos += 60;
      b.push_back(o);
      for (kv::SequenceKv* d : {&d1, &d2}) {
        BatchEntry e;
        e.seq = d;
        e.tokens = RandomTokens(rng, d->n_slots() == 0 ? 5 : 1);
        b.push_back(e);
      }
    }
    BatchEntry e;
    e.seq = &seq;
    if (pos < prompt.size()) {
      const size_t n = std::min(prompt.size() - pos, static_cast<size_t>(chunk));
      e.tokens.assign(prompt.begin() + pos, prompt.begin() + pos + n);
      pos += n;
    } else {
      e.tokens = {decode[pos - prompt.size()]};
      ++pos;
    }
    e.want_logits = pos >= prompt.size();
    const size_t at = company ? b.size() / 2 : 0;  // somewhere in the middle of the step
    b.insert(b.begin() + at, e);
    EXPECT_TRUE(tf.Forward(b, &logits).ok());
    if (!e.want_logits) continue;
    // Logits rows come in batch order, one per entry that wants them (all do here).
    const int vocab = tf.config().vocab_size;
    out.emplace_back(logits.begin() + at * vocab, logits.begin() + (at + 1) * vocab);
  }
  return out;
}

class DeterministicTest : public ::testing::TestWithParam<std::tuple<DType, Shape>> {};

TEST_P(DeterministicTest, LogitsDoNotDependOnBatchingOrChunking) {
  const DType dtype = std::get<0>(GetParam());
  attic::testing::TempDir dir;
  auto m = WriteAndLoad(dir, dtype, std::get<1>(GetParam()));
  ASSERT_NE(m, nullptr);
  backend::ThreadPool pool(2);
  std::mt19937 rng(5);
  const std::vector<int32_t> prompt = RandomTokens(rng, 70), decode = RandomTokens(rng, 6);

  Transformer det(*m, pool, 256, /*row_invariant=*/true);
  const auto alone = StepLogits(det, prompt, decode, 256, false);
  ASSERT_EQ(alone.size(), 7u);
  EXPECT_EQ(StepLogits(det, prompt, decode, 7, false), alone) << "chunks of 7, alone";
  EXPECT_EQ(StepLogits(det, prompt, decode, 70, true), alone) << "one chunk, with company";
  EXPECT_EQ(StepLogits(det, prompt, decode, 13, true), alone) << "chunks of 13, with company";

  // Same model: both modes within arch_test's bound of the float64 reference
  // (tests/reference/naive_llama.h) given the loaded weights: 1e-4 of max(1, max |logit|)
  // for f32 arithmetic; where bf16 weights are multiplied in bf16, the reference rounds the
  // linear inputs too and the bound adds twice that rounding's effect on its logits.
  const model::ModelConfig& c = m->config();
  const attic::testing::NaiveWeights nw = Reference(*m);
  attic::testing::NaiveConfig nc;
  nc.hidden = c.hidden_size, nc.intermediate = c.intermediate_size, nc.n_layers = c.n_layers;
  nc.n_heads = c.n_heads, nc.n_kv_heads = c.n_kv_heads, nc.head_dim = c.head_dim, nc.vocab = c.vocab_size;
  nc.eps = c.rms_norm_eps, nc.theta = c.rope_theta;
  std::vector<int> all(prompt.begin(), prompt.end());
  all.insert(all.end(), decode.begin(), decode.end());  // logits after the prompt and after each decode token
  const bool rounds_x = dtype == DType::kBF16 && backend::LinearRoundsBf16Activations();
  const auto ref = attic::testing::NaiveForward(nc, nw, all, rounds_x ? attic::testing::RoundToBf16 : nullptr);
  double rounding_effect = 0;
  if (rounds_x) {
    const auto plain = attic::testing::NaiveForward(nc, nw, all);
    double d = 0, mx = 1;
    for (size_t t = 0; t < plain.size(); ++t)
      for (size_t i = 0; i < plain[t].size(); ++i)
        d = std::max(d, std::abs(ref[t][i] - plain[t][i])), mx = std::max(mx, std::abs(plain[t][i]));
    rounding_effect = d / mx;
  }
  const double tol = 1e-4 + 2 * rounding_effect;
  Transformer fast(*m, pool, 256);
  const auto fast_logits = StepLogits(fast, prompt, decode, 256, false);
  for (const auto* got : {&alone, &fast_logits}) {
    ASSERT_EQ(got->size(), 7u);
    for (size_t s = 0; s < got->size(); ++s) {
      ASSERT_LT(prompt.size() - 1 + s, ref.size());
      const std::vector<double>& want = ref[prompt.size() - 1 + s];
      double max_ref = 1, max_err = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        max_ref = std::max(max_ref, std::abs(want[i]));
        max_err = std::max(max_err, std::abs(static_cast<double>((*got)[s][i]) - want[i]));
      }
      EXPECT_LE(max_err, tol * max_ref) << (got == &alone ? "deterministic" : "default") << " mode, step " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DeterministicTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(Shape::kHeadDim64, Shape::kStories260K)),
                         [](const ::testing::TestParamInfo<std::tuple<DType, Shape>>& info) {
                           return std::string(DTypeName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) == Shape::kHeadDim64 ? "_head_dim64" : "_stories260k");
                         });

}  // namespace
}  // namespace attic::engine
