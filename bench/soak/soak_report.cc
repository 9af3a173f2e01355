#include "bench/soak/soak_report.h"

#include <algorithm>
#include <cmath>

#include "bench/common/format.h"
#include "bench/common/stats.h"

namespace attic::bench::soak {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double MeanRssIn(const std::vector<MemorySample>& samples, double from_s, double to_s) {
  std::vector<double> v;
  for (const auto& s : samples)
    if (s.t_s >= from_s && s.t_s < to_s) v.push_back(static_cast<double>(s.rss_bytes));
  return Mean(v);
}

}  // namespace

std::vector<MinuteRow> PerMinute(const std::vector<RequestEvent>& events, const std::vector<MemorySample>& samples,
                                 double duration_s) {
  const int n = std::max(1, static_cast<int>(std::ceil(duration_s / 60.0 - 1e-9)));
  std::vector<MinuteRow> rows(n);
  std::vector<std::vector<double>> ttft(n), latency(n), rss(n), anon(n);
  auto minute_of = [n](double t) { return std::clamp(static_cast<int>(t / 60.0), 0, n - 1); };
  for (int m = 0; m < n; ++m) rows[m].minute = m;
  for (const auto& e : events) {
    MinuteRow& r = rows[minute_of(e.t_s)];
    const int m = r.minute;
    ++r.requests;
    if (e.kind == "disconnect") ++r.disconnects;
    if (e.kind == "cache") ++r.cache_ops;
    if (e.kind == "sparse") ++r.sparse;
    if (!e.ok) {
      ++r.errors;
      continue;
    }
    if (e.ttft_ms >= 0) ttft[m].push_back(e.ttft_ms);
    if (e.kind != "disconnect") latency[m].push_back(e.latency_ms);
  }
  for (const auto& s : samples) {
    MinuteRow& r = rows[minute_of(s.t_s)];
    rss[r.minute].push_back(static_cast<double>(s.rss_bytes) / kMiB);
    anon[r.minute].push_back(static_cast<double>(s.rss_anon_bytes) / kMiB);
    r.dram_tier_mib = static_cast<double>(s.dram_tier_bytes) / kMiB;
    r.ssd_tier_mib = static_cast<double>(s.ssd_tier_bytes) / kMiB;
    r.threads = s.threads;
  }
  for (int m = 0; m < n; ++m) {
    MinuteRow& r = rows[m];
    r.ttft_ms_p50 = Percentile(ttft[m], 50);
    r.ttft_ms_p99 = Percentile(ttft[m], 99);
    r.latency_ms_p50 = Percentile(latency[m], 50);
    r.latency_ms_p99 = Percentile(latency[m], 99);
    r.rss_mib_mean = Mean(rss[m]);
    r.rss_mib_max = rss[m].empty() ? 0 : *std::max_element(rss[m].begin(), rss[m].end());
    r.anon_mib_mean = Mean(anon[m]);
  }
  return rows;
}

double SecondHalfGrowth(const std::vector<MemorySample>& samples, double duration_s, double window_s) {
  const double half = duration_s / 2;
  const double mid = MeanRssIn(samples, half, half + window_s);
  const double late = MeanRssIn(samples, duration_s - window_s, duration_s + 1e-9);
  if (mid <= 0 || late <= 0) return 0;
  return (late - mid) / mid;
}

std::string MinuteTable(const std::vector<MinuteRow>& rows) {
  std::string o = TableHeader({"minute", "requests", "errors", "disconnects", "cache ops", "sparse", "TTFT p50 ms",
                               "TTFT p99 ms", "latency p50 ms", "latency p99 ms", "RSS mean MiB", "RSS max MiB",
                               "anon MiB", "DRAM tier MiB", "SSD tier MiB", "threads"});
  for (const auto& r : rows) {
    o += Fmt("| %d | %d | %d | %d | %d | %d | %.0f | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f | %d |\n",
             r.minute + 1, r.requests, r.errors, r.disconnects, r.cache_ops, r.sparse, r.ttft_ms_p50, r.ttft_ms_p99,
             r.latency_ms_p50, r.latency_ms_p99, r.rss_mib_mean, r.rss_mib_max, r.anon_mib_mean, r.dram_tier_mib,
             r.ssd_tier_mib, r.threads);
  }
  return o;
}

