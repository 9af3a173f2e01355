// `attic eval link`'s outputs: JSON, markdown tables and an SVG scatter written by hand
// (attic/eval/link_eval.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "attic/eval/link_eval.h"

namespace attic::eval {

namespace {

std::string Num(double x, const char* fmt) {
  if (!std::isfinite(x)) return "n/a";
  char buf[48];
  std::snprintf(buf, sizeof(buf), fmt, x);
  return buf;
}

double Share(const LinkCell& c) {
  return c.linked > 0 ? static_cast<double>(c.recomputed) / static_cast<double>(c.linked) : 1.0;
}

double LinkMs(const LinkCell& c) { return c.n_prompts > 0 ? 1e3 * c.link_seconds / c.n_prompts : 0; }

std::vector<std::string> Splits(const LinkRun& run) {
  std::vector<std::string> s;
  for (const LinkCell& c : run.cells)
    if (std::find(s.begin(), s.end(), c.split) == s.end()) s.push_back(c.split);
  return s;
}

const LinkCell* Find(const LinkRun& run, const std::string& split, const std::string& order, const std::string& method) {
  for (const LinkCell& c : run.cells)
    if (c.split == split && c.order == order && c.method == method) return &c;
  return nullptr;
}

}  // namespace

nlohmann::json ToJson(const LinkRun& run) {
  nlohmann::json js;
  js["model"] = run.model;
  js["source"] = run.source;
  js["chunk_store_dtype"] = run.chunk_store_dtype;
  js["prompts"] = run.n_prompts;
  js["chunk_tokens"] = run.options.chunk_tokens;
  js["greedy_tokens"] = run.options.greedy_tokens;
  js["seed"] = run.options.seed;
  js["methods"] = run.methods;
  nlohmann::json cells = nlohmann::json::array();
  for (const LinkCell& c : run.cells) {
    nlohmann::json j;
    j["split"] = c.split;
    j["order"] = c.order;
    j["method"] = c.method;
    j["prompts"] = c.n_prompts;
    j["mean_chunks"] = c.n_prompts > 0 ? static_cast<double>(c.n_chunks) / c.n_prompts : 0;
    j["scored_tokens"] = c.scores.n_tokens();
    j["kl_mean"] = c.scores.mean_kl();
    j["kl_max"] = c.scores.max_kl();
    j["perplexity"] = c.scores.perplexity();
    j["mean_nll"] = c.scores.mean_nll();
    const double se = c.scores.nll_standard_error();
    j["nll_se"] = std::isfinite(se) ? nlohmann::json(se) : nlohmann::json(nullptr);
    j["top1_agreement"] = c.scores.top1_agreement();
    j["greedy_agreement"] = c.greedy_agreement;
    if (c.exact_of > 0) j["exact_match"] = static_cast<double>(c.exact) / c.exact_of;
    j["recomputed_tokens"] = c.recomputed;
    j["linked_tokens"] = c.linked;
    j["first_token_ms"] = LinkMs(c);
    cells.push_back(std::move(j));
  }
  js["cells"] = std::move(cells);
  return js;
}

std::string ToMarkdown(const LinkRun& run) {
  std::ostringstream o;
  bool exact = false;
  for (const LinkCell& c : run.cells) exact = exact || c.exact_of > 0;
  for (const std::string& split : Splits(run)) {
    const LinkCell* ref = Find(run, split, "all", run.methods[0]);
    o << "split " << split << ", chunks of at most " << run.options.chunk_tokens << " tokens ("
      << Num(ref && ref->n_prompts ? static_cast<double>(ref->n_chunks) / ref->n_prompts : 0, "%.1f")
      << " per prompt), " << run.n_prompts << " prompts x " << run.options.orders.size() << " orders\n\n";
    o << "| method | KL vs full | KL max | perplexity | ± s.e. | top-1 vs full | greedy agreement |"
      << (exact ? " exact match |" : "") << " recomputed | first token ms |\n";
    o << "|---|---|---|---|---|---|---|" << (exact ? "---|" : "") << "---|---|\n";
    for (const std::string& m : run.methods) {
      const LinkCell* c = Find(run, split, "all", m);
      if (c == nullptr) continue;
      const double ppl = c->scores.perplexity();
      o << "| " << m << " | " << Num(c->scores.mean_kl(), "%.4f") << " | " << Num(c->scores.max_kl(), "%.3f") << " | "
        << Num(ppl, "%.3f") << " | " << Num(ppl * c->scores.nll_standard_error(), "%.3f") << " | "
        << Num(c->scores.top1_agreement(), "%.4f") << " | " << Num(c->greedy_agreement, "%.3f") << " |";
      if (exact) o << " " << (c->exact_of > 0 ? Num(static_cast<double>(c->exact) / c->exact_of, "%.2f") : "") << " |";
      o << " " << (c->linked > 0 ? Num(100 * Share(*c), "%.1f%%") : "all") << " | " << Num(LinkMs(*c), "%.2f")
        << " |\n";
    }
    o << "\nKL vs full by chunk order (" << split << ")\n\n| method |";
    for (ChunkOrder ord : run.options.orders) o << " " << ChunkOrderName(ord) << " |";
    o << "\n|---|";
    for (size_t i = 0; i < run.options.orders.size(); ++i) o << "---|";
    o << "\n";
    for (const std::string& m : run.methods) {
      o << "| " << m << " |";
      for (ChunkOrder ord : run.options.orders) {
        const LinkCell* c = Find(run, split, ChunkOrderName(ord), m);
        o << " " << (c ? Num(c->scores.mean_kl(), "%.4f") : "") << " |";
      }
      o << "\n";
    }
    o << "\n";
  }
  return o.str();
}

std::string ToSvg(const LinkRun& run) {
  // A panel per split: x the share of linked chunk tokens recomputed (0..1), y KL vs full
  // on a log scale; full (KL 0) is not drawn.
  const std::vector<std::string> splits = Splits(run);
  const int pw = 420, ph = 320, ml = 60, mt = 40, mb = 50;
  double lo = 1e9, hi = -1e9;
  for (const LinkCell& c : run.cells) {
    const double kl = c.scores.mean_kl();
    if (c.order != "all" || !(kl > 0)) continue;
    lo = std::min(lo, std::log10(kl));
    hi = std::max(hi, std::log10(kl));
  }
  if (lo > hi) lo = -4, hi = 0;
  lo = std::floor(lo), hi = std::ceil(hi);
  if (hi <= lo) hi = lo + 1;
  const int width = static_cast<int>(splits.size()) * (pw + ml) + 20, height = ph + mt + mb;
  const std::string model = run.model.substr(run.model.find_last_of('/') + 1);  // the folder's name
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t s = 0; s < splits.size(); ++s) {
    const int x0 = ml + static_cast<int>(s) * (pw + ml), y0 = mt;
    o << "<text x=\"" << x0 << "\" y=\"20\" font-size=\"13\">" << model << ", split " << splits[s]
      << ": KL vs full (log) by share recomputed</text>\n";
    o << "<rect x=\"" << x0 << "\" y=\"" << y0 << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#888\"/>\n";
    for (int e = static_cast<int>(lo); e <= static_cast<int>(hi); ++e) {
      const double y = y0 + ph - (e - lo) / (hi - lo) * ph;
      o << "<text x=\"" << x0 - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">1e" << e << "</text>\n";
    }
    for (int t = 0; t <= 4; ++t) {
      o << "<text x=\"" << x0 + t * pw / 4 << "\" y=\"" << y0 + ph + 16 << "\" text-anchor=\"middle\">" << t * 25
        << "%</text>\n";
    }
    o << "<text x=\"" << x0 + pw / 2 << "\" y=\"" << y0 + ph + 36 << "\" text-anchor=\"middle\">chunk tokens recomputed</text>\n";
    for (const LinkCell& c : run.cells) {
      const double kl = c.scores.mean_kl();
      if (c.split != splits[s] || c.order != "all" || !(kl > 0)) continue;
      const double x = x0 + Share(c) * pw, y = y0 + ph - (std::log10(kl) - lo) / (hi - lo) * ph;
      const char* colour = c.method.rfind("attnlink", 0) == 0     ? "#2166ac"
                           : c.method.rfind("cacheblend", 0) == 0 ? "#e08214"
                                                                  : "#d73027";
      const bool bos = c.method.find("+bos") != std::string::npos;
      o << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"4\" fill=\"" << (bos ? "white" : colour)
        << "\" stroke=\"" << colour << "\" stroke-width=\"2\"/>\n";
      o << "<text x=\"" << x + 6 << "\" y=\"" << y - 4 << "\" fill=\"" << colour << "\">" << c.method << "</text>\n";
    }
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace attic::eval
