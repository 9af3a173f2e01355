#include "bench/common/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "bench/common/format.h"

namespace attic::bench {

std::string LogLogPlotSvg(const std::vector<std::string>& names, const std::vector<double>& x,
                          const std::vector<std::vector<double>>& y, const std::string& title,
                          const std::string& x_label, const std::string& y_label, const std::string& y_unit) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double W = 720, H = 460, L = 70, R = 170, T = 40, B = 60;
  double ymin = kInf, ymax = 0;
  for (const auto& row : y)
    for (double v : row)
      if (!std::isnan(v)) ymin = std::min(ymin, v), ymax = std::max(ymax, v);
  const double ly0 = std::floor(std::log10(ymin)), ly1 = std::ceil(std::log10(ymax));
  const double lx0 = std::log2(x.front()), lx1 = std::log2(x.back()) + 1e-9;
  auto px = [&](double v) { return L + (std::log2(v) - lx0) / std::max(lx1 - lx0, 1e-9) * (W - L - R); };
  auto py = [&](double v) { return H - B - (std::log10(v) - ly0) / std::max(ly1 - ly0, 1e-9) * (H - T - B); };
  std::string o = Fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\">\n",
                      W, H);
  o += Fmt("<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"22\" text-anchor=\"middle\" "
           "font-size=\"15\">%s</text>\n",
           (W - R + L) / 2, title.c_str());
  for (double e = ly0; e <= ly1 + 1e-9; ++e) {
    const double v = std::pow(10.0, e), yy = py(v);
    o += Fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, yy, W - R, yy);
    o += Fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%g %s</text>\n", L - 6, yy + 4, v,
             y_unit.c_str());
  }
  for (double v : x) {
    const double xx = px(v);
    o += Fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", xx, T, xx, H - B);
    o += Fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\">%.1fk</text>\n", xx, H - B + 16, v / 1024);
  }
  o += Fmt("<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\" font-size=\"12\">%s</text>\n",
           (W - R + L) / 2, H - 18, x_label.c_str());
  o += Fmt("<text x=\"16\" y=\"%.0f\" font-size=\"12\" transform=\"rotate(-90 16 %.0f)\" text-anchor=\"middle\">%s</text>\n",
           (H - B + T) / 2, (H - B + T) / 2, y_label.c_str());
  const char* colors[] = {"#2ca02c", "#ff7f0e", "#1f77b4", "#d62728", "#9467bd", "#8c564b"};
  for (size_t m = 0; m < names.size(); ++m) {
    const char* c = colors[m % 6];
    std::string pts;
    for (size_t i = 0; i < x.size(); ++i)
      if (!std::isnan(y[m][i])) pts += Fmt("%.1f,%.1f ", px(x[i]), py(y[m][i]));
    o += Fmt("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", c, pts.c_str());
    for (size_t i = 0; i < x.size(); ++i)
      if (!std::isnan(y[m][i])) o += Fmt("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(x[i]), py(y[m][i]), c);
    const double ly = T + 20 + 20 * m;
    o += Fmt("<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"/>\n", W - R + 15, ly,
             W - R + 40, ly, c);
    o += Fmt("<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\">%s</text>\n", W - R + 46, ly + 4, names[m].c_str());
  }
  return o + "</svg>\n";
}

}  // namespace attic::bench
