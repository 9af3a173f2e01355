// The model shapes the kernel and attention benchmarks time Attic on: SmolLM2-135M and a
// Llama-3.2-1B-like shape, both with SmolLM2's 49,152-token vocabulary (the random-weight
// models `attic make-model --shape ...` writes; docs/benchmarks.md). One table, so that
// every program's "llama-1b" is the same shape. Immutable; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace attic::bench {

struct ModelShape {
  const char* name;  // "smollm2-135m", "llama-1b"
  int hidden;        // hidden_size
  int n_heads, n_kv_heads, head_dim;
  int ffn;           // intermediate_size
  int n_layers;
  int vocab;
  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
};

// smollm2-135m, then llama-1b.
const std::vector<ModelShape>& BenchModelShapes();

}  // namespace attic::bench
