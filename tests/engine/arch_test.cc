// Architecture coverage: tiny random models (GQA, MHA, q/k/v bias, untied embeddings,
// explicit head_dim, linear and llama3 rope scaling, f16 and bf16 weights, GGUF) written
// to disk, loaded by Attic and run through the paged, chunked, per-layer forward. Every
// position's logits must match the deliberately naive double-precision reference in
// tests/reference/naive_llama.h, which is given the same weight values directly.
//
// Tolerance: max |attic - reference| <= tol * max(1, max |reference|). tol = 1e-4 where
// the arithmetic is f32 (f32 weights; f16 and bf16 weights widened to f32 exactly): f32
// sums of k <= 128 products err by at most k * 2^-24 ~ 8e-6 of the sum of |products|,
// over 2 layers of 7 linear layers, attention and norms, with ~10x to spare. Where bf16
// weights are multiplied in bf16 (AVX512-BF16, backend::LinearRoundsBf16Activations()),
// the linear layers' inputs are rounded to bf16 as llama.cpp does; the reference rounds
// the same inputs, and tol adds twice the effect that rounding has on the reference's
// logits (measured per model in the test, not chosen).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <cstring>

#include "attic/backend/kernels.h"
#include "attic/engine/transformer.h"
#include "attic/model/tensor_specs.h"
#include "attic/model/writer.h"
#include "reference/naive_llama.h"
#include "test_util.h"

