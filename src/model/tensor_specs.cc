#include "attic/model/tensor_specs.h"

#include <cstdlib>

namespace attic::model {

namespace {

// Per-layer suffixes: HF (after "model.layers.N.") and GGUF (after "blk.N.").
struct LayerName {
  const char* hf;
  const char* gguf;
};
constexpr LayerName kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

constexpr LayerName kGlobalNames[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

// Parses "<prefix><digits>.<rest>" into layer and rest.
bool SplitLayer(const std::string& name, const std::string& prefix, int* layer, std::string* rest) {
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  size_t p = prefix.size(), q = p;
  while (q < name.size() && q - p < 6 && name[q] >= '0' && name[q] <= '9') ++q;
  if (q == p || q >= name.size() || name[q] != '.') return false;
  *layer = std::atoi(name.substr(p, q - p).c_str());
  *rest = name.substr(q + 1);
  return true;
}

}  // namespace

std::vector<TensorSpec> ModelTensorSpecs(const ModelConfig& c) {
  const int64_t h = c.hidden_size, f = c.intermediate_size, q = c.q_dim(), kv = c.kv_dim();
  std::vector<TensorSpec> s;
  s.push_back({"model.embed_tokens.weight", {c.vocab_size, h}, TensorKind::kMatrix, -1});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s.push_back({p + "input_layernorm.weight", {h}, TensorKind::kNorm, l});
    s.push_back({p + "self_attn.q_proj.weight", {q, h}, TensorKind::kMatrix, l});
    s.push_back({p + "self_attn.k_proj.weight", {kv, h}, TensorKind::kMatrix, l});
    s.push_back({p + "self_attn.v_proj.weight", {kv, h}, TensorKind::kMatrix, l});
    if (c.attention_bias) {
      s.push_back({p + "self_attn.q_proj.bias", {q}, TensorKind::kBias, l});
      s.push_back({p + "self_attn.k_proj.bias", {kv}, TensorKind::kBias, l});
      s.push_back({p + "self_attn.v_proj.bias", {kv}, TensorKind::kBias, l});
    }
    s.push_back({p + "self_attn.o_proj.weight", {h, q}, TensorKind::kMatrix, l});
    s.push_back({p + "post_attention_layernorm.weight", {h}, TensorKind::kNorm, l});
    s.push_back({p + "mlp.gate_proj.weight", {f, h}, TensorKind::kMatrix, l});
    s.push_back({p + "mlp.up_proj.weight", {f, h}, TensorKind::kMatrix, l});
    s.push_back({p + "mlp.down_proj.weight", {h, f}, TensorKind::kMatrix, l});
  }
  s.push_back({"model.norm.weight", {h}, TensorKind::kNorm, -1});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {c.vocab_size, h}, TensorKind::kMatrix, -1});
  return s;
}

std::string HfToGgufName(const std::string& hf_name) {
  for (const LayerName& g : kGlobalNames) {
    if (hf_name == g.hf) return g.gguf;
  }
  int layer = 0;
  std::string rest;
  if (!SplitLayer(hf_name, "model.layers.", &layer, &rest)) return "";
  for (const LayerName& n : kLayerNames) {
    if (rest == n.hf) return "blk." + std::to_string(layer) + "." + n.gguf;
  }
  return "";
}

std::string GgufToHfName(const std::string& gguf_name) {
  for (const LayerName& g : kGlobalNames) {
    if (gguf_name == g.gguf) return g.hf;
  }
  int layer = 0;
  std::string rest;
  if (!SplitLayer(gguf_name, "blk.", &layer, &rest)) return "";
  for (const LayerName& n : kLayerNames) {
    if (rest == n.gguf) return "model.layers." + std::to_string(layer) + "." + n.hf;
  }
  return "";
}

bool IsRopePermuted(const std::string& hf_name) {
  auto ends_with = [&](const char* s) {
    std::string suf(s);
    return hf_name.size() >= suf.size() && hf_name.compare(hf_name.size() - suf.size(), suf.size(), suf) == 0;
  };
  return hf_name.rfind("model.layers.", 0) == 0 &&
         (ends_with(".self_attn.q_proj.weight") || ends_with(".self_attn.k_proj.weight"));
}

}  // namespace attic::model
