#include "attic/engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace attic::engine {

Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) return InvalidArgumentError("temperature must be >= 0");
  if (top_k < 0) return InvalidArgumentError("top_k must be >= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return InvalidArgumentError("top_p must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return InvalidArgumentError("min_p must be in [0, 1]");
  if (max_tokens < 0) return InvalidArgumentError("max_tokens must be >= 0");
  for (const auto& s : stop_strings) {
    if (s.empty()) return InvalidArgumentError("stop strings must not be empty");
  }
  return OkStatus();
}

int32_t Argmax(const float* x, int n) {
  int32_t best = 0;
  float bv = x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] > bv) {
      bv = x[i];
      best = i;
    }
  }
  return best;
}

uint64_t ChoiceSeed(uint64_t seed, int index) {
  if (index == 0) return seed;
  // SplitMix64 (Steele, Lea, Flood 2014): one step from seed + index * golden gamma.
  uint64_t z = seed + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

// Cost: expected O(vocab), no sort (sorting a 49k vocabulary took ~3.9 ms per token, more
// than a 135M model's decode step for a batch of streams). Candidates are walked in an
// order that depends only on the logits, so a seed still fixes the tokens.
int32_t Sampler::Sample(float* logits, int vocab) {
  if (params_.temperature <= 0.0f || params_.top_k == 1) return Argmax(logits, vocab);
  const double inv_t = 1.0 / params_.temperature;
  cand_.resize(vocab);
  for (int i = 0; i < vocab; ++i) cand_[i] = {logits[i], i, 0.0};
  // Most likely first; ties by id, for determinism.
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  if (params_.top_k > 0 && params_.top_k < vocab) {  // the k best, in no particular order
    std::nth_element(cand_.begin(), cand_.begin() + (params_.top_k - 1), cand_.end(), by_logit);
    cand_.resize(params_.top_k);
  }
  float mx = cand_[0].logit;
  for (const Candidate& c : cand_) mx = std::max(mx, c.logit);
  // Softmax weights with temperature (in double for stability and reproducibility); the
  // best token's weight is 1.
  for (Candidate& c : cand_) c.weight = std::exp((static_cast<double>(c.logit) - mx) * inv_t);
  if (params_.min_p > 0.0f) {  // p >= min_p * p_max
    const double thr = params_.min_p;
    cand_.erase(std::remove_if(cand_.begin(), cand_.end(), [thr](const Candidate& c) { return c.weight < thr; }),
                cand_.end());
  }
  double total = 0;
  for (const Candidate& c : cand_) total += c.weight;
  size_t n = cand_.size();
  if (params_.top_p < 1.0f) {
    // The fewest most likely tokens whose mass reaches top_p, found by a quickselect on
    // the mass (expected O(vocab), no sort): [0, lo) is kept, the answer's rest is the
    // best prefix of [lo, hi) with mass >= need.
    double need = params_.top_p * total;
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      std::nth_element(cand_.begin() + lo, cand_.begin() + mid, cand_.begin() + hi, by_logit);
      double mass = 0;  // of [lo, mid): the mid - lo best of [lo, hi)
      for (size_t i = lo; i < mid; ++i) mass += cand_[i].weight;
      if (mass >= need) {
        hi = mid;
      } else {
        need -= mass;
        lo = mid;
      }
    }
    n = lo + 1;
    total = 0;
    for (size_t i = 0; i < n; ++i) total += cand_[i].weight;
  }
  // Uniform in [0, total) from 53 random bits: identical on every platform.
  const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += cand_[i].weight;
    if (u < acc) return cand_[i].id;
  }
  return cand_[n - 1].id;
}

size_t FindStopString(const std::string& text, const std::vector<std::string>& stops, size_t from) {
  size_t best = std::string::npos;
  for (const auto& s : stops) {
    size_t start = from >= s.size() ? from - s.size() + 1 : 0;  // a stop may straddle `from`
    size_t p = text.find(s, start);
    if (p != std::string::npos && p < best) best = p;
  }
  return best;
}

size_t StopPrefixHoldback(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > hold; --len) {
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

}  // namespace attic::engine
