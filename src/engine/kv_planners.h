// KvPlanners (internal to the scheduler): the engine's KV connector -- each feature's
// planner (kv/connector.h), composed in the order their hooks run -- and how the
// scheduler's request types reach it. The one place in the engine that names the
// planners; the scheduler speaks only the connector's calls.
//
// Thread-safety: the step loop's, except RequestOf (any thread).
#pragma once

#include "attic/engine/scheduler.h"
#include "attic/kv/connector.h"

namespace attic::engine {

class KvPlanners {
 public:
  // `engine` must outlive the planners.
  KvPlanners(Engine& engine, const SchedulerOptions& options);

  kv::KvConnector& connector() { return connector_; }
  // What the connector sees of `request` (its features' options, by type).
  kv::KvRequest RequestOf(const GenerationRequest& request) const;
  // The planners' counters, into `stats` (step loop).
  void PublishStats(SchedulerStats* stats) const;

 private:
  kv::ComposedConnector connector_;
  const pq::SparsePlanner* sparse_ = nullptr;
};

}  // namespace attic::engine
