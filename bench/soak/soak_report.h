// What `attic bench soak` reports (src/cli/bench_soak_cmd.cc runs the load): the
// requests' outcomes and the server's memory samples folded into one row per minute,
// the RSS growth over the run's second half, the table, and the RSS plot (an SVG written
// directly). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attic::bench::soak {

// One request of the soak, as the client saw it. Times in seconds since the run began.
struct RequestEvent {
  double t_s = 0;            // when it ended
  std::string kind;          // "chat", "sparse", "disconnect", "cache"
  bool ok = false;           // answered as expected (a disconnect: the stream was cut by the client)
  double ttft_ms = -1;       // send -> first content piece (-1: none)
  double latency_ms = 0;     // send -> end
  std::string error;         // when !ok
};

// One sample of the server's memory: /proc/PID/status and the /metrics gauges.
struct MemorySample {
  double t_s = 0;
  uint64_t rss_bytes = 0;        // VmRSS
  uint64_t rss_anon_bytes = 0;   // RssAnon
  uint64_t rss_file_bytes = 0;   // RssFile
  int threads = 0;
  uint64_t dram_tier_bytes = 0;  // attic_kv_store_bytes{tier="dram"}
  uint64_t ssd_tier_bytes = 0;   // attic_kv_store_bytes{tier="ssd"}
  uint64_t budget_bytes = 0;     // attic_memory_budget_bytes (0: the server has none)
};

struct MinuteRow {
  int minute = 0;  // [minute, minute + 1) minutes after the start
  int requests = 0, errors = 0, disconnects = 0, cache_ops = 0, sparse = 0;
  double ttft_ms_p50 = 0, ttft_ms_p99 = 0;        // over the minute's requests with a first piece
  double latency_ms_p50 = 0, latency_ms_p99 = 0;  // over its ok requests
  double rss_mib_mean = 0, rss_mib_max = 0;       // over its memory samples (0: none)
  double anon_mib_mean = 0;
  double dram_tier_mib = 0, ssd_tier_mib = 0;     // the last sample's
  int threads = 0;                                // the last sample's
};

// Rows for minutes 0 .. ceil(duration_s / 60) - 1 (a partial last minute included).
std::vector<MinuteRow> PerMinute(const std::vector<RequestEvent>& events, const std::vector<MemorySample>& samples,
                                 double duration_s);

// RSS growth over the second half of the run, as a fraction: the mean RSS of the samples
// in the last `window_s` seconds against the mean of those in the `window_s` seconds
// after the half-way point ((late - mid) / mid). 0 when either window has no sample.
double SecondHalfGrowth(const std::vector<MemorySample>& samples, double duration_s, double window_s);

// The per-minute table (markdown).
std::string MinuteTable(const std::vector<MinuteRow>& rows);

// An SVG line chart with linear axes: x = minutes, y = MiB; one line per series
// (names[i] over y[i][j] at x[j]). `budget_mib` > 0 adds a dashed horizontal line.
std::string RssPlotSvg(const std::vector<double>& x_min, const std::vector<std::string>& names,
                       const std::vector<std::vector<double>>& y_mib, double budget_mib, const std::string& title);

}  // namespace attic::bench::soak
