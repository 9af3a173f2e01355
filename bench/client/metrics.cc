#include "bench/client/metrics.h"

#include <httplib.h>

#include <sstream>

namespace attic::bench {

MetricValues ParsePrometheusText(const std::string& text) {
  MetricValues m;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    try {
      m[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
    } catch (...) {
    }
  }
  return m;
}

MetricValues ScrapeMetrics(const std::string& url) {
  httplib::Client cli(url);
  cli.set_read_timeout(30, 0);
  auto res = cli.Get("/metrics");
  if (!res || res->status != 200) return {};
  return ParsePrometheusText(res->body);
}

MetricValues MetricsDelta(const MetricValues& before, const MetricValues& after) {
  MetricValues delta;
  for (const auto& [k, v] : after) {
    auto b = before.find(k);
    delta[k] = v - (b == before.end() ? 0.0 : b->second);
  }
  return delta;
}

}  // namespace attic::bench