std::string RssPlotSvg(const std::vector<double>& x_min, const std::vector<std::string>& names,
                       const std::vector<std::vector<double>>& y_mib, double budget_mib, const std::string& title) {
  const double W = 760, H = 460, L = 70, R = 190, T = 40, B = 60;
  double xmax = 1, ymax = std::max(1.0, budget_mib);
  for (double x : x_min) xmax = std::max(xmax, x);
  for (const auto& row : y_mib)
    for (double v : row)
      if (!std::isnan(v)) ymax = std::max(ymax, v);
  // A round step: 1, 2 or 5 times a power of ten, about 6 ticks.
  auto nice_step = [](double span) {
    const double raw = span / 6, p = std::pow(10.0, std::floor(std::log10(raw)));
    return raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
  };
  const double ystep = nice_step(ymax * 1.05), xstep = nice_step(xmax);
  ymax = std::ceil(ymax * 1.05 / ystep) * ystep;
  xmax = std::ceil(xmax / xstep) * xstep;
  auto px = [&](double v) { return L + v / xmax * (W - L - R); };
  auto py = [&](double v) { return H - B - v / ymax * (H - T - B); };
  std::string o = Fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\">\n",
                      W, H);
  o += Fmt("<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"22\" text-anchor=\"middle\" "
           "font-size=\"15\">%s</text>\n",
           (W - R + L) / 2, title.c_str());
  for (double v = 0; v <= ymax + 1e-9; v += ystep) {
    o += Fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, py(v), W - R, py(v));
    o += Fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%g</text>\n", L - 6, py(v) + 4, v);
  }
  for (double v = 0; v <= xmax + 1e-9; v += xstep) {
    o += Fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", px(v), T, px(v), H - B);
    o += Fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\">%g</text>\n", px(v), H - B + 16, v);
  }
  o += Fmt("<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\" font-size=\"12\">minutes</text>\n", (W - R + L) / 2, H - 18);
  o += Fmt("<text x=\"16\" y=\"%.0f\" font-size=\"12\" transform=\"rotate(-90 16 %.0f)\" text-anchor=\"middle\">MiB</text>\n",
           (H - B + T) / 2, (H - B + T) / 2);
  const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf"};
  size_t legend = 0;
  for (size_t m = 0; m < names.size(); ++m, ++legend) {
    const char* c = colors[m % 6];
    std::string pts;
    for (size_t i = 0; i < x_min.size() && i < y_mib[m].size(); ++i)
      if (!std::isnan(y_mib[m][i])) pts += Fmt("%.1f,%.1f ", px(x_min[i]), py(y_mib[m][i]));
    o += Fmt("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n", c, pts.c_str());
    const double ly = T + 20 + 20 * legend;
    o += Fmt("<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"/>\n", W - R + 15, ly,
             W - R + 40, ly, c);
    o += Fmt("<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\">%s</text>\n", W - R + 46, ly + 4, names[m].c_str());
  }
  if (budget_mib > 0) {
    o += Fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-dasharray=\"6 4\"/>\n", L,
             py(budget_mib), W - R, py(budget_mib));
    const double ly = T + 20 + 20 * legend;
    o += Fmt("<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#d62728\" stroke-dasharray=\"6 4\"/>\n",
             W - R + 15, ly, W - R + 40, ly);
    o += Fmt("<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\">budget %.0f MiB</text>\n", W - R + 46, ly + 4, budget_mib);
  }
  return o + "</svg>\n";
}

}  // namespace attic::bench::soak
