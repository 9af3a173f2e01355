// Shared by the attention tests: what every ISA-parameterised suite needs besides its own
// KV layout and reference.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "attic/attention/attention.h"
#include "attic/backend/cpu_features.h"

namespace attic::attention::testing_util {

// Why this CPU cannot run `isa`'s kernels, or nullptr when it can.
inline const char* IsaUnavailable(backend::Isa isa) {
  const auto& f = backend::GetCpuFeatures();
  if (isa == backend::Isa::kAvx512 && !(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq)) {
    return "no AVX-512 on this CPU";
  }
  if (isa == backend::Isa::kAvx2 && !(f.avx2 && f.fma)) return "no AVX2/FMA on this CPU";
  return nullptr;
}

// Queries [n_q][n_heads][d] uniform in [-magnitude, magnitude].
inline std::vector<float> RandomQ(int n_q, int n_heads, int d, float magnitude, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-magnitude, magnitude);
  std::vector<float> q(static_cast<size_t>(n_q) * n_heads * d);
  for (float& x : q) x = u(rng);
  return q;
}

// The usual 1/sqrt(head_dim) scale.
inline AttentionShape Shape(int n_heads, int n_kv_heads, int d) {
  return AttentionShape{n_heads, n_kv_heads, d, 1.0f / std::sqrt(static_cast<float>(d))};
}

}  // namespace attic::attention::testing_util
