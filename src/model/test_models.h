// Test helpers for model_test: tiny configs and tensors, reading a loaded model's
// tensors back as f32, and byte-level file edits for corruption tests.
#pragma once

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "attic/model/model.h"
#include "attic/model/tensor_specs.h"
#include "attic/model/writer.h"
#include "model/random_fill.h"

namespace attic::model::testing {

// GQA Llama: 4 query heads, 2 KV heads, head_dim 8, untied.
inline ModelConfig TinyConfig() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 64;
  c.max_position_embeddings = 128;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

// Random tensors for c, with norms perturbed away from 1 so that they are checked too.
inline std::vector<NamedTensor> TinyTensors(const ModelConfig& c, uint64_t seed = 7) {
  std::vector<NamedTensor> t = RandomTensors(c, RandomWeights{seed, 0.5f});
  for (NamedTensor& n : t) {
    if (n.name.find("norm") == std::string::npos) continue;
    for (size_t i = 0; i < n.data.size(); ++i) n.data[i] = 1.0f + 0.01f * static_cast<float>(i % 7) - 0.03f;
  }
  return t;
}

inline std::vector<float> ToF32(const WeightTensor& w) {
  std::vector<float> out(static_cast<size_t>(w.numel()));
  ConvertToF32(w.dtype, w.data, out.data(), out.size());
  return out;
}

// Every tensor of a loaded model by HF name, as f32 (lm_head included even when tied).
inline std::map<std::string, std::vector<float>> LoadedTensors(const Model& m) {
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.weights();
  std::map<std::string, std::vector<float>> out;
  auto vec = [](const float* p, int64_t n) { return std::vector<float>(p, p + n); };
  out["model.embed_tokens.weight"] = ToF32(w.tok_embeddings);
  out["lm_head.weight"] = ToF32(w.lm_head);
  out["model.norm.weight"] = vec(w.final_norm, c.hidden_size);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[static_cast<size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out[p + "input_layernorm.weight"] = vec(L.attn_norm, c.hidden_size);
    out[p + "post_attention_layernorm.weight"] = vec(L.ffn_norm, c.hidden_size);
    out[p + "self_attn.q_proj.weight"] = ToF32(L.wq);
    out[p + "self_attn.k_proj.weight"] = ToF32(L.wk);
    out[p + "self_attn.v_proj.weight"] = ToF32(L.wv);
    out[p + "self_attn.o_proj.weight"] = ToF32(L.wo);
    out[p + "mlp.gate_proj.weight"] = ToF32(L.w_gate);
    out[p + "mlp.up_proj.weight"] = ToF32(L.w_up);
    out[p + "mlp.down_proj.weight"] = ToF32(L.w_down);
    if (L.bq != nullptr) {
      out[p + "self_attn.q_proj.bias"] = vec(L.bq, c.q_dim());
      out[p + "self_attn.k_proj.bias"] = vec(L.bk, c.kv_dim());
      out[p + "self_attn.v_proj.bias"] = vec(L.bv, c.kv_dim());
    }
  }
  return out;
}

// Values after a round trip through storage dtype d.
inline std::vector<float> RoundTo(DType d, const std::vector<float>& v) {
  std::vector<uint8_t> bytes(DTypeBytes(d, v.size()));
  ConvertForStorage(d, v.data(), bytes.data(), v.size());
  std::vector<float> out(v.size());
  ConvertToF32(d, bytes.data(), out.data(), v.size());
  return out;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Unlinks first: rewriting a file in place via O_TRUNC makes ext4 flush it (slow).
inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::remove(path.c_str());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace attic::model::testing
