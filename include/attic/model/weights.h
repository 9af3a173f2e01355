// Weight tensors of a loaded model. Tensors point into memory-mapped checkpoint files
// when the stored dtype is what compute uses, otherwise into buffers owned by the Model.
//
// Row-major layout throughout; a linear layer y = x W^T + b has W stored [out, in].
#pragma once

#include <cstdint>
#include <vector>

#include "attic/tensor/dtype.h"

namespace attic::model {

struct WeightTensor {
  DType dtype = DType::kF32;
  const void* data = nullptr;     // nullptr = absent (e.g. no bias)
  std::vector<int64_t> shape;     // e.g. {out, in}; {n} for vectors
  // The same matrix in the CPU GEMM's packed layout (backend::PrepackWeights), or null.
  // Owned by the Model; `data` stays the reference (GEMV, embedding rows).
  const void* packed = nullptr;
  // Whose layout `packed` is in (the backend's tag: the ISA whose GEMM packed it).
  int packed_layout = 0;

  bool present() const { return data != nullptr; }
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? 1 : shape[1]; }
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  // Pointer to row r of a 2-D tensor.
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + DTypeBytes(dtype, static_cast<size_t>(r * cols()));
  }
};

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