namespace attic::engine {
namespace {

using attic::testing::NaiveConfig;
using attic::testing::NaiveLayer;
using attic::testing::NaiveWeights;
using model::ModelConfig;

struct Variant {
  std::string name;
  std::string arch = "LlamaForCausalLM";
  int hidden = 64, inter = 96, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, vocab = 300;
  bool bias = false, tied = true;
  std::string rope = "none";
  float factor = 1.0f;
  DType dtype = DType::kF32;
  bool gguf = false;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

ModelConfig ToConfig(const Variant& v) {
  ModelConfig c;
  c.architecture = v.arch;
  c.hidden_size = v.hidden;
  c.intermediate_size = v.inter;
  c.n_layers = v.layers;
  c.n_heads = v.heads;
  c.n_kv_heads = v.kv_heads;
  c.head_dim = v.head_dim;
  c.vocab_size = v.vocab;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.attention_bias = v.bias;
  c.tie_word_embeddings = v.tied;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.torch_dtype = v.dtype;
  if (v.rope == "linear") {
    c.rope_scaling.type = model::RopeScalingType::kLinear;
    c.rope_scaling.factor = v.factor;
  } else if (v.rope == "llama3") {
    c.rope_scaling.type = model::RopeScalingType::kLlama3;
    c.rope_scaling.factor = v.factor;
    c.rope_scaling.low_freq_factor = 1.0f;
    c.rope_scaling.high_freq_factor = 4.0f;
    c.rope_scaling.original_max_position_embeddings = 64;
  }
  return c;
}

float RoundTo(DType t, float x) {
  if (t == DType::kBF16) return Bf16ToF32(F32ToBf16(x));
  if (t == DType::kF16) return F16ToF32(F32ToF16(x));
  return x;
}

class ArchTest : public ::testing::TestWithParam<Variant> {};

TEST_P(ArchTest, MatchesNaiveReference) {
  const Variant& v = GetParam();
  ModelConfig c = ToConfig(v);
  ASSERT_TRUE(c.Validate().ok()) << c.Validate().ToString();

  // Random weights (norms around 1, biases non-zero), rounded to the storage dtype.
  std::mt19937 rng(123);
  std::normal_distribution<float> nd(0.0f, 0.15f);
  std::vector<model::NamedTensor> tensors;
  for (const auto& spec : model::ModelTensorSpecs(c)) {
    model::NamedTensor t{spec.name, spec.shape, std::vector<float>(spec.numel())};
    for (auto& x : t.data) {
      x = spec.kind == model::TensorKind::kNorm ? 1.0f + nd(rng) : nd(rng);
      if (spec.kind == model::TensorKind::kMatrix) x = RoundTo(v.dtype, x);
      else if (!v.gguf) x = RoundTo(v.dtype, x);  // HF stores norms in the same dtype; GGUF keeps f32
    }
    tensors.push_back(std::move(t));
  }
  NaiveConfig nc;
  nc.hidden = c.hidden_size, nc.intermediate = c.intermediate_size, nc.n_layers = c.n_layers;
  nc.n_heads = c.n_heads, nc.n_kv_heads = c.n_kv_heads, nc.head_dim = c.head_dim, nc.vocab = c.vocab_size;
  nc.eps = c.rms_norm_eps, nc.theta = c.rope_theta;
  nc.rope_type = v.rope, nc.rope_factor = v.factor, nc.original_max_pos = 64;
  NaiveWeights nw;
  nw.layers.resize(c.n_layers);
  for (const auto& t : tensors) {
    const std::string& n = t.name;
    if (n == "model.embed_tokens.weight") { nw.embed = t.data; continue; }
    if (n == "model.norm.weight") { nw.final_norm = t.data; continue; }
    if (n == "lm_head.weight") { nw.lm_head = t.data; continue; }
    int layer = std::stoi(n.substr(std::string("model.layers.").size()));
    NaiveLayer& L = nw.layers[layer];
    auto ends = [&](const char* s) { return n.size() >= strlen(s) && n.compare(n.size() - strlen(s), strlen(s), s) == 0; };
    if (ends("input_layernorm.weight")) L.attn_norm = t.data;
    else if (ends("q_proj.weight")) L.wq = t.data;
    else if (ends("k_proj.weight")) L.wk = t.data;
    else if (ends("v_proj.weight")) L.wv = t.data;
    else if (ends("q_proj.bias")) L.bq = t.data;
    else if (ends("k_proj.bias")) L.bk = t.data;
    else if (ends("v_proj.bias")) L.bv = t.data;
    else if (ends("o_proj.weight")) L.wo = t.data;
    else if (ends("post_attention_layernorm.weight")) L.ffn_norm = t.data;
    else if (ends("gate_proj.weight")) L.gate = t.data;
    else if (ends("up_proj.weight")) L.up = t.data;
    else if (ends("down_proj.weight")) L.down = t.data;
    else FAIL() << "unexpected tensor " << n;
  }

  attic::testing::TempDir dir;
  model::WriteOptions wo;
  wo.dtype = v.dtype;
  std::string path = v.gguf ? dir.File("m.gguf") : dir.File("m");
  Status ws = v.gguf ? model::WriteGgufModel(path, c, tensors, wo) : model::WriteHfModel(path, c, tensors, wo);
  ASSERT_TRUE(ws.ok()) << ws.ToString();
  auto m = model::Model::Load(path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();

  // 45 tokens: 37 prefilled in chunks of 16 over blocks of 4 slots, then 8 single-token steps.
  std::vector<int> tokens;
  std::uniform_int_distribution<int> ud(0, c.vocab_size - 1);
  for (int i = 0; i < 45; ++i) tokens.push_back(ud(rng));
  // Kernels that multiply bf16 weights in bf16 (AVX512-BF16) round the linear layers'
  // inputs to bf16; the reference then rounds the same inputs (act_round).
  const bool rounds_x = v.dtype == DType::kBF16 && backend::LinearRoundsBf16Activations();
  auto ref = attic::testing::NaiveForward(nc, nw, tokens, rounds_x ? attic::testing::RoundToBf16 : nullptr);
  // What that rounding does to this model's logits (the reference with it vs without),
  // relative to max(1, max |logit|): 0 when the kernels do not round.
  double rounding_effect = 0;
  if (rounds_x) {
    const auto plain = attic::testing::NaiveForward(nc, nw, tokens);
    double d = 0, m = 1;
    for (size_t t = 0; t < plain.size(); ++t)
      for (size_t i = 0; i < plain[t].size(); ++i)
        d = std::max(d, std::abs(ref[t][i] - plain[t][i])), m = std::max(m, std::abs(plain[t][i]));
    rounding_effect = d / m;
  }

  backend::ThreadPool pool(2);
  Transformer tf(**m, pool, 16);
  kv::BlockPool kvp(tf.kv_shape(4), 32);
  kv::SequenceKv seq(&kvp);
  double max_ref = 1, max_err = 0;
  int pos = 0;
  const int n_prefill = 37;
  std::vector<float> logits;
  while (pos < static_cast<int>(tokens.size())) {
    int n = pos < n_prefill ? std::min(16, n_prefill - pos) : 1;
    std::vector<BatchEntry> b(1);
    b[0].seq = &seq;
    b[0].tokens.assign(tokens.begin() + pos, tokens.begin() + pos + n);
    b[0].all_logits = (pos / 16) % 2 == 1;  // some chunks give every token's logits
    ASSERT_TRUE(tf.Forward(b, &logits).ok());
    const int rows = b[0].all_logits ? n : 1;
    ASSERT_EQ(logits.size(), static_cast<size_t>(rows) * c.vocab_size);
    for (int r = 0; r < rows; ++r) {
      const auto& want = ref[pos + n - rows + r];
      for (int i = 0; i < c.vocab_size; ++i) {
        max_ref = std::max(max_ref, std::abs(want[i]));
        max_err = std::max(max_err, std::abs(logits[static_cast<size_t>(r) * c.vocab_size + i] - want[i]));
      }
    }
    pos += n;
  }
  // See the top: f32 arithmetic's 1e-4; where x is rounded to bf16, plus twice the
  // rounding's own effect (an element within f32 error of a bf16 midpoint may round the
  // other way in the kernel: one bf16 ulp, twice the error the reference gave it).
  const double tol = 1e-4 + 2 * rounding_effect;
  RecordProperty("max_abs_error", std::to_string(max_err));
  std::printf("%s: max |error| %.3g, max |logit| %.3g, tol %.3g (bf16 rounding effect %.3g)\n", v.name.c_str(),
              max_err, max_ref, tol, rounding_effect);
  EXPECT_LE(max_err, tol * max_ref) << v.name << ": max error " << max_err << ", max |logit| " << max_ref;
}

std::vector<Variant> Variants() {
  std::vector<Variant> vs;
  Variant gqa;
  gqa.name = "gqa_tied_f32";
  vs.push_back(gqa);
  Variant mha = gqa;
  mha.name = "mha_untied_f32", mha.kv_heads = 4, mha.tied = false;
  vs.push_back(mha);
  Variant qwen = gqa;
  qwen.name = "qwen2_qkv_bias_f32", qwen.arch = "Qwen2ForCausalLM", qwen.bias = true, qwen.tied = false;
  vs.push_back(qwen);
  Variant mistral = gqa;
  mistral.name = "mistral_gqa4_f32", mistral.arch = "MistralForCausalLM", mistral.heads = 8, mistral.kv_heads = 2,
  mistral.head_dim = 8;
  vs.push_back(mistral);
  Variant head_dim = gqa;
  head_dim.name = "explicit_head_dim_f32", head_dim.hidden = 48, head_dim.head_dim = 16;  // 4 heads x 16 != 48
  vs.push_back(head_dim);
  Variant lin = gqa;
  lin.name = "rope_linear_f32", lin.rope = "linear", lin.factor = 4.0f;
  vs.push_back(lin);
  Variant l3 = gqa;
  l3.name = "rope_llama3_f32", l3.rope = "llama3", l3.factor = 8.0f, l3.head_dim = 32, l3.hidden = 128;
  vs.push_back(l3);
  Variant bf = gqa;
  bf.name = "gqa_bf16", bf.dtype = DType::kBF16;
  vs.push_back(bf);
  Variant f16 = mha;
  f16.name = "mha_untied_f16", f16.dtype = DType::kF16;
  vs.push_back(f16);
  Variant gg = gqa;
  gg.name = "gguf_gqa_f32", gg.gguf = true;
  vs.push_back(gg);
  Variant ggb = mha;
  ggb.name = "gguf_mha_untied_bf16", ggb.gguf = true, ggb.dtype = DType::kBF16;
  vs.push_back(ggb);
  return vs;
}

INSTANTIATE_TEST_SUITE_P(Tiny, ArchTest, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace attic::engine
