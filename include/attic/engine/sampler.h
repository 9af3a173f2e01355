// Sampling: greedy, temperature, top-k, top-p, min-p; seed-deterministic (the same seed,
// logits and parameters give the same tokens on every run and machine).
//
// Thread-safety: a Sampler holds RNG state; use one per sequence.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attic/core/status.h"

namespace attic::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax; ties -> lowest id)
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off; keep tokens with p >= min_p * p_max
  uint64_t seed = 0;
  int max_tokens = 256;
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one of these (not shown)
  std::vector<std::string> stop_strings;  // generation ends before the first occurrence

  // InvalidArgument naming the bad field.
  Status Validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks a token from logits[0..vocab). `logits` is used as scratch.
  int32_t Sample(float* logits, int vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  struct Candidate {
    float logit;
    int32_t id;
    double weight;  // exp((logit - max) / temperature)
  };
  std::vector<Candidate> cand_;
};

int32_t Argmax(const float* x, int n);

// The seed of choice `index` of a request seeded `seed` that asks for several choices
// (GenerationRequest::n): choice 0 keeps `seed` (it samples what the request with n = 1
// samples); choice i > 0 gets SplitMix64's output for seed + i * 0x9E3779B97F4A7C15, so
// the choices differ from each other and the same request gets the same choices again.
uint64_t ChoiceSeed(uint64_t seed, int index);

// Finds the earliest occurrence of any stop string in `text` at or after `from`
// (std::string::npos if none).
size_t FindStopString(const std::string& text, const std::vector<std::string>& stops, size_t from = 0);
// Longest suffix of `text` that is a proper prefix of some stop string: text that must be
// held back while streaming because a stop string may be forming.
size_t StopPrefixHoldback(const std::string& text, const std::vector<std::string>& stops);

}  // namespace attic::engine
