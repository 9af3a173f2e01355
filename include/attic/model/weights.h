// Weight tensors of a loaded model (each a WeightTensor, tensor/weight_tensor.h). Tensors
// point into memory-mapped checkpoint files when the stored dtype is what compute uses,
// otherwise into buffers owned by the Model.
//
// Row-major layout throughout; a linear layer y = x W^T + b has W stored [out, in].
#pragma once

#include <cstdint>
#include <vector>

#include "attic/tensor/weight_tensor.h"

namespace attic::model {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [hidden] (always converted to f32 at load)
  WeightTensor wq;                   // [n_heads*head_dim, hidden]   (HF q/k row order: rotate-half RoPE)
  WeightTensor wk;                   // [n_kv_heads*head_dim, hidden]
  WeightTensor wv;                   // [n_kv_heads*head_dim, hidden]
  WeightTensor wo;                   // [hidden, n_heads*head_dim]
  const float* bq = nullptr;         // optional biases, f32
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* ffn_norm = nullptr;   // [hidden]
  WeightTensor w_gate;               // [intermediate, hidden]
  WeightTensor w_up;                 // [intermediate, hidden]
  WeightTensor w_down;               // [hidden, intermediate]
};

struct ModelWeights {
  WeightTensor tok_embeddings;       // [vocab, hidden]
  const float* final_norm = nullptr; // [hidden]
  WeightTensor lm_head;              // [vocab, hidden]; aliases tok_embeddings when tied
  std::vector<LayerWeights> layers;
};

}  // namespace attic::model
