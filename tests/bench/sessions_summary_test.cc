// The metrics of one replay of `attic bench sessions` (summary.h), its table and ratios
// (report.h) and its plot (plot.h), from a hand-made replay whose every number is
// worked out in the comments.
#include "bench/sessions/summary.h"

#include <gtest/gtest.h>

#include "bench/sessions/plot.h"
#include "bench/sessions/report.h"

namespace attic::bench::sessions {
namespace {

TurnResult Turn(int session, int turn, double sent, double ttft, int prompt, int cached, int history) {
  TurnResult t;
  t.session = session;
  t.turn = turn;
  t.ok = true;
  t.sent_s = sent;
  t.ttft_s = ttft;
  t.total_s = ttft + 0.5;
  t.prompt_tokens = prompt;
  t.cached_tokens = cached;
  t.completion_tokens = 10;
  t.history_tokens = history;
  return t;
}

RunResult HandMadeRun() {
  RunResult r;
  r.mode = "CA";
  r.url = "http://127.0.0.1:1";
  r.wall_s = 2;
  r.turns.push_back(Turn(0, 0, 0.0, 0.1, 100, 0, 0));
  r.turns.push_back(Turn(0, 1, 1.0, 0.05, 130, 100, 120));  // 120 >= 0.9 x 130: history heavy
  r.turns.push_back(Turn(1, 0, 0.05, 0.2, 50, 0, 0));       // overlaps the first turn's prefill
  TurnResult failed;
  failed.session = 1;
  failed.turn = 1;
  failed.error = "boom";
  r.turns.push_back(failed);
  r.metrics_delta = {{"attic_kv_store_lookups_total", 4},
                     {"attic_kv_store_hits_total{tier=\"dram\"}", 2},
                     {"attic_kv_store_hits_total{tier=\"ssd\"}", 1},
                     {"attic_time_to_first_token_seconds_count", 3},
                     {"attic_time_to_first_token_seconds_sum", 0.3},
                     {"attic_queue_wait_seconds_sum", 0.03},
                     {"attic_time_per_output_token_seconds_count", 27},
                     {"attic_time_per_output_token_seconds_sum", 1.35}};
  return r;
}

TEST(SessionsSummary, HistoryHeavy) {
  EXPECT_TRUE(HistoryHeavy(Turn(0, 1, 0, 0.1, 100, 0, 90)));
  EXPECT_FALSE(HistoryHeavy(Turn(0, 1, 0, 0.1, 100, 0, 89)));
  EXPECT_FALSE(HistoryHeavy(Turn(0, 0, 0, 0.1, 100, 0, 100)));  // first turns never
}

TEST(SessionsSummary, MetricsByHand) {
  const nlohmann::json s = Summarize(HandMadeRun());
  EXPECT_EQ(s["mode"], "CA");
  EXPECT_EQ(s["turns_ok"], 3);
  EXPECT_EQ(s["turns_failed"], 1);
  EXPECT_EQ(s["first_error"], "boom");
  EXPECT_EQ(s["prompt_tokens"], 280.0);
  EXPECT_EQ(s["cached_tokens"], 100.0);
  EXPECT_EQ(s["computed_prompt_tokens"], 180.0);
  EXPECT_EQ(s["completion_tokens"], 30.0);
  EXPECT_DOUBLE_EQ(s["token_reuse"].get<double>(), 100.0 / 280);
  EXPECT_EQ(s["history_tokens_later_turns"], 120.0);
  EXPECT_DOUBLE_EQ(s["history_reuse_later_turns"].get<double>(), 100.0 / 120);
  // TTFTs 100, 50, 200 ms: nearest-rank p50 = 2nd of 3 = 100, p90 = 3rd = 200.
  EXPECT_DOUBLE_EQ(s["ttft_ms_p50"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(s["ttft_ms_p90"].get<double>(), 200);
  EXPECT_NEAR(s["ttft_ms_mean"].get<double>(), 350.0 / 3, 1e-9);
  EXPECT_EQ(s["history_heavy_turns"], 1u);
  EXPECT_DOUBLE_EQ(s["ttft_ms_p50_history_heavy"].get<double>(), 50);
  // By turn: turn 1 has 100 and 200 ms (p50 = 100), turn 2 has 50 ms.
  EXPECT_DOUBLE_EQ(s["ttft_ms_p50_by_turn"]["1"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(s["ttft_ms_p50_by_turn"]["2"].get<double>(), 50);
  // Time per output token: every turn ends 0.5 s after its first token, 10 tokens: 500 / 9
  // ms; the server's 27 gaps sum to 1.35 s: 50 ms.
  EXPECT_DOUBLE_EQ(s["tpot_ms_p50"].get<double>(), 500.0 / 9);
  EXPECT_DOUBLE_EQ(s["tpot_ms_p90"].get<double>(), 500.0 / 9);
  EXPECT_DOUBLE_EQ(s["server_tpot_ms_mean"].get<double>(), 50);
  // Prefill busy: [0, 0.1) u [0.05, 0.25) u [1.0, 1.05) = 0.25 + 0.05 s.
  EXPECT_DOUBLE_EQ(s["prefill_busy_s"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(s["sum_ttft_s"].get<double>(), 0.35);
  EXPECT_DOUBLE_EQ(s["prefill_tokens_per_s_served"].get<double>(), 280 / 0.3);
  EXPECT_DOUBLE_EQ(s["prefill_tokens_per_s_computed"].get<double>(), 180 / 0.3);
  // The server's counters: 3 hits (2 DRAM, 1 SSD) of 4 lookups; 0.3 s over 3 TTFTs.
  EXPECT_EQ(s["store"]["lookups"], 4.0);
  EXPECT_DOUBLE_EQ(s["store"]["hit_rate"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(s["store"]["hit_rate_dram"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["store"]["hit_rate_ssd"].get<double>(), 0.25);
  EXPECT_EQ(s["store"]["misses"], 0.0);  // not exported: 0
  EXPECT_NEAR(s["server_ttft_ms_mean"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(s["server_queue_wait_ms_mean"].get<double>(), 10, 1e-9);
  EXPECT_TRUE(s["server_cpu_s"].is_null());  // not measured
}

TEST(SessionsSummary, RemoteHitsAndServersBehindABalancer) {
  // Two servers with DRAM and a remote tier (no SSD): the remote tier is their tier 1,
  // which the old per-level counter reports under "ssd"; the by-name counter is used.
  RunResult r = HandMadeRun();
  const MetricValues a{{"attic_kv_store_lookups_total", 6},
                       {"attic_kv_store_hits_total{tier=\"dram\"}", 4},
                       {"attic_kv_store_hits_total{tier=\"ssd\"}", 0},
                       {"attic_kv_store_tier_hits_total{tier=\"dram\"}", 4},
                       {"attic_kv_store_tier_hits_total{tier=\"remote\"}", 0}};
  const MetricValues b{{"attic_kv_store_lookups_total", 4},
                       {"attic_kv_store_hits_total{tier=\"dram\"}", 1},
                       {"attic_kv_store_hits_total{tier=\"ssd\"}", 3},
                       {"attic_kv_store_tier_hits_total{tier=\"dram\"}", 1},
                       {"attic_kv_store_tier_hits_total{tier=\"remote\"}", 3},
                       {"attic_kv_store_shared_found_total", 2}};
  r.instance_deltas = {a, b};
  r.metrics_delta.clear();
  for (const auto* d : {&a, &b})
    for (const auto& [k, v] : *d) r.metrics_delta[k] += v;
  const nlohmann::json s = Summarize(r);
  EXPECT_EQ(s["store"]["lookups"], 10.0);
  EXPECT_DOUBLE_EQ(s["store"]["hit_rate"].get<double>(), 0.8);  // (5 + 3) / 10
  EXPECT_DOUBLE_EQ(s["store"]["hit_rate_dram"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["store"]["hit_rate_ssd"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(s["store"]["hit_rate_remote"].get<double>(), 0.3);
  EXPECT_EQ(s["store"]["shared_found"], 2.0);
  ASSERT_EQ(s["store"]["instances"].size(), 2u);
  EXPECT_EQ(s["store"]["instances"][0]["lookups"], 6.0);
  EXPECT_EQ(s["store"]["instances"][0]["hits"], 4.0);
  EXPECT_EQ(s["store"]["instances"][1]["hits"], 4.0);
  EXPECT_EQ(s["store"]["instances"][1]["shared_found"], 2.0);
  ::testing::internal::CaptureStdout();
  PrintSummaryTable({s});
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("| store hit rate: all (DRAM / SSD / remote) | 80.0% (50.0% / 0.0% / 30.0%) |  |\n"),
            std::string::npos)
      << out;
}

TEST(SessionsSummary, TurnsJson) {
  const nlohmann::json t = TurnsJson(HandMadeRun());
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[1]["turn"], 2);  // 1-based
  EXPECT_DOUBLE_EQ(t[1]["ttft_ms"].get<double>(), 50);
  EXPECT_DOUBLE_EQ(t[1]["total_ms"].get<double>(), 550);
  EXPECT_FALSE(t[1].contains("error"));
  EXPECT_EQ(t[3]["ok"], false);
  EXPECT_EQ(t[3]["error"], "boom");
}

TEST(SessionsReport, RatiosAndTable) {
  EXPECT_EQ(Ratio(1, 4), "0.250x");
  EXPECT_EQ(Ratio(1, 0), "-");
  EXPECT_EQ(Ratio(-1, 2), "-");
  EXPECT_EQ(Num(nlohmann::json{{"a", 2.5}, {"b", "text"}}, "a"), 2.5);
  EXPECT_EQ(Num(nlohmann::json{{"a", 2.5}, {"b", "text"}}, "b"), 0);
  const nlohmann::json r = CaOverRe({{"ttft_ms_p50", 10.0}, {"prefill_busy_s", 3.0}},
                                    {{"ttft_ms_p50", 40.0}, {"prefill_busy_s", 0.0}});
  EXPECT_DOUBLE_EQ(r["ttft_p50"].get<double>(), 0.25);
  EXPECT_TRUE(r["prefill_busy"].is_null());  // RE's is 0

  ::testing::internal::CaptureStdout();
  PrintSummaryTable({Summarize(HandMadeRun())});
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.substr(0, out.find('\n', out.find('\n') + 1) + 1), "| metric | CA | CA / RE |\n|---|---|---|\n");
  EXPECT_NE(out.find("| turns ok (failed) | 3 (1) |  |\n"), std::string::npos) << out;
  EXPECT_NE(out.find("| store hit rate: all (DRAM / SSD) | 75.0% (50.0% / 25.0%) |  |\n"), std::string::npos) << out;
  EXPECT_NE(out.find("| TTFT p50 / p90 ms, all turns | 100.0 / 200.0 | - / - |\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("by turn"), std::string::npos);  // only with both modes
}

TEST(SessionsPlot, TwoPanelsEscapedTitle) {
  const RunResult ca = HandMadeRun();
  RunResult re = HandMadeRun();
  re.mode = "RE";
  const std::string svg = PlotSvg({&ca, &re}, "a<b & c");
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_NE(svg.find(">a&lt;b &amp; c</text>"), std::string::npos);
  EXPECT_NE(svg.find("CA (KV store)"), std::string::npos);
  EXPECT_NE(svg.find("RE (recompute)"), std::string::npos);
  size_t circles = 0;
  for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1)) ++circles;
  EXPECT_EQ(circles, 4u);  // a median for turns 1 and 2, per mode
}

}  // namespace
}  // namespace attic::bench::sessions
