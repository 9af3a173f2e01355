#include "bench/sessions/report.h"

#include <cstdio>
#include <utility>

#include "bench/common/format.h"

namespace attic::bench::sessions {

using json = nlohmann::json;

double Num(const json& j, const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0.0; }

std::string Ratio(double a, double b) {
  if (!(b > 0) || !(a >= 0)) return "-";
  return Fmt("%.3fx", a / b);
}

void PrintSummaryTable(const std::vector<json>& sums) {
  const json* ca = nullptr;
  const json* re = nullptr;
  for (const auto& s : sums) (s["mode"] == "CA" ? ca : re) = &s;
  auto row = [&](const std::string& name, auto cell, const std::string& ratio) {
    std::vector<std::string> cells{name};
    for (const auto& s : sums) cells.push_back(cell(s));
    cells.push_back(ratio);
    std::fputs(TableRow(cells).c_str(), stdout);
  };
  auto both = [&](const char* k) -> std::pair<double, double> {
    return {ca ? Num(*ca, k) : -1, re ? Num(*re, k) : -1};
  };
  std::vector<std::string> columns{"metric"};
  for (const auto& s : sums) columns.push_back(s["mode"].get<std::string>());
  columns.push_back("CA / RE");
  std::fputs(TableHeader(columns).c_str(), stdout);
  row("turns ok (failed)", [](const json& s) { return Fmt("%.0f (%.0f)", Num(s, "turns_ok"), Num(s, "turns_failed")); }, "");
  {
    auto [a, b] = both("prompt_tokens");
    row("prompt tokens served", [](const json& s) { return Fmt("%.0f", Num(s, "prompt_tokens")); }, Ratio(a, b));
  }
  {
    auto [a, b] = both("computed_prompt_tokens");
    row("prompt tokens computed (served - cached)",
        [](const json& s) { return Fmt("%.0f", Num(s, "computed_prompt_tokens")); }, Ratio(a, b));
  }
  bool remote = false;  // a shared tier answered some lookup: its column too
  for (const auto& s : sums) remote = remote || (s.contains("store") && Num(s["store"], "hits_remote") > 0);
  row(remote ? "store hit rate: all (DRAM / SSD / remote)" : "store hit rate: all (DRAM / SSD)",
      [remote](const json& s) {
        const json& st = s["store"];
        if (!(Num(st, "lookups") > 0)) return std::string("- (no store)");
        std::string r = Fmt("%.1f%% (%.1f%% / %.1f%%", 100 * Num(st, "hit_rate"), 100 * Num(st, "hit_rate_dram"),
                            100 * Num(st, "hit_rate_ssd"));
        if (remote) r += Fmt(" / %.1f%%", 100 * Num(st, "hit_rate_remote"));
        return r + ")";
      },
      "");
  row("DRAM hits read from the write buffer (save still queued)",
      [](const json& s) {
        const json& st = s["store"];
        return Num(st, "lookups") > 0 ? Fmt("%.0f", Num(st, "write_buffer_hits")) : std::string("-");
      },
      "");
  row("history tokens reused (later turns)",
      [](const json& s) { return Fmt("%.1f%%", 100 * Num(s, "history_reuse_later_turns")); }, "");
  {
    auto [a, b] = both("ttft_ms_p50");
    auto [c, d] = both("ttft_ms_p90");
    row("TTFT p50 / p90 ms, all turns",
        [](const json& s) { return Fmt("%.1f / %.1f", Num(s, "ttft_ms_p50"), Num(s, "ttft_ms_p90")); },
        Ratio(a, b) + " / " + Ratio(c, d));
  }
  {
    auto [a, b] = both("ttft_ms_p50_history_heavy");
    auto [c, d] = both("ttft_ms_p90_history_heavy");
    row("TTFT p50 / p90 ms, turns >= 90% history (n)",
        [](const json& s) {
          return Fmt("%.1f / %.1f (%.0f)", Num(s, "ttft_ms_p50_history_heavy"), Num(s, "ttft_ms_p90_history_heavy"),
                     Num(s, "history_heavy_turns"));
        },
        Ratio(a, b) + " / " + Ratio(c, d));
  }
  {
    auto [a, b] = both("server_ttft_ms_mean");
    row("server-side TTFT mean ms (of which queue wait)",
        [](const json& s) { return Fmt("%.1f (%.1f)", Num(s, "server_ttft_ms_mean"), Num(s, "server_queue_wait_ms_mean")); },
        Ratio(a, b));
  }
  {
    auto [a, b] = both("tpot_ms_p50");
    auto [c, d] = both("tpot_ms_p90");
    row("time per output token p50 / p90 ms (server mean)",
        [](const json& s) {
          return Fmt("%.1f / %.1f (%.1f)", Num(s, "tpot_ms_p50"), Num(s, "tpot_ms_p90"), Num(s, "server_tpot_ms_mean"));
        },
        Ratio(a, b) + " / " + Ratio(c, d));
  }
  {
    auto [a, b] = both("prefill_tokens_per_s_served");
    row("prefill throughput, served tok/s", [](const json& s) { return Fmt("%.0f", Num(s, "prefill_tokens_per_s_served")); },
        Ratio(a, b));
  }
  {
    auto [a, b] = both("prefill_tokens_per_s_computed");
    row("prefill throughput, computed tok/s",
        [](const json& s) { return Fmt("%.0f", Num(s, "prefill_tokens_per_s_computed")); }, Ratio(a, b));
  }
  {
    auto [a, b] = both("prefill_busy_s");
    auto [c, d] = both("sum_ttft_s");
    row("prefill busy s / sum of TTFT s",
        [](const json& s) { return Fmt("%.2f / %.2f", Num(s, "prefill_busy_s"), Num(s, "sum_ttft_s")); },
        Ratio(a, b) + " / " + Ratio(c, d));
  }
  if (ca != nullptr && Num((*ca)["kv_load"], "loads_layerwise") + Num((*ca)["kv_load"], "loads_sync") > 0) {
    row("CA stored-KV loads: layer-wise / sync; fetch / enter / wait s",
        [](const json& s) {
          const json& k = s["kv_load"];
          return Fmt("%.0f / %.0f; ", Num(k, "loads_layerwise"), Num(k, "loads_sync")) +
                 Fmt("%.2f / %.2f / %.2f", Num(k, "fetch_s"), Num(k, "enter_s"), Num(k, "wait_s"));
        },
        "");
    // The entering rate: stored bytes over the time spent entering them (layer-wise,
    // that time is the loader thread's, sharing the cores with the forward it overlaps).
    row("CA stored KV entered: GB, GB/s of enter time",
        [](const json& s) {
          const json& k = s["kv_load"];
          const double gb = Num(k, "entered_bytes") / 1e9, secs = Num(k, "enter_s");
          return secs > 0 ? Fmt("%.2f, %.1f", gb, gb / secs) : std::string("-");
        },
        "");
  }
  {
    auto [a, b] = both("server_cpu_s");
    row("server CPU time s (compute)",
        [](const json& s) { return s["server_cpu_s"].is_number() ? Fmt("%.1f", Num(s, "server_cpu_s")) : std::string("-"); },
        Ratio(a, b));
  }
  {
    auto [a, b] = both("wall_s");
    row("replay wall time s", [](const json& s) { return Fmt("%.1f", Num(s, "wall_s")); }, Ratio(a, b));
  }
  if (ca && re) {
    std::printf("\nmedian TTFT (ms) by turn of the session:\n\n");
    std::vector<std::string> by_turn_columns{"turn"};
    for (const auto& s : sums) by_turn_columns.push_back(s["mode"].get<std::string>());
    by_turn_columns.push_back("CA / RE");
    std::fputs(TableHeader(by_turn_columns).c_str(), stdout);
    const json& cb = (*ca)["ttft_ms_p50_by_turn"];
    const json& rb = (*re)["ttft_ms_p50_by_turn"];
    for (int k = 1;; ++k) {  // keys are "1", "2", ...: numeric order
      const std::string key = std::to_string(k);
      if (!cb.contains(key) && !rb.contains(key)) break;
      double c = cb.value(key, -1.0), r = rb.value(key, -1.0);
      std::fputs(TableRow({std::to_string(k), c >= 0 ? Fmt("%.1f", c) : "-", r >= 0 ? Fmt("%.1f", r) : "-", Ratio(c, r)})
                     .c_str(),
                 stdout);
    }
  }
}

json CaOverRe(const json& ca, const json& re) {
  auto ratio = [&](const char* k) -> json {
    double a = Num(ca, k), b = Num(re, k);
    return b > 0 ? json(a / b) : json(nullptr);
  };
  return json{{"ttft_p50", ratio("ttft_ms_p50")},
              {"ttft_p90", ratio("ttft_ms_p90")},
              {"ttft_p50_history_heavy", ratio("ttft_ms_p50_history_heavy")},
              {"ttft_p90_history_heavy", ratio("ttft_ms_p90_history_heavy")},
              {"prefill_throughput_served", ratio("prefill_tokens_per_s_served")},
              {"prefill_busy", ratio("prefill_busy_s")},
              {"tpot_p50", ratio("tpot_ms_p50")},
              {"sum_ttft", ratio("sum_ttft_s")},
              {"server_cpu", ratio("server_cpu_s")},
              {"computed_prompt_tokens", ratio("computed_prompt_tokens")}};
}

void PrintVerdict(const json& ratios) {
  std::printf("\nCA/RE: TTFT p50 on turns >= 90%% history %s; prefill throughput %s\n",
              ratios["ttft_p50_history_heavy"].is_number()
                  ? Fmt("%.3fx", ratios["ttft_p50_history_heavy"].get<double>()).c_str()
                  : "-",
              ratios["prefill_throughput_served"].is_number()
                  ? Fmt("%.2fx", ratios["prefill_throughput_served"].get<double>()).c_str()
                  : "-");
}

}  // namespace attic::bench::sessions
