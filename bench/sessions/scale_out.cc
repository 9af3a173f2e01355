#include "bench/sessions/scale_out.h"

#include <cstdio>

#include "bench/common/format.h"
#include "bench/sessions/report.h"

namespace attic::bench::sessions {

using json = nlohmann::json;

json ScaleOutJson(const std::vector<ScaleOutRow>& rows, const std::vector<json>& sums) {
  json out{{"rows", json::array()}, {"checks", json::object()}};
  for (size_t i = 0; i < rows.size() && i < sums.size(); ++i) {
    const json& s = sums[i];
    const json& st = s["store"];
    json per = json::array();
    if (st.contains("instances") && !st["instances"].empty()) {
      for (const auto& inst : st["instances"]) per.push_back(Num(inst, "lookups"));
    } else {
      per.push_back(Num(st, "lookups"));
    }
    out["rows"].push_back({{"label", rows[i].label},
                           {"instances", rows[i].instances},
                           {"routing", rows[i].routing},
                           {"shared", rows[i].shared},
                           {"turns_ok", Num(s, "turns_ok")},
                           {"turns_failed", Num(s, "turns_failed")},
                           {"hit_rate", Num(st, "hit_rate")},
                           {"hit_rate_remote", Num(st, "hit_rate_remote")},
                           {"history_reuse", Num(s, "history_reuse_later_turns")},
                           {"ttft_ms_p50", Num(s, "ttft_ms_p50")},
                           {"ttft_ms_p90", Num(s, "ttft_ms_p90")},
                           {"prefill_tok_s_served", Num(s, "prefill_tokens_per_s_served")},
                           {"prefill_tok_s_computed", Num(s, "prefill_tokens_per_s_computed")},
                           {"lookups_per_instance", per},
                           {"shared_found", Num(st, "shared_found")}});
  }
  if (out["rows"].empty()) return out;
  const double ref = out["rows"][0]["hit_rate"].get<double>();
  const double ref_reuse = out["rows"][0]["history_reuse"].get<double>();
  json& checks = out["checks"];
  checks["reference_hit_rate"] = ref;
  checks["reference_history_reuse"] = ref_reuse;
  // The hit rate counts any reuse, also of an older turn or of another session's shared
  // prefix (a random route often finds one); the history reused shows how much.
  json reuse = json::object();
  for (const auto& r : out["rows"]) reuse[r["label"].get<std::string>()] = r["history_reuse"];
  checks["history_reuse"] = reuse;
  json below = json::object();
  bool affinity_ok = true, any_affinity = false;
  for (const auto& r : out["rows"]) {
    if (r["routing"] == "affinity") {
      const double pts = 100 * (ref - r["hit_rate"].get<double>());
      below[r["label"].get<std::string>()] = pts;
      affinity_ok = affinity_ok && pts <= 5;
      any_affinity = true;
    } else if (r["routing"] == "random" && r["shared"] == true) {
      checks["random_shared_hit_rate_over_reference"] = ref > 0 ? json(r["hit_rate"].get<double>() / ref) : json(nullptr);
      checks["random_shared_at_least_80_percent"] = ref > 0 && r["hit_rate"].get<double>() >= 0.8 * ref;
    } else if (r["routing"] == "random") {
      checks["random_local_hit_rate"] = r["hit_rate"];
    }
  }
  if (any_affinity) {
    checks["affinity_hit_rate_points_below_reference"] = below;
    checks["affinity_within_5_points"] = affinity_ok;
  }
  return out;
}

void PrintScaleOut(const json& so) {
  std::printf("\n");
  std::fputs(TableHeader({"servers", "store hit rate (remote)", "history reused", "TTFT p50 / p90 ms",
                          "prefill tok/s served / computed", "lookups per server", "turns ok (failed)"})
                 .c_str(),
             stdout);
  for (const auto& r : so["rows"]) {
    std::string per;
    for (const auto& n : r["lookups_per_instance"]) per += (per.empty() ? "" : " / ") + Fmt("%.0f", n.get<double>());
    std::fputs(TableRow({r["label"].get<std::string>(),
                         Fmt("%.1f%% (%.1f%%)", 100 * Num(r, "hit_rate"), 100 * Num(r, "hit_rate_remote")),
                         Fmt("%.1f%%", 100 * Num(r, "history_reuse")),
                         Fmt("%.1f / %.1f", Num(r, "ttft_ms_p50"), Num(r, "ttft_ms_p90")),
                         Fmt("%.0f / %.0f", Num(r, "prefill_tok_s_served"), Num(r, "prefill_tok_s_computed")), per,
                         Fmt("%.0f (%.0f)", Num(r, "turns_ok"), Num(r, "turns_failed"))})
                   .c_str(),
               stdout);
  }
  const json& c = so["checks"];
  std::printf("\n");
  if (c.contains("affinity_hit_rate_points_below_reference")) {
    for (const auto& [label, pts] : c["affinity_hit_rate_points_below_reference"].items()) {
      const double p = pts.get<double>();
      std::printf("%s: hit rate %.1f points %s one instance's (bar: at most 5 below)\n", label.c_str(),
                  p < 0 ? -p : p, p < 0 ? "above" : "below");
    }
  }
  if (c.contains("random_shared_hit_rate_over_reference") && c["random_shared_hit_rate_over_reference"].is_number())
    std::printf("random routing + shared tier: hit rate %.0f%% of one instance's (bar: >= 80%%)\n",
                100 * c["random_shared_hit_rate_over_reference"].get<double>());
  if (c.contains("random_local_hit_rate"))
    std::printf("random routing without the shared tier: hit rate %.1f%% (contrast)\n",
                100 * c["random_local_hit_rate"].get<double>());
  if (c.contains("history_reuse")) {
    std::printf("history reused (later turns' cached / history tokens):");
    for (const auto& [label, v] : c["history_reuse"].items()) std::printf(" %s %.1f%%;", label.c_str(), 100 * v.get<double>());
    std::printf("\n");
  }
}

}  // namespace attic::bench::sessions
