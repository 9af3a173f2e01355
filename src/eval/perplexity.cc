#include "attic/eval/perplexity.h"

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
                                    const std::function<void(int, int)>& progress) {
  ATTIC_CHECK(!methods.empty());
  using Clock = std::chrono::steady_clock;
  LengthResult r;
  r.length = windows.empty() ? 0 : static_cast<int>(windows[0].size());
  r.first_scored = first_scored;
  r.n_windows = static_cast<int>(windows.size());
  for (Method* m : methods) r.methods.push_back({m->name(), {}, 0});
  std::vector<float> ref, got;
  for (size_t w = 0; w < windows.size(); ++w) {
    const std::vector<int32_t>& tokens = windows[w];
    const size_t n_rows = tokens.size() - static_cast<size_t>(first_scored);
    for (size_t m = 0; m < methods.size(); ++m) {
      std::vector<float>& logits = m == 0 ? ref : got;
      const auto t0 = Clock::now();
      Status st = methods[m]->Score(tokens, first_scored, &logits);
      r.methods[m].seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      if (!st.ok()) return st.WithContext(methods[m]->name() + ", window " + std::to_string(w));
      if (logits.size() != n_rows * static_cast<size_t>(vocab)) {
        return InternalError("method " + methods[m]->name() + " returned " + std::to_string(logits.size()) +
                             " logits for " + std::to_string(n_rows) + " positions of " + std::to_string(vocab));
      }
      ScoreAccumulator& acc = r.methods[m].scores;
      acc.BeginWindow();
      for (size_t i = 0; i < n_rows; ++i) {
        const float* q = logits.data() + i * static_cast<size_t>(vocab);
        const float* p = ref.data() + i * static_cast<size_t>(vocab);
        const int32_t target = tokens[static_cast<size_t>(first_scored) + i];
        acc.Add(NegLogLikelihood(q, vocab, target), m == 0 ? 0.0 : KlDivergence(p, q, vocab),
                m == 0 || engine::Argmax(p, vocab) == engine::Argmax(q, vocab));
      }
    }
    if (progress) progress(static_cast<int>(w) + 1, static_cast<int>(windows.size()));
  }
  return r;
}

namespace {

// NaN (a standard error of one window) as JSON null.
nlohmann::json Number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

}  // namespace

nlohmann::json ToJson(const PerplexityRun& run) {
  nlohmann::json out;
  out["model"] = run.model;
  out["text"] = run.text;
  out["text_tokens"] = run.text_tokens;
  out["score_from"] = run.score_from;
  out["reference_method"] = kReferenceMethod;
  nlohmann::json rows = nlohmann::json::array();
  for (const LengthResult& l : run.lengths) {
    for (const MethodScores& m : l.methods) {
      const ScoreAccumulator& s = m.scores;
      const double se = s.nll_standard_error();
      rows.push_back({{"length", l.length},
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
                      {"seconds", m.seconds}});
    }
  }
  out["results"] = rows;
  return out;
}

std::string ToMarkdown(const PerplexityRun& run) {
  std::string s =
      "| length | method | windows | scored tokens | perplexity | ± s.e. | mean NLL | KL vs full | top-1 vs full |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  char buf[512];
  for (const LengthResult& l : run.lengths) {
    for (const MethodScores& m : l.methods) {
      const ScoreAccumulator& a = m.scores;
      const double se = a.nll_standard_error();
      char se_text[32] = "n/a";
      if (std::isfinite(se)) std::snprintf(se_text, sizeof(se_text), "%.4g", a.perplexity() * se);
      std::snprintf(buf, sizeof(buf), "| %d | %s | %d | %lld | %.4f | %s | %.5f | %.3g | %.4f |\n", l.length,
                    m.method.c_str(), l.n_windows, static_cast<long long>(a.n_tokens()), a.perplexity(), se_text,
                    a.mean_nll(), a.mean_kl(), a.top1_agreement());
      s += buf;
    }
  }
  return s;
}

}  // namespace attic::eval
