// Server metrics in the Prometheus text exposition format (GET /metrics): HTTP requests
// by endpoint and status, token counters (prompt, generated, reused from resident KV),
// time-to-first-token / time-per-output-token / queue-wait histograms, and gauges read
// from the scheduler at scrape time (queue depth, running sequences, KV blocks, stored-KV
// loading, sparse decoding).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include "attic/server/context_caches.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "attic/engine/scheduler.h"

namespace attic::server {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Appends "<name>_bucket{le=...}", "<name>_sum" and "<name>_count" lines.
  void Render(const std::string& name, std::string* out) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Prometheus text for the KV store's counters (attic_kv_store_*).
std::string RenderStoreMetrics(const store::StoreStats& stats);

class Metrics {
 public:
  Metrics();

  // One HTTP response. `endpoint` should be a known route (bounded label values).
  void CountHttp(const std::string& endpoint, int status);
  // One request that reached the scheduler, when it ends.
  void Observe(const engine::RequestRecord& record);
  // A request with context-cache parts, when it is submitted: its chunks found stored
  // (by tier) or prefilled again, and whether it was linked.
  void CountLink(const LinkPrep& prep, bool linked);
  std::string Render(const engine::SchedulerStats& stats) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> http_;
  std::map<std::string, uint64_t> finished_;  // by outcome: stop, length, cancelled, timeout, error
  uint64_t prompt_tokens_ = 0;
  uint64_t cached_tokens_ = 0;
  uint64_t generated_tokens_ = 0;
  uint64_t recomputed_tokens_ = 0;
  uint64_t linked_requests_ = 0;
  std::map<std::string, uint64_t> chunk_hits_;  // by tier
  uint64_t chunk_misses_ = 0, chunk_regenerated_tokens_ = 0;
  Histogram ttft_;
  Histogram tpot_;
  Histogram queue_;
};

}  // namespace attic::server
