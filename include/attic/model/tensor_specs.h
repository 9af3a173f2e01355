// The tensors a Llama-family checkpoint holds for a given config: Hugging Face names,
// Attic's [out, in] shapes, and the matching GGUF (llama.cpp) names. Shared by the
// loaders (to validate a checkpoint) and the writers (to produce one).
//
// Thread-safety: stateless free functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attic/model/config.h"

namespace attic::model {

enum class TensorKind {
  kMatrix,  // a linear layer's weight (or the embedding table): stored dtype kept at load
  kNorm,    // RMSNorm weight: converted to f32 at load; written as ones by random writers
  kBias,    // q/k/v bias: converted to f32 at load
};

struct TensorSpec {
  std::string name;            // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // [out, in] for matrices, [n] for vectors
  TensorKind kind = TensorKind::kMatrix;
  int layer = -1;              // -1 for embeddings, final norm and lm_head

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Every tensor of the model in canonical order: embed_tokens, then per layer
// input_layernorm, q/k/v (+ biases when c.attention_bias), o, post_attention_layernorm,
// gate, up, down; then model.norm and (unless tied) lm_head.
// REQUIRES: c.Validate().ok().
std::vector<TensorSpec> ModelTensorSpecs(const ModelConfig& c);

// "model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight" (and embed_tokens ->
// token_embd, model.norm -> output_norm, lm_head -> output); "" if it has no GGUF name.
std::string HfToGgufName(const std::string& hf_name);
// The inverse; "" for GGUF names that are not part of a Llama model.
std::string GgufToHfName(const std::string& gguf_name);

// True for q_proj / k_proj weights, whose rows llama.cpp's converter permutes into
// GGUF's interleaved-RoPE order.
bool IsRopePermuted(const std::string& hf_name);

// Row r of an HF-layout q/k matrix (rotate-half RoPE: head h, half i, pair j at
// h*head_dim + i*head_dim/2 + j) sits at GGUF row h*head_dim + 2*j + i.
inline int64_t HfRowToGgufRow(int64_t r, int head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t h = r / head_dim, w = r % head_dim;
  return h * head_dim + 2 * (w % half) + w / half;
}

}  // namespace attic::model
