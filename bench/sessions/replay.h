// The client side of `attic bench sessions`: replays a workload against one server as
// real chat clients would. Each session is a thread that sleeps until its arrival time
// and then, turn by turn, sends a streaming POST /v1/chat/completions with messages =
// the whole history + the new user message (the history holds what the server actually
// answered, as a real client's does), session_id, max_tokens = the turn's answer length,
// temperature 0 and ignore_eos (unless disabled), thinks, and goes on; a failed turn
// ends its session. The session id also goes in an X-Session-Id header, as a client
// behind a session-affinity balancer sends it (docs/serving.md "Several servers behind
// nginx"). One warm-up request per server comes first (first-use costs are not the
// workload), and /metrics is scraped before and after the replay: of the one server,
// or of each server behind a balancer (summed).
// Thread-safety: Replay blocks until every session has finished; it is not reentrant
// with itself on the same server (the metrics deltas would mix).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "bench/client/metrics.h"
#include "bench/sessions/workload.h"

namespace attic::bench::sessions {

struct TurnResult {
  int session = 0, turn = 0;  // turn: 0-based
  bool ok = false;
  std::string error;
  double sent_s = 0;   // from the start of the replay
  double ttft_s = 0;   // sent -> first non-empty content chunk
  double total_s = 0;  // sent -> last byte
  int prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  int history_tokens = 0;  // min(prompt, previous prompt + completion); 0 for first turns
  std::string answer;      // cleared once the session has used it
};

// One mode's replay ("CA" or "RE").
struct RunResult {
  std::string mode, url;
  std::vector<TurnResult> turns;  // sorted by (session, turn)
  MetricValues metrics_delta;     // the server's /metrics, after - before the replay
                                  // (behind a balancer: the sum over its servers)
  std::vector<MetricValues> instance_deltas;  // behind a balancer: each server's delta
  double cpu_s = -1;              // server CPU seconds during the replay; -1: unknown
  double wall_s = 0;
};

struct ReplayOptions {
  std::string api_key;
  // The servers keep a KV store: the warm-up's stored session is deleted again.
  bool store = false;
  // The servers behind `url` when it is a balancer ("http://host:port" each): each is
  // warmed up and scraped directly. Empty: `url` is the server.
  std::vector<std::string> instance_urls;
  bool ignore_eos = true;
  bool quiet = false;  // no per-turn progress lines on stderr
  // Unique per replay: session ids are "bench-<nonce>-s<i>", the warm-ups'
  // "warmup-<nonce>-<server>" (deleted again when the store is on).
  std::string nonce;
  // The server process's CPU seconds so far (-1 if unknown), sampled before and after
  // the replay; null when the server is not the benchmark's own.
  std::function<double()> server_cpu_seconds;
};

// Replays `work` against the server at `url` labelled `mode`. Errors: the server's
// model id cannot be read, or the warm-up request fails; failed turns are reported in
// the result, not as an error.
StatusOr<RunResult> Replay(const std::string& mode, const std::string& url, const std::vector<SessionSpec>& work,
                           const ReplayOptions& o);

}  // namespace attic::bench::sessions
