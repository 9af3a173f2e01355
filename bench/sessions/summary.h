// The statistics of one mode's replay (paper 001 section 4.2's metrics), as the JSON
// object `attic bench sessions` prints under "ca" / "re":
//   * store hit rate: deltas of /metrics attic_kv_store_tier_hits_total{tier} (DRAM, SSD,
//     remote; older servers: attic_kv_store_hits_total) over attic_kv_store_lookups_total
//     (the server's own count: one lookup per admitted request; a first turn can hit
//     another session's entry through the shared system prompt), summed over the servers
//     behind a balancer (and per server under "instances"); also the token reuse:
//     usage.prompt_tokens_details.cached_tokens over the prompt tokens (all turns) and
//     over the history tokens (later turns).
//   * TTFT (client side: request sent -> first non-empty content chunk) p50 / p90 over
//     all turns, and over the turns whose prompt is >= 90% history ("history heavy"),
//     where a turn's history = min(prompt tokens, previous turn's prompt + completion
//     tokens). Percentiles are nearest-rank (bench/common/stats.h): observed TTFTs.
//   * time per output token: per turn (last byte - first token) / (completion tokens - 1),
//     p50 / p90 over turns, and the server's mean gap between sampled tokens
//     (attic_time_per_output_token_seconds): what decoding streams pay for the steps
//     the scheduler gives to prompts.
//   * prefill throughput: prompt tokens / prefill busy time, where the prefill busy time
//     is the wall time during which at least one turn was waiting for its first token
//     (the union of the turns' [sent, first token] intervals; = the sum of TTFTs when no
//     two overlap). "served" counts every prompt token (the paper's definition: CA's is
//     high because history is not recomputed), "computed" only prompt - cached tokens.
//   * compute time: the server process's CPU time (user + system) during the replay
//     (the analogue of the paper's GPU time: prefill, decode, store copies, HTTP), and
//     the sum of TTFTs.
// Pure functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include "bench/sessions/replay.h"

namespace attic::bench::sessions {

// A later turn whose prompt is at least 90% history.
bool HistoryHeavy(const TurnResult& t);

// The summary of one replay: counts, token reuse, the store's and the loader's metric
// deltas, TTFT percentiles (all turns, history-heavy turns, by turn index), prefill busy
// time and throughput, server CPU time; "first_error" when a turn failed.
nlohmann::json Summarize(const RunResult& r);

// Every turn: {"session", "turn" (1-based), "ok", "sent_s", "ttft_ms", "total_ms",
// "prompt_tokens", "history_tokens", "cached_tokens", "completion_tokens"[, "error"]}.
nlohmann::json TurnsJson(const RunResult& r);

}  // namespace attic::bench::sessions
