// What `attic bench sessions` prints for people: the Markdown table of the modes'
// summaries (Summarize) side by side with CA / RE ratios, the median TTFT by turn, and
// the one-line verdict; and the "ca_over_re" ratios of its JSON. Writes to stdout;
// call from one thread.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace attic::bench::sessions {

// A numeric field of `j`, or 0 when it is missing or not a number.
double Num(const nlohmann::json& j, const char* key);

// "a / b" as "1.234x", or "-" when undefined (b <= 0 or a < 0).
std::string Ratio(double a, double b);

// The metric table of `sums` (one column per mode, in order; "CA" and/or "RE"), then,
// when both modes ran, the median TTFT by turn of the session.
void PrintSummaryTable(const std::vector<nlohmann::json>& sums);

// CA / RE of the headline metrics (null where RE's is 0): ttft_p50, ttft_p90,
// ttft_p50_history_heavy, ttft_p90_history_heavy, prefill_throughput_served,
// prefill_busy, sum_ttft, server_cpu, computed_prompt_tokens.
nlohmann::json CaOverRe(const nlohmann::json& ca, const nlohmann::json& re);

// "\nCA/RE: TTFT p50 on turns >= 90% history 0.123x; prefill throughput 4.56x".
void PrintVerdict(const nlohmann::json& ca_over_re);

}  // namespace attic::bench::sessions
