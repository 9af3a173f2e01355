// The needle grid's outputs: JSON (every trial and every cell), markdown tables and an
// SVG heatmap written by hand (a few rectangles and labels need no plotting library).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "attic/eval/needle.h"

namespace attic::eval {

namespace {

std::string Fixed(double x, int digits) {
  if (!std::isfinite(x)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, x);
  return buf;
}

std::string XmlEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// Red (0) -> yellow (0.5) -> green (1), as in the usual needle-in-a-haystack plots.
std::string Colour(double v) {
  if (!std::isfinite(v)) return "#dddddd";
  const double lo[3] = {215, 48, 39}, mid[3] = {254, 224, 139}, hi[3] = {26, 152, 80};
  const double t = v < 0.5 ? v * 2 : (v - 0.5) * 2;
  const double* a = v < 0.5 ? lo : mid;
  const double* b = v < 0.5 ? mid : hi;
  char buf[16];
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", static_cast<int>(std::lround(a[0] + (b[0] - a[0]) * t)),
                static_cast<int>(std::lround(a[1] + (b[1] - a[1]) * t)),
                static_cast<int>(std::lround(a[2] + (b[2] - a[2]) * t)));
  return buf;
}

// "stories260K-hf" for ".../stories260K-hf/" or a GGUF file's name.
std::string ModelName(const std::string& path) {
  std::filesystem::path p(path);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

bool AnyBeyondTrainedLength(const NeedleRun& run) {
  for (int length : run.options.lengths)
    if (run.trained_length > 0 && length > run.trained_length) return true;
  return false;
}

std::string LengthLabel(const NeedleRun& run, int length) {
  std::string s = std::to_string(length);
  if (run.trained_length > 0 && length > run.trained_length) s += "\u2020";  // dagger
  return s;
}

}  // namespace

nlohmann::json ToJson(const NeedleRun& run) {
  nlohmann::json out;
  out["model"] = run.model;
  out["haystack"] = run.haystack;
  out["trained_length"] = run.trained_length;
  out["lengths"] = run.options.lengths;
  out["depths"] = run.options.depths;
  nlohmann::json kinds = nlohmann::json::array();
  for (NeedleKind k : run.options.kinds) kinds.push_back(NeedleKindName(k));
  out["needles"] = kinds;
  out["trials"] = run.options.trials;
  out["seed"] = run.options.seed;
  out["methods"] = run.methods;
  nlohmann::json cells = nlohmann::json::array();
  for (const std::string& m : run.methods) {
    for (NeedleKind k : run.options.kinds) {
      for (int length : run.options.lengths) {
        for (double depth : run.options.depths) {
          const double acc = CellAccuracy(run, m, k, length, depth);
          cells.push_back({{"method", m},
                           {"needle", NeedleKindName(k)},
                           {"length", length},
                           {"depth", depth},
                           {"exact_match", std::isfinite(acc) ? nlohmann::json(acc) : nlohmann::json(nullptr)}});
        }
      }
    }
  }
  out["cells"] = cells;
  nlohmann::json trials = nlohmann::json::array();
  for (const NeedleTrial& t : run.trials) {
    trials.push_back({{"method", t.method},
                      {"needle", NeedleKindName(t.kind)},
                      {"length", t.length},
                      {"depth", t.depth},
                      {"trial", t.trial},
                      {"prompt_tokens", t.n_tokens},
                      {"actual_depth", t.actual_depth},
                      {"answer", t.answer},
                      {"output", t.output},
                      {"correct", t.correct}});
  }
  out["results"] = trials;
  return out;
}

std::string ToMarkdown(const NeedleRun& run) {
  std::ostringstream o;
  for (const std::string& m : run.methods) {
    for (NeedleKind k : run.options.kinds) {
      o << "\n" << NeedleKindName(k) << ", method " << m << ": exact match over " << run.options.trials
        << " trials per cell\n\n| depth \\ length |";
      for (int length : run.options.lengths) o << " " << LengthLabel(run, length) << " |";
      o << " mean |\n|---|";
      for (size_t i = 0; i <= run.options.lengths.size(); ++i) o << "---|";
      o << "\n";
      for (double depth : run.options.depths) {
        o << "| " << Fixed(depth, 2) << " |";
        double sum = 0;
        for (int length : run.options.lengths) {
          const double acc = CellAccuracy(run, m, k, length, depth);
          sum += acc;
          o << " " << Fixed(acc, 2) << " |";
        }
        o << " " << Fixed(sum / static_cast<double>(run.options.lengths.size()), 2) << " |\n";
      }
    }
  }
  if (AnyBeyondTrainedLength(run))
    o << "\n\u2020 longer than the model's trained length of " << run.trained_length << " tokens\n";
  return o.str();
}

std::string ToSvg(const NeedleRun& run) {
  const int cell_w = 76, cell_h = 30, left = 58, top = 62, gap = 34;
  const int n_cols = static_cast<int>(run.options.lengths.size());
  const int n_rows = static_cast<int>(run.options.depths.size());
  const int panel_w = left + n_cols * cell_w;
  const int n_panels = static_cast<int>(run.methods.size() * run.options.kinds.size());
  const std::string title = "needle in a haystack: " + ModelName(run.model) + " (exact match, " +
                            std::to_string(run.options.trials) + " trials per cell)";
  // Wide enough for the panels and for the title (about 8 px a character at 14 px).
  const int W = std::max(16 + n_panels * panel_w + (n_panels - 1) * gap + 16, 32 + 8 * static_cast<int>(title.size()));
  const int H = top + n_rows * cell_h + 58;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W
    << " " << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"" << W << "\" height=\"" << H << "\" fill=\"white\"/>\n";
  o << "<text x=\"16\" y=\"20\" font-size=\"14\">" << XmlEscape(title) << "</text>\n";
  int panel = 0;
  for (const std::string& m : run.methods) {
    for (NeedleKind k : run.options.kinds) {
      const int x0 = 16 + panel * (panel_w + gap);
      o << "<text x=\"" << x0 + left << "\" y=\"42\" font-size=\"13\">" << NeedleKindName(k) << ", " << XmlEscape(m)
        << "</text>\n";
      for (int r = 0; r < n_rows; ++r) {
        const double depth = run.options.depths[static_cast<size_t>(r)];
        const int y = top + r * cell_h;
        o << "<text x=\"" << x0 + left - 6 << "\" y=\"" << y + cell_h / 2 + 4 << "\" text-anchor=\"end\">"
          << Fixed(depth, 2) << "</text>\n";
        for (int c = 0; c < n_cols; ++c) {
          const double acc = CellAccuracy(run, m, k, run.options.lengths[static_cast<size_t>(c)], depth);
          const int x = x0 + left + c * cell_w;
          o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << cell_w - 2 << "\" height=\"" << cell_h - 2
            << "\" fill=\"" << Colour(acc) << "\"/>";
          o << "<text x=\"" << x + cell_w / 2 - 1 << "\" y=\"" << y + cell_h / 2 + 4 << "\" text-anchor=\"middle\">"
            << Fixed(acc, 2) << "</text>\n";
        }
      }
      for (int c = 0; c < n_cols; ++c) {
        o << "<text x=\"" << x0 + left + c * cell_w + cell_w / 2 - 1 << "\" y=\"" << top + n_rows * cell_h + 14
          << "\" text-anchor=\"middle\">" << LengthLabel(run, run.options.lengths[static_cast<size_t>(c)])
          << "</text>\n";
      }
      o << "<text x=\"" << x0 + left + n_cols * cell_w / 2 << "\" y=\"" << top + n_rows * cell_h + 32
        << "\" text-anchor=\"middle\">prompt tokens</text>\n";
      o << "<text x=\"" << x0 + 12 << "\" y=\"" << top + n_rows * cell_h / 2 << "\" text-anchor=\"middle\" "
        << "transform=\"rotate(-90 " << x0 + 12 << " " << top + n_rows * cell_h / 2 << ")\">needle depth</text>\n";
      ++panel;
    }
  }
  if (AnyBeyondTrainedLength(run)) {
    o << "<text x=\"16\" y=\"" << H - 8 << "\" font-size=\"11\" fill=\"#555\">\u2020 longer than the trained length of "
      << run.trained_length << " tokens</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace attic::eval
