#include "bench/sessions/summary.h"

#include <map>
#include <utility>
#include <vector>

#include "bench/common/stats.h"

namespace attic::bench::sessions {

namespace {

using json = nlohmann::json;

constexpr double kHistoryShare = 0.9;  // "turns whose prompt is >= 90% history"

}  // namespace

bool HistoryHeavy(const TurnResult& t) {
  return t.ok && t.turn > 0 && t.prompt_tokens > 0 && t.history_tokens >= kHistoryShare * t.prompt_tokens;
}

json Summarize(const RunResult& r) {
  std::vector<double> ttft_all, ttft_heavy, tpot;  // tpot: per turn, (total - TTFT) / (tokens - 1)
  std::vector<std::pair<double, double>> prefill;
  double prompt = 0, cached = 0, completion = 0, history = 0, cached_later = 0, sum_ttft = 0;
  int ok = 0, errors = 0;
  std::string first_error;
  std::map<int, std::vector<double>> by_turn;
  for (const auto& t : r.turns) {
    if (!t.ok) {
      ++errors;
      if (first_error.empty()) first_error = t.error;
      continue;
    }
    ++ok;
    ttft_all.push_back(t.ttft_s * 1e3);
    if (HistoryHeavy(t)) ttft_heavy.push_back(t.ttft_s * 1e3);
    by_turn[t.turn + 1].push_back(t.ttft_s * 1e3);
    prefill.emplace_back(t.sent_s, t.sent_s + t.ttft_s);
    if (t.completion_tokens > 1) tpot.push_back((t.total_s - t.ttft_s) * 1e3 / (t.completion_tokens - 1));
    sum_ttft += t.ttft_s;
    prompt += t.prompt_tokens;
    cached += t.cached_tokens;
    completion += t.completion_tokens;
    if (t.turn > 0) {
      history += t.history_tokens;
      cached_later += t.cached_tokens;
    }
  }
  const double busy = UnionLength(prefill);
  auto metric = [&](const std::string& k) {
    auto it = r.metrics_delta.find(k);
    return it == r.metrics_delta.end() ? 0.0 : it->second;
  };
  const double lookups = metric("attic_kv_store_lookups_total");
  const double ttft_count = metric("attic_time_to_first_token_seconds_count");
  // Hits by tier: attic_kv_store_tier_hits_total{tier} names every tier (DRAM, SSD,
  // remote); servers without it report attic_kv_store_hits_total (tiers 0 and 1 only).
  const bool by_name = r.metrics_delta.count("attic_kv_store_tier_hits_total{tier=\"dram\"}") > 0;
  const double hits_dram = metric(by_name ? "attic_kv_store_tier_hits_total{tier=\"dram\"}"
                                          : "attic_kv_store_hits_total{tier=\"dram\"}");
  const double hits_ssd = metric(by_name ? "attic_kv_store_tier_hits_total{tier=\"ssd\"}"
                                         : "attic_kv_store_hits_total{tier=\"ssd\"}");
  const double hits_remote = metric("attic_kv_store_tier_hits_total{tier=\"remote\"}");
  const double hits = hits_dram + hits_ssd + hits_remote;
  // Behind a balancer: how the lookups and hits fell on each server.
  json instances = json::array();
  for (const MetricValues& d : r.instance_deltas) {
    auto get = [&d](const std::string& k) {
      auto it = d.find(k);
      return it == d.end() ? 0.0 : it->second;
    };
    instances.push_back({{"lookups", get("attic_kv_store_lookups_total")},
                         {"hits", get("attic_kv_store_tier_hits_total{tier=\"dram\"}") +
                                      get("attic_kv_store_tier_hits_total{tier=\"ssd\"}") +
                                      get("attic_kv_store_tier_hits_total{tier=\"remote\"}")},
                         {"shared_found", get("attic_kv_store_shared_found_total")}});
  }
  json turn_p50 = json::object();
  for (const auto& [k, v] : by_turn) turn_p50[std::to_string(k)] = Percentile(v, 50);
  json s{{"mode", r.mode},
         {"url", r.url},
         {"turns_ok", ok},
         {"turns_failed", errors},
         {"wall_s", r.wall_s},
         {"prompt_tokens", prompt},
         {"cached_tokens", cached},
         {"computed_prompt_tokens", prompt - cached},
         {"completion_tokens", completion},
         {"token_reuse", prompt > 0 ? cached / prompt : 0.0},
         {"history_tokens_later_turns", history},
         {"history_reuse_later_turns", history > 0 ? cached_later / history : 0.0},
         {"store",
          {{"lookups", lookups},
           {"hits_dram", hits_dram},
           {"hits_ssd", hits_ssd},
           {"hits_remote", hits_remote},
           {"misses", metric("attic_kv_store_misses_total")},
           {"hit_rate", lookups > 0 ? hits / lookups : 0.0},
           {"hit_rate_dram", lookups > 0 ? hits_dram / lookups : 0.0},
           {"hit_rate_ssd", lookups > 0 ? hits_ssd / lookups : 0.0},
           {"hit_rate_remote", lookups > 0 ? hits_remote / lookups : 0.0},
           {"shared_found", metric("attic_kv_store_shared_found_total")},
           {"instances", instances},
           {"reused_tokens", metric("attic_kv_store_reused_tokens_total")},
           {"bytes_loaded", metric("attic_kv_store_bytes_total{direction=\"load\"}")},
           {"bytes_saved", metric("attic_kv_store_bytes_total{direction=\"save\"}")},
           {"bytes_dram_to_ssd", metric("attic_kv_store_bytes_total{direction=\"dram_to_ssd\"}")},
           {"bytes_ssd_to_dram", metric("attic_kv_store_bytes_total{direction=\"ssd_to_dram\"}")},
           {"prefetches", metric("attic_kv_store_prefetches_total")},
           {"evictions_dram", metric("attic_kv_store_evictions_total{tier=\"dram\"}")},
           {"evictions_ssd", metric("attic_kv_store_evictions_total{tier=\"ssd\"}")},
           {"save_waits", metric("attic_kv_store_save_waits_total")},
           {"lookup_waits", metric("attic_kv_store_lookup_waits_total")},
           {"lookup_wait_s", metric("attic_kv_store_lookup_wait_seconds_total")},
           {"write_buffer_hits", metric("attic_kv_store_write_buffer_hits_total")},
           // What the store holds at the end (gauges: their change over the replay, which
           // for a server started empty is the end value): the conversations a fixed
           // --kv-dram keeps, and their bytes.
           {"entries_end", metric("attic_kv_store_entries")},
           {"dram_bytes_end", metric("attic_kv_store_bytes{tier=\"dram\"}")},
           {"other_type_misses", metric("attic_kv_store_other_type_misses_total")},
           {"admissions_deferred_for_save", metric("attic_kv_admissions_deferred_total")}}},
         // Where loading stored KV spent its time (servers that export it).
         {"kv_load",
          {{"loads_layerwise", metric("attic_kv_load_total{mode=\"layerwise\"}")},
           {"loads_sync", metric("attic_kv_load_total{mode=\"sync\"}")},
           {"fetch_s", metric("attic_kv_load_seconds_total{phase=\"fetch\"}")},
           {"enter_s", metric("attic_kv_load_seconds_total{phase=\"enter\"}")},
           {"entered_bytes", metric("attic_kv_entered_bytes_total")},
           {"wait_s", metric("attic_kv_load_seconds_total{phase=\"wait\"}")}}},
         {"scheduler_steps", metric("attic_scheduler_steps_total")},
         {"server_cached_tokens", metric("attic_prompt_tokens_reused_total")},
         {"server_ttft_ms_mean", ttft_count > 0 ? metric("attic_time_to_first_token_seconds_sum") * 1e3 / ttft_count : 0.0},
         {"server_queue_wait_ms_mean",
          ttft_count > 0 ? metric("attic_queue_wait_seconds_sum") * 1e3 / ttft_count : 0.0},
         {"ttft_ms_p50", Percentile(ttft_all, 50)},
         {"ttft_ms_p90", Percentile(ttft_all, 90)},
         {"ttft_ms_mean", ttft_all.empty() ? 0.0 : sum_ttft * 1e3 / ttft_all.size()},
         {"history_heavy_turns", ttft_heavy.size()},
         {"ttft_ms_p50_history_heavy", Percentile(ttft_heavy, 50)},
         {"ttft_ms_p90_history_heavy", Percentile(ttft_heavy, 90)},
         {"ttft_ms_p50_by_turn", turn_p50},
         {"tpot_ms_p50", Percentile(tpot, 50)},
         {"tpot_ms_p90", Percentile(tpot, 90)},
         {"server_tpot_ms_mean",
          metric("attic_time_per_output_token_seconds_count") > 0
              ? metric("attic_time_per_output_token_seconds_sum") * 1e3 / metric("attic_time_per_output_token_seconds_count")
              : 0.0},
         {"prefill_busy_s", busy},
         {"sum_ttft_s", sum_ttft},
         {"prefill_tokens_per_s_served", busy > 0 ? prompt / busy : 0.0},
         {"prefill_tokens_per_s_computed", busy > 0 ? (prompt - cached) / busy : 0.0},
         {"server_cpu_s", r.cpu_s >= 0 ? json(r.cpu_s) : json(nullptr)}};
  if (!first_error.empty()) s["first_error"] = first_error;
  return s;
}

json TurnsJson(const RunResult& r) {
  json a = json::array();
  for (const auto& t : r.turns) {
    json j{{"session", t.session},         {"turn", t.turn + 1},
           {"ok", t.ok},                   {"sent_s", t.sent_s},
           {"ttft_ms", t.ttft_s * 1e3},    {"total_ms", t.total_s * 1e3},
           {"prompt_tokens", t.prompt_tokens}, {"history_tokens", t.history_tokens},
           {"cached_tokens", t.cached_tokens}, {"completion_tokens", t.completion_tokens}};
    if (!t.ok) j["error"] = t.error;
    a.push_back(j);
  }
  return a;
}

}  // namespace attic::bench::sessions
