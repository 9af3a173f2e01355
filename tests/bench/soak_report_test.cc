// `attic bench soak`'s per-minute rows and second-half growth against values worked out
// by hand from small made-up runs.
#include "bench/soak/soak_report.h"

#include <gtest/gtest.h>

namespace attic::bench::soak {
namespace {

constexpr uint64_t kMiB = 1 << 20;

MemorySample Mem(double t, uint64_t rss_mib) {
  MemorySample s;
  s.t_s = t;
  s.rss_bytes = rss_mib * kMiB;
  s.rss_anon_bytes = rss_mib * kMiB / 2;
  return s;
}

RequestEvent Ev(double t, const char* kind, bool ok, double ttft, double latency) {
  RequestEvent e;
  e.t_s = t;
  e.kind = kind;
  e.ok = ok;
  e.ttft_ms = ttft;
  e.latency_ms = latency;
  return e;
}

TEST(SoakReport, FoldsRequestsAndSamplesIntoMinutes) {
  const std::vector<RequestEvent> events{
      Ev(1, "chat", true, 10, 100),       Ev(30, "chat", true, 30, 300), Ev(59.9, "sparse", true, 20, 200),
      Ev(61, "disconnect", true, 5, 6),   Ev(70, "chat", false, -1, 1),  Ev(100, "cache", true, -1, 50),
      Ev(130, "chat", true, 40, 400),  // a partial third minute (the run lasted 150 s)
  };
  const std::vector<MemorySample> samples{Mem(0, 100), Mem(30, 110), Mem(60, 120), Mem(90, 140), Mem(120, 130)};
  const auto rows = PerMinute(events, samples, 150);
  ASSERT_EQ(rows.size(), 3u);
  // Minute 1: three ok requests; TTFT 10, 20, 30 -> nearest-rank p50 = 20, p99 = 30.
  EXPECT_EQ(rows[0].requests, 3);
  EXPECT_EQ(rows[0].errors, 0);
  EXPECT_EQ(rows[0].sparse, 1);
  EXPECT_EQ(rows[0].ttft_ms_p50, 20);
  EXPECT_EQ(rows[0].ttft_ms_p99, 30);
  EXPECT_EQ(rows[0].latency_ms_p50, 200);
  EXPECT_EQ(rows[0].rss_mib_mean, 105);
  EXPECT_EQ(rows[0].rss_mib_max, 110);
  EXPECT_EQ(rows[0].anon_mib_mean, 52.5);
  // Minute 2: a disconnect (ok, TTFT counted, latency not), an error, a cache op.
  EXPECT_EQ(rows[1].requests, 3);
  EXPECT_EQ(rows[1].errors, 1);
  EXPECT_EQ(rows[1].disconnects, 1);
  EXPECT_EQ(rows[1].cache_ops, 1);
  EXPECT_EQ(rows[1].ttft_ms_p50, 5);
  EXPECT_EQ(rows[1].latency_ms_p50, 50);
  EXPECT_EQ(rows[1].rss_mib_mean, 130);
  EXPECT_EQ(rows[1].rss_mib_max, 140);
  EXPECT_EQ(rows[2].requests, 1);
  EXPECT_EQ(rows[2].rss_mib_mean, 130);
}

TEST(SoakReport, SecondHalfGrowthComparesTheLastWindowWithTheOneAfterHalfWay) {
  // 10 minutes, a sample every 30 s: RSS 200 MiB up to minute 5, then +1 MiB a minute.
  std::vector<MemorySample> s;
  for (int i = 0; i <= 20; ++i) {
    const double t = 30.0 * i;
    s.push_back(Mem(t, t < 300 ? 200 : 200 + static_cast<uint64_t>((t - 300) / 60)));
  }
  // Window after half-way [300, 360): samples at 300 (200) and 330 (200): mean 200.
  // Last window [540, 600]: 540 (204), 570 (204), 600 (205): mean 613 / 3.
  const double late = (204.0 + 204 + 205) / 3;
  EXPECT_DOUBLE_EQ(SecondHalfGrowth(s, 600, 60), (late - 200) / 200);
  // Flat memory: no growth; no sample in a window: 0.
  EXPECT_EQ(SecondHalfGrowth({Mem(0, 50), Mem(300, 50), Mem(590, 50)}, 600, 60), 0);
  EXPECT_EQ(SecondHalfGrowth({Mem(0, 50)}, 600, 60), 0);
}

TEST(SoakReport, TableHasARowPerMinuteAndThePlotIsAnSvgWithTheBudget) {
  const auto rows = PerMinute({}, {Mem(0, 100), Mem(61, 101)}, 120);
  const std::string table = MinuteTable(rows);
  EXPECT_NE(table.find("| 1 | 0 | 0 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| 2 | 0 | 0 |"), std::string::npos) << table;
  const std::string svg = RssPlotSvg({0, 1, 2}, {"RSS"}, {{100, 101, 102}}, 512, "t");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("budget 512 MiB"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace attic::bench::soak
