// A server's Prometheus metrics as the load generators read them: GET <url>/metrics,
// parsed into {"name{labels}": value} so that a benchmark can take the difference of two
// scrapes (what the server did during a replay). Thread-safe.
#pragma once

#include <map>
#include <string>

namespace attic::bench {

using MetricValues = std::map<std::string, double>;

// Prometheus text exposition -> {"name{labels}": value}: one entry per sample line
// ("name{labels} value"; the key is everything before the last space, labels as
// written). Comment (#) and blank lines, and lines whose value does not start with a
// number, are skipped.
MetricValues ParsePrometheusText(const std::string& text);

// ParsePrometheusText of `url`/metrics; empty when the server cannot be reached or does
// not answer 200.
MetricValues ScrapeMetrics(const std::string& url);

// after - before, per key of `after` (a key missing from `before` counts from 0).
MetricValues MetricsDelta(const MetricValues& before, const MetricValues& after);

}  // namespace attic::bench
