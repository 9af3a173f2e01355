#include "bench/sessions/plot.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "bench/common/format.h"
#include "bench/common/stats.h"

namespace attic::bench::sessions {

namespace {

std::string SvgEscape(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return o;
}

}  // namespace

// Two panels: TTFT CDF (log x) and median TTFT by turn index, CA vs RE.
std::string PlotSvg(const std::vector<const RunResult*>& runs, const std::string& title) {
  const double W = 1000, H = 420, top = 50, bottom = 60, panel_w = 400, gap = 100, left = 70;
  const char* colors[] = {"#1f77b4", "#d62728"};
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << SvgEscape(title) << "</text>\n";
  const double ph = H - top - bottom;
  // Data ranges.
  double tmin = 1e18, tmax = 0, ymax = 0;
  int max_turn = 1;
  std::vector<std::vector<double>> ttfts;
  std::vector<std::map<int, double>> medians;
  for (const RunResult* r : runs) {
    std::vector<double> v;
    std::map<int, std::vector<double>> bt;
    for (const auto& t : r->turns)
      if (t.ok) {
        v.push_back(std::max(0.1, t.ttft_s * 1e3));
        bt[t.turn + 1].push_back(t.ttft_s * 1e3);
      }
    std::sort(v.begin(), v.end());
    if (!v.empty()) tmin = std::min(tmin, v.front()), tmax = std::max(tmax, v.back());
    std::map<int, double> med;
    for (const auto& [k, x] : bt) {
      med[k] = Percentile(x, 50);
      ymax = std::max(ymax, med[k]);
      max_turn = std::max(max_turn, k);
    }
    ttfts.push_back(std::move(v));
    medians.push_back(std::move(med));
  }
  if (tmax <= 0) tmin = 1, tmax = 10;
  const double lx0 = std::floor(std::log10(tmin)), lx1 = std::max(lx0 + 1, std::ceil(std::log10(tmax)));
  auto axes = [&](double x0, const std::string& xl, const std::string& yl) {
    o << "<rect x=\"" << x0 << "\" y=\"" << top << "\" width=\"" << panel_w << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#333\"/>\n";
    o << "<text x=\"" << x0 + panel_w / 2 << "\" y=\"" << H - 15 << "\" text-anchor=\"middle\">" << xl << "</text>\n";
    o << "<text transform=\"translate(" << x0 - 50 << "," << top + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
      << yl << "</text>\n";
  };
  // Left: CDF.
  axes(left, "TTFT (ms, log scale)", "fraction of turns");
  for (double e = lx0; e <= lx1; e += 1) {
    double x = left + (e - lx0) / (lx1 - lx0) * panel_w;
    o << "<line x1=\"" << x << "\" y1=\"" << top << "\" x2=\"" << x << "\" y2=\"" << top + ph
      << "\" stroke=\"#ddd\"/><text x=\"" << x << "\" y=\"" << top + ph + 16 << "\" text-anchor=\"middle\">"
      << Fmt("%g", std::pow(10.0, e)) << "</text>\n";
  }
  for (int i = 0; i <= 4; ++i) {
    double y = top + ph - i / 4.0 * ph;
    o << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + panel_w << "\" y2=\"" << y
      << "\" stroke=\"#ddd\"/><text x=\"" << left - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">"
      << Fmt("%.2f", i / 4.0) << "</text>\n";
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto& v = ttfts[r];
    if (v.empty()) continue;
    o << "<polyline fill=\"none\" stroke=\"" << colors[r % 2] << "\" stroke-width=\"2\" points=\"";
    double prev_y = top + ph;
    for (size_t i = 0; i < v.size(); ++i) {
      double x = left + (std::log10(v[i]) - lx0) / (lx1 - lx0) * panel_w;
      double y = top + ph - (i + 1.0) / v.size() * ph;
      o << x << "," << prev_y << " " << x << "," << y << " ";
      prev_y = y;
    }
    o << "\"/>\n";
  }
  // Right: median TTFT by turn index.
  const double rx = left + panel_w + gap;
  axes(rx, "turn of the session", "median TTFT (ms)");
  if (ymax <= 0) ymax = 1;
  const double ystep = std::pow(10.0, std::floor(std::log10(ymax)));
  const double ytop = std::ceil(ymax / ystep) * ystep;
  for (double yv = 0; yv <= ytop + 1e-9; yv += ystep) {
    double y = top + ph - yv / ytop * ph;
    o << "<line x1=\"" << rx << "\" y1=\"" << y << "\" x2=\"" << rx + panel_w << "\" y2=\"" << y
      << "\" stroke=\"#ddd\"/><text x=\"" << rx - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << Fmt("%g", yv)
      << "</text>\n";
  }
  auto tx = [&](int k) { return rx + (max_turn > 1 ? (k - 1.0) / (max_turn - 1) : 0.5) * panel_w; };
  for (int k = 1; k <= max_turn; ++k)
    o << "<text x=\"" << tx(k) << "\" y=\"" << top + ph + 16 << "\" text-anchor=\"middle\">" << k << "</text>\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    o << "<polyline fill=\"none\" stroke=\"" << colors[r % 2] << "\" stroke-width=\"2\" points=\"";
    for (const auto& [k, m] : medians[r]) o << tx(k) << "," << top + ph - m / ytop * ph << " ";
    o << "\"/>\n";
    for (const auto& [k, m] : medians[r])
      o << "<circle cx=\"" << tx(k) << "\" cy=\"" << top + ph - m / ytop * ph << "\" r=\"3.5\" fill=\"" << colors[r % 2]
        << "\"/>\n";
  }
  // Legend.
  for (size_t r = 0; r < runs.size(); ++r) {
    double y = top + 16 + r * 18;
    o << "<line x1=\"" << left + 12 << "\" y1=\"" << y - 4 << "\" x2=\"" << left + 36 << "\" y2=\"" << y - 4
      << "\" stroke=\"" << colors[r % 2] << "\" stroke-width=\"3\"/><text x=\"" << left + 42 << "\" y=\"" << y << "\">"
      << (runs[r]->mode == "CA" ? "CA (KV store)" : "RE (recompute)") << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace attic::bench::sessions
