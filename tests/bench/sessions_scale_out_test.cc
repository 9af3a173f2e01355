// The --routing-matrix report of `attic bench sessions` (scale_out.h): the rows and the
// issue's checks from hand-made summaries whose numbers are worked out in the comments.
#include "bench/sessions/scale_out.h"

#include <gtest/gtest.h>

namespace attic::bench::sessions {
namespace {

using json = nlohmann::json;

// A summary as Summarize makes it, with only what the report reads.
json Sum(double hit_rate, double history_reuse, std::vector<double> lookups) {
  json inst = json::array();
  if (lookups.size() > 1)
    for (double n : lookups) inst.push_back({{"lookups", n}, {"hits", 0.0}, {"shared_found", 0.0}});
  double total = 0;
  for (double n : lookups) total += n;
  return json{{"turns_ok", 40},
              {"turns_failed", 0},
              {"history_reuse_later_turns", history_reuse},
              {"ttft_ms_p50", 100.0},
              {"ttft_ms_p90", 300.0},
              {"prefill_tokens_per_s_served", 1000.0},
              {"prefill_tokens_per_s_computed", 200.0},
              {"store", {{"hit_rate", hit_rate}, {"hit_rate_remote", 0.0}, {"lookups", total}, {"instances", inst}}}};
}

TEST(SessionsScaleOut, ChecksAgainstTheOneServerReference) {
  const std::vector<ScaleOutRow> rows{{"1 instance", 1, "", false},
                                      {"2 x affinity", 2, "affinity", false},
                                      {"2 x random", 2, "random", false},
                                      {"2 x affinity + shared", 2, "affinity", true},
                                      {"2 x random + shared", 2, "random", true}};
  const std::vector<json> sums{Sum(0.80, 0.99, {40}), Sum(0.74, 0.99, {22, 18}), Sum(0.50, 0.40, {20, 20}),
                               Sum(0.79, 0.99, {25, 15}), Sum(0.70, 0.90, {19, 21})};
  const json so = ScaleOutJson(rows, sums);
  ASSERT_EQ(so["rows"].size(), 5u);
  EXPECT_EQ(so["rows"][1]["lookups_per_instance"], json({22.0, 18.0}));
  EXPECT_EQ(so["rows"][0]["lookups_per_instance"], json({40.0}));  // one server: its own count
  const json& c = so["checks"];
  EXPECT_DOUBLE_EQ(c["reference_hit_rate"].get<double>(), 0.80);
  // Affinity: 80 - 74 = 6 points (fails the bar), 80 - 79 = 1 point.
  EXPECT_NEAR(c["affinity_hit_rate_points_below_reference"]["2 x affinity"].get<double>(), 6.0, 1e-9);
  EXPECT_NEAR(c["affinity_hit_rate_points_below_reference"]["2 x affinity + shared"].get<double>(), 1.0, 1e-9);
  EXPECT_FALSE(c["affinity_within_5_points"].get<bool>());
  // Random + shared: 0.70 / 0.80 = 87.5% >= 80%.
  EXPECT_DOUBLE_EQ(c["random_shared_hit_rate_over_reference"].get<double>(), 0.875);
  EXPECT_TRUE(c["random_shared_at_least_80_percent"].get<bool>());
  EXPECT_DOUBLE_EQ(c["random_local_hit_rate"].get<double>(), 0.50);
  EXPECT_DOUBLE_EQ(c["history_reuse"]["2 x random"].get<double>(), 0.40);
}

TEST(SessionsScaleOut, RandomSharedBelowTheBarAndRowsThatDidNotRun) {
  // 0.63 / 0.80 = 78.75% < 80%; no affinity rows: no affinity check at all.
  const std::vector<ScaleOutRow> rows{{"1 instance", 1, "", false}, {"2 x random + shared", 2, "random", true}};
  const json so = ScaleOutJson(rows, {Sum(0.80, 0.99, {40}), Sum(0.63, 0.9, {20, 20})});
  const json& c = so["checks"];
  EXPECT_FALSE(c["random_shared_at_least_80_percent"].get<bool>());
  EXPECT_FALSE(c.contains("affinity_within_5_points"));
  EXPECT_FALSE(c.contains("random_local_hit_rate"));
}

}  // namespace
}  // namespace attic::bench::sessions
