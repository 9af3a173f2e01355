#include "attic/eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "attic/engine/sampler.h"

namespace attic::eval {

std::vector<std::vector<int32_t>> MakeWindows(const std::vector<int32_t>& text_tokens, int32_t bos, int length,
                                              int max_windows) {
  ATTIC_CHECK(length >= 2);
  const size_t per_window = static_cast<size_t>(bos >= 0 ? length - 1 : length);  // text tokens per window
  std::vector<std::vector<int32_t>> windows;
  for (size_t at = 0; at + per_window <= text_tokens.size(); at += per_window) {
    if (max_windows > 0 && static_cast<int>(windows.size()) == max_windows) break;
    std::vector<int32_t> w;
    w.reserve(static_cast<size_t>(length));
    if (bos >= 0) w.push_back(bos);
    w.insert(w.end(), text_tokens.begin() + static_cast<std::ptrdiff_t>(at),
             text_tokens.begin() + static_cast<std::ptrdiff_t>(at + per_window));
    windows.push_back(std::move(w));
  }
  return windows;
}

StatusOr<LengthResult> ScoreWindows(const std::vector<Method*>& methods,
                                    const std::vector<std::vector<int32_t>>& windows, int first_scored, int vocab,
                                    const std::function<void(int, int)>& progress,
                                    const std::vector<KvTypePoint>& kv_types) {
  ATTIC_CHECK(!methods.empty());
  using Clock = std::chrono::steady_clock;
  const size_t n_methods = methods.size();
  const size_t n_kv = std::max<size_t>(1, kv_types.size());
  LengthResult r;
  r.length = windows.empty() ? 0 : static_cast<int>(windows[0].size());
  r.first_scored = first_scored;
  r.n_windows = static_cast<int>(windows.size());
  for (size_t k = 0; k < n_kv; ++k)
    for (Method* m : methods) r.methods.push_back({m->name(), kv_types.empty() ? "" : kv_types[k].name, {}, {}, 0});
  // ref_kv[m]: method m's logits on the first KV type; full: methods[0]'s on the current one.
  std::vector<std::vector<float>> ref_kv(n_methods);
  std::vector<float> full, got;
  for (size_t w = 0; w < windows.size(); ++w) {
    const std::vector<int32_t>& tokens = windows[w];
    const size_t n_rows = tokens.size() - static_cast<size_t>(first_scored);
    for (size_t k = 0; k < n_kv; ++k) {
      if (!kv_types.empty() && kv_types[k].select) {
        if (Status st = kv_types[k].select(); !st.ok()) return st.WithContext("KV type " + kv_types[k].name);
      }
      for (size_t m = 0; m < n_methods; ++m) {
        std::vector<float>& logits = k == 0 ? ref_kv[m] : m == 0 ? full : got;
        const std::vector<float>& full_here = k == 0 ? ref_kv[0] : full;
        MethodScores& row = r.methods[k * n_methods + m];
        const auto t0 = Clock::now();
        Status st = methods[m]->Score(tokens, first_scored, &logits);
        row.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
        if (!st.ok()) {
          std::string where = methods[m]->name() + ", window " + std::to_string(w);
          if (!kv_types.empty()) where += ", " + kv_types[k].name + " KV";
          return st.WithContext(where);
        }
        if (logits.size() != n_rows * static_cast<size_t>(vocab)) {
          return InternalError("method " + methods[m]->name() + " returned " + std::to_string(logits.size()) +
                               " logits for " + std::to_string(n_rows) + " positions of " + std::to_string(vocab));
        }
        row.scores.BeginWindow();
        row.vs_reference_kv.BeginWindow();
        for (size_t i = 0; i < n_rows; ++i) {
          const size_t at = i * static_cast<size_t>(vocab);
          const float* q = logits.data() + at;
          const float* p = full_here.data() + at;
          const float* same = ref_kv[m].data() + at;  // this method on the first KV type
          const int32_t target = tokens[static_cast<size_t>(first_scored) + i];
          const double nll = NegLogLikelihood(q, vocab, target);
          const int32_t top = engine::Argmax(q, vocab);
          row.scores.Add(nll, m == 0 ? 0.0 : KlDivergence(p, q, vocab), m == 0 || engine::Argmax(p, vocab) == top);
          row.vs_reference_kv.Add(nll, k == 0 ? 0.0 : KlDivergence(same, q, vocab),
                                  k == 0 || engine::Argmax(same, vocab) == top);
        }
      }
    }
    if (progress) progress(static_cast<int>(w) + 1, static_cast<int>(windows.size()));
  }
  return r;
}

namespace {

// NaN (a standard error of one window) as JSON null.
nlohmann::json Number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

// The perplexity of the same method as l.methods[i] on the reference KV type.
double ReferenceKvPerplexity(const LengthResult& l, size_t i, size_t n_kv) {
  const size_t n_methods = l.methods.size() / n_kv;
  return l.methods[i % n_methods].scores.perplexity();
}

}  // namespace

nlohmann::json ToJson(const PerplexityRun& run) {
  nlohmann::json out;
  out["model"] = run.model;
  out["text"] = run.text;
  out["text_tokens"] = run.text_tokens;
  out["score_from"] = run.score_from;
  out["reference_method"] = kReferenceMethod;
  const bool kv_axis = !run.kv_dtypes.empty();
  const size_t n_kv = std::max<size_t>(1, run.kv_dtypes.size());
  if (kv_axis) {
    out["kv_dtypes"] = run.kv_dtypes;
    out["reference_kv_dtype"] = run.kv_dtypes[0];
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const LengthResult& l : run.lengths) {
    for (size_t i = 0; i < l.methods.size(); ++i) {
      const MethodScores& m = l.methods[i];
      const ScoreAccumulator& s = m.scores;
      const double se = s.nll_standard_error();
      nlohmann::json row = {{"length", l.length},
                            {"method", m.method},
                            {"windows", l.n_windows},
                            {"scored_tokens", s.n_tokens()},
                            {"perplexity", Number(s.perplexity())},
                            {"mean_nll", Number(s.mean_nll())},
                            {"nll_standard_error", Number(se)},
                            {"perplexity_standard_error", Number(s.perplexity() * se)},
                            {"kl_mean", Number(s.mean_kl())},
                            {"kl_max", Number(s.max_kl())},
                            {"top1_agreement", Number(s.top1_agreement())},
                            {"seconds", m.seconds}};
      if (kv_axis) {
        const ScoreAccumulator& v = m.vs_reference_kv;
        row["kv_dtype"] = m.kv_dtype;
        row["perplexity_vs_reference_kv_pct"] = Number(100 * (s.perplexity() / ReferenceKvPerplexity(l, i, n_kv) - 1));
        row["kl_vs_reference_kv_mean"] = Number(v.mean_kl());
        row["kl_vs_reference_kv_max"] = Number(v.max_kl());
        row["top1_vs_reference_kv"] = Number(v.top1_agreement());
      }
      rows.push_back(std::move(row));
    }
  }
  out["results"] = rows;
  return out;
}

std::string ToMarkdown(const PerplexityRun& run) {
  const bool kv_axis = !run.kv_dtypes.empty();
  const size_t n_kv = std::max<size_t>(1, run.kv_dtypes.size());
  std::string s;
  if (kv_axis) {
    const std::string ref = run.kv_dtypes[0];
    s = "| length | KV | method | windows | scored tokens | perplexity | ± s.e. | vs " + ref + " KV | KL vs " + ref +
        " KV | top-1 vs " + ref + " KV | KL vs full | top-1 vs full |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  } else {
    s = "| length | method | windows | scored tokens | perplexity | ± s.e. | mean NLL | KL vs full | top-1 vs full |\n"
        "|---|---|---|---|---|---|---|---|---|\n";
  }
  char buf[512];
  for (const LengthResult& l : run.lengths) {
    for (size_t i = 0; i < l.methods.size(); ++i) {
      const MethodScores& m = l.methods[i];
      const ScoreAccumulator& a = m.scores;
      const double se = a.nll_standard_error();
      char se_text[32] = "n/a";
      if (std::isfinite(se)) std::snprintf(se_text, sizeof(se_text), "%.4g", a.perplexity() * se);
      if (kv_axis) {
        const ScoreAccumulator& v = m.vs_reference_kv;
        std::snprintf(buf, sizeof(buf), "| %d | %s | %s | %d | %lld | %.4f | %s | %+.3f%% | %.3g | %.4f | %.3g | %.4f |\n",
                      l.length, m.kv_dtype.c_str(), m.method.c_str(), l.n_windows,
                      static_cast<long long>(a.n_tokens()), a.perplexity(), se_text,
                      100 * (a.perplexity() / ReferenceKvPerplexity(l, i, n_kv) - 1), v.mean_kl(), v.top1_agreement(),
                      a.mean_kl(), a.top1_agreement());
      } else {
        std::snprintf(buf, sizeof(buf), "| %d | %s | %d | %lld | %.4f | %s | %.5f | %.3g | %.4f |\n", l.length,
                      m.method.c_str(), l.n_windows, static_cast<long long>(a.n_tokens()), a.perplexity(), se_text,
                      a.mean_nll(), a.mean_kl(), a.top1_agreement());
      }
      s += buf;
    }
  }
  return s;
}

}  // namespace attic::eval
