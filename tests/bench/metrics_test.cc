// Reading a server's Prometheus metrics as the load generators do.
#include "bench/client/metrics.h"

#include <gtest/gtest.h>

namespace attic::bench {
namespace {

TEST(Metrics, ParsesSamplesSkipsCommentsAndJunk) {
  const std::string text =
      "# HELP attic_kv_store_lookups_total Lookups.\n"
      "# TYPE attic_kv_store_lookups_total counter\n"
      "attic_kv_store_lookups_total 12\n"
      "attic_kv_store_hits_total{tier=\"dram\"} 7\n"
      "attic_kv_store_hits_total{tier=\"ssd\"} 2.5e1\n"
      "\n"
      "no_value_here\n"
      "bad_value abc\n"
      "attic_time_to_first_token_seconds_sum 0.125\n";
  const MetricValues m = ParsePrometheusText(text);
  EXPECT_EQ(m.size(), 4u);
  EXPECT_EQ(m.at("attic_kv_store_lookups_total"), 12);
  EXPECT_EQ(m.at("attic_kv_store_hits_total{tier=\"dram\"}"), 7);
  EXPECT_EQ(m.at("attic_kv_store_hits_total{tier=\"ssd\"}"), 25);
  EXPECT_EQ(m.at("attic_time_to_first_token_seconds_sum"), 0.125);
}

TEST(Metrics, DeltaCountsNewKeysFromZero) {
  const MetricValues before{{"a", 10}, {"b", 1}};
  const MetricValues after{{"a", 15}, {"c", 4}};
  const MetricValues d = MetricsDelta(before, after);
  EXPECT_EQ(d.size(), 2u);  // keys of `after`
  EXPECT_EQ(d.at("a"), 5);
  EXPECT_EQ(d.at("c"), 4);
}

TEST(Metrics, UnreachableServerGivesNothing) {
  // Port 1 on loopback: nothing listens there.
  EXPECT_TRUE(ScrapeMetrics("http://127.0.0.1:1").empty());
}

}  // namespace
}  // namespace attic::bench
