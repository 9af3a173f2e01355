// KvPlanners (internal to the scheduler): the engine's KV connector -- each feature's
// planner (kv/connector.h), composed in the order their hooks run: linking's
// (pic::LinkPlanner), sparse decoding's (pq::SparsePlanner), the store's
// (store::StorePlanner, last: its Start makes the slots the others build on, its Finish
// saves what they keep) -- and how the scheduler's request types reach it. The one place
// in the engine that names the planners; the scheduler speaks only the connector's calls.
//
// Thread-safety: the step loop's, except RequestOf (any thread).
#pragma once

#include <memory>
#include <vector>

#include "attic/engine/scheduler.h"
#include "attic/kv/connector.h"

namespace attic::engine {

class KvPlanners {
 public:
  // `engine` must outlive the planners. No store: sparse decoding's planner only.
  KvPlanners(Engine& engine, const SchedulerOptions& options);
  ~KvPlanners();

  // The planners over `store` (null: none; it must outlive them): linking's and the
  // store's join sparse decoding's. Before the first request is admitted.
  void SetStore(store::KvStore* store);
  kv::KvConnector& connector() { return *connector_; }
  // What the connector sees of `request` whose prompt is `prompt` (its features' options,
  // by type).
  kv::KvRequest RequestOf(const GenerationRequest& request, std::shared_ptr<const std::vector<int32_t>> prompt) const;
 private:
  Engine& engine_;
  const SchedulerOptions options_;
  std::unique_ptr<kv::ComposedConnector> connector_;
};

}  // namespace attic::engine
