// Rotary position embedding at arbitrary positions (HF "rotate half" layout: dimension
// i pairs with i + head_dim/2). Positions are per token, so KV that re-enters the
// compute buffer can be rotated to whatever position it now has.
//
// Thread-safety: RopeTable is immutable after construction.
#pragma once

#include <cstdint>
#include <vector>

#include "attic/model/config.h"

namespace attic::attention {

class RopeTable {
 public:
  // Inverse frequencies from rope_theta and rope_scaling (linear, llama3).
  RopeTable(const model::ModelConfig& config);
  int head_dim() const { return head_dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }

  // x: [n_tokens, n_heads, head_dim]; rotates token t by positions[t]. In place.
  void Apply(float* x, int64_t n_tokens, int n_heads, const int32_t* positions) const;
  // The inverse rotation (rotate by -position); used to recover pre-RoPE K.
  void ApplyInverse(float* x, int64_t n_tokens, int n_heads, const int32_t* positions) const;

 private:
  void Rotate(float* x, int64_t n_tokens, int n_heads, const int32_t* positions, float sign) const;
  int head_dim_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
};

}  // namespace attic::attention
