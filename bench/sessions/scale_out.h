// `attic bench sessions --routing-matrix`: the same trace replayed by one server (the
// reference) and by N servers behind nginx (docs/serving.md "Several servers behind
// nginx") with session-affinity or random routing, each with and without the shared KV
// tier (--kv-remote). This file turns the runs' summaries (Summarize) into the
// "scale_out" JSON object and its table, and checks the bar: with affinity the
// store hit rate is within 5 points of the reference's; with random routing and the
// shared tier it is >= 80% of it; random routing without the shared tier is reported
// for contrast. Pure functions (the printing writes to stdout); call from one thread.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace attic::bench::sessions {

// One row of the matrix, as `attic bench sessions` (src/cli/bench_sessions_cmd.cc) runs it.
struct ScaleOutRow {
  std::string label;           // "1 instance", "2 x affinity", "2 x random + shared", ...
  int instances = 1;
  std::string routing;         // "" for one instance; else affinity / round-robin / random
  bool shared = false;         // the servers share --kv-remote
};

// `rows[i]` with its summary `sums[i]`; rows[0] is the reference (one instance).
// {"rows": [{label, instances, routing, shared, hit_rate, history_reuse, ttft_ms_p50,
// ttft_ms_p90, prefill_tok_s_served, prefill_tok_s_computed, lookups_per_instance,
// shared_found}], "checks": {"affinity_hit_rate_points_below_reference": {label: pts},
// "random_shared_hit_rate_over_reference": x, "random_local_hit_rate": x,
// "affinity_within_5_points": bool, "random_shared_at_least_80_percent": bool,
// "reference_hit_rate", "reference_history_reuse", "history_reuse": {label: x}}} (a
// check is absent when its rows did not run). The hit rate counts a lookup that reused
// anything (an older turn, another session's shared prefix); history_reuse (later
// turns' cached tokens over their history tokens) shows how much was reused.
nlohmann::json ScaleOutJson(const std::vector<ScaleOutRow>& rows, const std::vector<nlohmann::json>& sums);

// The Markdown table of ScaleOutJson's rows, then one line per check.
void PrintScaleOut(const nlohmann::json& scale_out);

}  // namespace attic::bench::sessions
