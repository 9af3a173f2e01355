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

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::Sample(float* logits, int vocab) {
  if (params_.temperature <= 0.0f || params_.top_k == 1) return Argmax(logits, vocab);
  // Candidates sorted by logit (descending; ties by id for determinism).
  cand_.clear();
  cand_.reserve(vocab);
  for (int i = 0; i < vocab; ++i) cand_.emplace_back(logits[i], i);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = cand_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = params_.top_k;
    std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_logit);
    cand_.resize(keep);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax with temperature (in double for stability and reproducibility).
  const double inv_t = 1.0 / params_.temperature;
  const double mx = cand_[0].first;
  std::vector<double> p(cand_.size());
  double sum = 0;
  for (size_t i = 0; i < cand_.size(); ++i) {
    p[i] = std::exp((cand_[i].first - mx) * inv_t);
    sum += p[i];
  }
  for (auto& x : p) x /= sum;
  size_t n = cand_.size();
  if (params_.min_p > 0.0f) {
    double thr = params_.min_p * p[0];
    size_t m = 1;
    while (m < n && p[m] >= thr) ++m;
    n = m;
  }
  if (params_.top_p < 1.0f) {
    double cum = 0;
    size_t m = 0;
    while (m < n) {
      cum += p[m++];
      if (cum >= params_.top_p) break;
    }
    n = std::max<size_t>(1, m);
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += p[i];
  // Uniform in [0, total) from 53 random bits: identical on every platform.
  double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) return cand_[i].second;
  }
  return cand_[n - 1].second;
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
