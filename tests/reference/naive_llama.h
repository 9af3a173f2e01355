// A deliberately simple Llama forward pass for tests: double precision, no KV cache (each
// call recomputes everything from the tokens), textbook formulas written from the
// Hugging Face modeling_llama / Qwen2 definitions, sharing no code with Attic's engine.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace attic::testing {

struct NaiveConfig {
  int hidden = 0, intermediate = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, vocab = 0;
  double eps = 1e-5, theta = 10000.0;
  std::string rope_type = "none";  // none | linear | llama3
  double rope_factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int original_max_pos = 8192;
};

struct NaiveLayer {
  std::vector<float> attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, gate, up, down;  // [out, in]
};

struct NaiveWeights {
  std::vector<float> embed;     // [vocab, hidden]
  std::vector<float> final_norm;
  std::vector<float> lm_head;   // empty = tied to embed
  std::vector<NaiveLayer> layers;
};

inline std::vector<double> NaiveInvFreq(const NaiveConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<double> inv(half);
  const double pi = 3.14159265358979323846;
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(c.theta, 2.0 * i / c.head_dim);
    if (c.rope_type == "linear") {
      f /= c.rope_factor;
    } else if (c.rope_type == "llama3") {
      double low_wavelen = c.original_max_pos / c.low_freq_factor;
      double high_wavelen = c.original_max_pos / c.high_freq_factor;
      double wavelen = 2 * pi / f;
      if (wavelen > low_wavelen) {
        f = f / c.rope_factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (c.original_max_pos / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
        f = (1 - smooth) * f / c.rope_factor + smooth * f;
      }
    }
    inv[i] = f;
  }
  return inv;
}

// y[out] = W[out, in] x[in] (+ b)
inline std::vector<double> NaiveMatVec(const std::vector<float>& w, const std::vector<float>& b,
                                       const std::vector<double>& x, int out) {
  const size_t in = x.size();
  std::vector<double> y(out);
  for (int o = 0; o < out; ++o) {
    double s = b.empty() ? 0.0 : b[o];
    for (size_t i = 0; i < in; ++i) s += static_cast<double>(w[o * in + i]) * x[i];
    y[o] = s;
  }
  return y;
}

inline std::vector<double> NaiveRmsNorm(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  double r = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}

// Rotate-half RoPE of one head vector at position p.
inline void NaiveRope(double* v, int head_dim, int p, const std::vector<double>& inv) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    double a = p * inv[i];
    double x0 = v[i], x1 = v[i + half];
    v[i] = x0 * std::cos(a) - x1 * std::sin(a);
    v[i + half] = x1 * std::cos(a) + x0 * std::sin(a);
  }
}

// x rounded to the nearest bfloat16 (8 significant bits, ties to even), in double.
inline double RoundToBf16(double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e;
  const double m = std::frexp(x, &e);  // |m| in [0.5, 1)
  return std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8);
}

// Logits [n_tokens][vocab] for tokens at positions 0..n-1. act_round (optional) rounds
// each linear layer's input elements, as kernels that multiply in bf16 do.
inline std::vector<std::vector<double>> NaiveForward(const NaiveConfig& c, const NaiveWeights& w,
                                                     const std::vector<int>& tokens,
                                                     double (*act_round)(double) = nullptr) {
  auto NaiveMatVec = [act_round](const std::vector<float>& wt, const std::vector<float>& b, std::vector<double> x,
                                 int out) {
    if (act_round != nullptr)
      for (double& e : x) e = act_round(e);
    return attic::testing::NaiveMatVec(wt, b, x, out);
  };
  const int n = static_cast<int>(tokens.size());
  const int hd = c.head_dim, qd = c.n_heads * hd, kvd = c.n_kv_heads * hd;
  const auto inv = NaiveInvFreq(c);
  std::vector<std::vector<double>> x(n, std::vector<double>(c.hidden));
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < c.hidden; ++i) x[t][i] = w.embed[static_cast<size_t>(tokens[t]) * c.hidden + i];
  for (const NaiveLayer& L : w.layers) {
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      auto h = NaiveRmsNorm(x[t], L.attn_norm, c.eps);
      q[t] = NaiveMatVec(L.wq, L.bq, h, qd);
      k[t] = NaiveMatVec(L.wk, L.bk, h, kvd);
      v[t] = NaiveMatVec(L.wv, L.bv, h, kvd);
      for (int hh = 0; hh < c.n_heads; ++hh) NaiveRope(&q[t][hh * hd], hd, t, inv);
      for (int hh = 0; hh < c.n_kv_heads; ++hh) NaiveRope(&k[t][hh * hd], hd, t, inv);
    }
    const int group = c.n_heads / c.n_kv_heads;
    for (int t = 0; t < n; ++t) {
      std::vector<double> att(qd, 0.0);
      for (int hh = 0; hh < c.n_heads; ++hh) {
        int kh = hh / group;
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[t][hh * hd + i] * k[j][kh * hd + i];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (int j = 0; j <= t; ++j)
          for (int i = 0; i < hd; ++i) att[hh * hd + i] += s[j] / sum * v[j][kh * hd + i];
      }
      auto o = NaiveMatVec(L.wo, {}, att, c.hidden);
      for (int i = 0; i < c.hidden; ++i) x[t][i] += o[i];
      auto h = NaiveRmsNorm(x[t], L.ffn_norm, c.eps);
      auto g = NaiveMatVec(L.gate, {}, h, c.intermediate);
      auto u = NaiveMatVec(L.up, {}, h, c.intermediate);
      std::vector<double> a(c.intermediate);
      for (int i = 0; i < c.intermediate; ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      auto d = NaiveMatVec(L.down, {}, a, c.hidden);
      for (int i = 0; i < c.hidden; ++i) x[t][i] += d[i];
    }
  }
  const std::vector<float>& head = w.lm_head.empty() ? w.embed : w.lm_head;
  std::vector<std::vector<double>> logits(n);
  for (int t = 0; t < n; ++t) logits[t] = NaiveMatVec(head, {}, NaiveRmsNorm(x[t], w.final_norm, c.eps), c.vocab);
  return logits;
}

}  // namespace attic::testing
