// Test support for forward-pass tests: a tiny random Llama-family model written to disk
// and loaded by Attic, the same weights as a NaiveWeights for tests/reference, and a
// generalised naive float64 forward (positions per token, a visibility mask per layer /
// query / KV head, stale KV overriding what attention reads, and every layer's K and V
// recorded). Like tests/reference/naive_llama.h it shares no code with the engine.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attic/model/model.h"
#include "attic/model/tensor_specs.h"
#include "attic/model/writer.h"
#include "reference/naive_llama.h"
#include "test_util.h"

namespace attic::testing {

struct TinySpec {
  std::string arch = "LlamaForCausalLM";
  int hidden = 64, inter = 96, layers = 3, heads = 4, kv_heads = 2, head_dim = 16, vocab = 300;
  bool bias = false;
  DType dtype = DType::kF32;  // weights
};

struct TinyModel {
  std::unique_ptr<model::Model> model;
  NaiveConfig nc;
  NaiveWeights nw;
};

inline model::ModelConfig TinyConfig(const TinySpec& s) {
  model::ModelConfig c;
  c.architecture = s.arch;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.inter;
  c.n_layers = s.layers;
  c.n_heads = s.heads;
  c.n_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.vocab_size = s.vocab;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.attention_bias = s.bias;
  c.tie_word_embeddings = !s.bias;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.torch_dtype = s.dtype;
  return c;
}

// Random weights (norms around 1, biases non-zero) rounded to the storage dtype, written
// as an HF directory under `dir` and loaded; the naive reference gets the same values.
inline void MakeTinyModel(const TinySpec& s, const TempDir& dir, TinyModel* out) {
  const model::ModelConfig c = TinyConfig(s);
  ASSERT_TRUE(c.Validate().ok()) << c.Validate().ToString();
  auto round = [&](float x) {
    if (s.dtype == DType::kBF16) return Bf16ToF32(F32ToBf16(x));
    if (s.dtype == DType::kF16) return F16ToF32(F32ToF16(x));
    return x;
  };
  std::mt19937 rng(321);
  std::normal_distribution<float> nd(0.0f, 0.15f);
  std::vector<model::NamedTensor> tensors;
  for (const auto& spec : model::ModelTensorSpecs(c)) {
    model::NamedTensor t{spec.name, spec.shape, std::vector<float>(spec.numel())};
    for (auto& x : t.data) x = round(spec.kind == model::TensorKind::kNorm ? 1.0f + nd(rng) : nd(rng));
    tensors.push_back(std::move(t));
  }
  NaiveConfig& nc = out->nc;
  nc.hidden = c.hidden_size, nc.intermediate = c.intermediate_size, nc.n_layers = c.n_layers;
  nc.n_heads = c.n_heads, nc.n_kv_heads = c.n_kv_heads, nc.head_dim = c.head_dim, nc.vocab = c.vocab_size;
  nc.eps = c.rms_norm_eps, nc.theta = c.rope_theta;
  NaiveWeights& nw = out->nw;
  nw.layers.resize(c.n_layers);
  for (const auto& t : tensors) {
    const std::string& n = t.name;
    if (n == "model.embed_tokens.weight") { nw.embed = t.data; continue; }
    if (n == "model.norm.weight") { nw.final_norm = t.data; continue; }
    if (n == "lm_head.weight") { nw.lm_head = t.data; continue; }
    const int layer = std::stoi(n.substr(std::string("model.layers.").size()));
    NaiveLayer& L = nw.layers[layer];
    auto ends = [&](const char* x) { return n.size() >= strlen(x) && n.compare(n.size() - strlen(x), strlen(x), x) == 0; };
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
  model::WriteOptions wo;
  wo.dtype = s.dtype;
  const std::string path = dir.File("m");
  const Status ws = model::WriteHfModel(path, c, tensors, wo);
  ASSERT_TRUE(ws.ok()) << ws.ToString();
  auto m = model::Model::Load(path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  out->model = std::move(*m);
}

// RoundToBf16: reference/naive_llama.h.

using Rows = std::vector<std::vector<double>>;  // [token][...]

struct NaiveRun {
  Rows logits;                         // [n][vocab]
  std::vector<Rows> k_pre, k_rot, v;   // [layer][n][kv_dim]: K before / after RoPE, V
  std::vector<Rows> q_rot;             // [layer][n][q_dim]: the queries after RoPE
};

struct NaiveOptions {
  std::vector<int> positions;  // per token; empty = 0..n-1
  // May query t (with the query heads of KV head h) see token j at layer l? Default: j <= t.
  std::function<bool(int l, int t, int h, int j)> visible;
  // Replaces what attention reads for token j at layer l (its rotated K and its V),
  // returning true; the token's own computed K/V are still recorded.
  std::function<bool(int l, int j, std::vector<double>* k_rot, std::vector<double>* v)> stale_kv;
  // Applied to every element of the rotated K / of V that attention reads (an f16 KV
  // cache: round to f16), after stale_kv.
  std::function<double(double)> k_round, v_round;
  // Applied to every element of each linear layer's input (q/k/v, o, gate/up, down,
  // lm_head) before the product: a kernel that rounds x to bf16 for bf16 weights
  // (backend::LinearRoundsBf16Activations) is modelled by rounding to bf16 here.
  std::function<double(double)> act_round;
};

// Tokens in slot order (token j is slot j).
inline NaiveRun NaiveForwardEx(const NaiveConfig& c, const NaiveWeights& w, const std::vector<int>& tokens,
                               const NaiveOptions& o = {}) {
  const int n = static_cast<int>(tokens.size());
  // The input of a linear layer as the kernel multiplies it.
  auto in = [&o](std::vector<double> x) {
    if (o.act_round)
      for (double& e : x) e = o.act_round(e);
    return x;
  };
  const int hd = c.head_dim, qd = c.n_heads * hd, kvd = c.n_kv_heads * hd, group = c.n_heads / c.n_kv_heads;
  const auto inv = NaiveInvFreq(c);
  auto pos = [&](int t) { return o.positions.empty() ? t : o.positions[t]; };
  NaiveRun run;
  Rows x(n, std::vector<double>(c.hidden));
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < c.hidden; ++i) x[t][i] = w.embed[static_cast<size_t>(tokens[t]) * c.hidden + i];
  for (int l = 0; l < c.n_layers; ++l) {
    const NaiveLayer& L = w.layers[l];
    Rows q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      auto h = in(NaiveRmsNorm(x[t], L.attn_norm, c.eps));
      q[t] = NaiveMatVec(L.wq, L.bq, h, qd);
      k[t] = NaiveMatVec(L.wk, L.bk, h, kvd);
      v[t] = NaiveMatVec(L.wv, L.bv, h, kvd);
    }
    run.k_pre.push_back(k);
    for (int t = 0; t < n; ++t) {
      for (int hh = 0; hh < c.n_heads; ++hh) NaiveRope(&q[t][hh * hd], hd, pos(t), inv);
      for (int hh = 0; hh < c.n_kv_heads; ++hh) NaiveRope(&k[t][hh * hd], hd, pos(t), inv);
    }
    run.k_rot.push_back(k);
    run.q_rot.push_back(q);
    run.v.push_back(v);
    if (o.stale_kv) {
      for (int j = 0; j < n; ++j) o.stale_kv(l, j, &k[j], &v[j]);
    }
    for (int j = 0; j < n; ++j) {
      if (o.k_round) {
        for (double& e : k[j]) e = o.k_round(e);
      }
      if (o.v_round) {
        for (double& e : v[j]) e = o.v_round(e);
      }
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> att(qd, 0.0);
      for (int hh = 0; hh < c.n_heads; ++hh) {
        const int kh = hh / group;
        std::vector<int> seen;
        for (int j = 0; j < n; ++j) {
          if (o.visible ? o.visible(l, t, kh, j) : j <= t) seen.push_back(j);
        }
        if (seen.empty()) continue;  // sees nothing: zero attention output
        std::vector<double> s(seen.size());
        double mx = -1e300;
        for (size_t a = 0; a < seen.size(); ++a) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[t][hh * hd + i] * k[seen[a]][kh * hd + i];
          s[a] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[a]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (size_t a = 0; a < seen.size(); ++a)
          for (int i = 0; i < hd; ++i) att[hh * hd + i] += s[a] / sum * v[seen[a]][kh * hd + i];
      }
      auto out = NaiveMatVec(L.wo, {}, in(att), c.hidden);
      for (int i = 0; i < c.hidden; ++i) x[t][i] += out[i];
      auto h = in(NaiveRmsNorm(x[t], L.ffn_norm, c.eps));
      auto g = NaiveMatVec(L.gate, {}, h, c.intermediate);
      auto u = NaiveMatVec(L.up, {}, h, c.intermediate);
      std::vector<double> a(c.intermediate);
      for (int i = 0; i < c.intermediate; ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      auto d = NaiveMatVec(L.down, {}, in(a), c.hidden);
      for (int i = 0; i < c.hidden; ++i) x[t][i] += d[i];
    }
  }
  const std::vector<float>& head = w.lm_head.empty() ? w.embed : w.lm_head;
  for (int t = 0; t < n; ++t) run.logits.push_back(NaiveMatVec(head, {}, in(NaiveRmsNorm(x[t], w.final_norm, c.eps)), c.vocab));
  return run;
}

}  // namespace attic::testing
