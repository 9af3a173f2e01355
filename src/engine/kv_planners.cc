// KvPlanners (kv_planners.h): the features' planners behind the scheduler's connector.
#include "engine/kv_planners.h"

namespace attic::engine {

KvPlanners::KvPlanners(Engine& engine, const SchedulerOptions& options) {
  const model::ModelConfig& c = engine.model().config();
  pq::SparsePlannerOptions so;
  so.defaults = options.sparse;
  so.offload_bytes = options.sparse_offload_bytes;
  so.shape = AttentionShapeOf(c);
  so.n_layers = c.n_layers;
  so.context_length = engine.context_length();
  so.kv_shape = engine.kv_pool().shape();
  so.pool_blocks = engine.kv_pool().n_blocks();
  so.chunk_tokens = engine.transformer().max_batch_tokens();
  so.rope = &engine.transformer().rope();
  so.threads = &engine.threads();
  auto sparse = std::make_unique<pq::SparsePlanner>(std::move(so));
  sparse_ = sparse.get();
  connector_.Add(std::move(sparse));
}

kv::KvRequest KvPlanners::RequestOf(const GenerationRequest& request) const {
  kv::KvRequest r;
  r.tenant = request.tenant;
  r.session_id = request.session_id;
  r.n_prompt = static_cast<int>(std::min<size_t>(request.prompt.size(), 1u << 30));
  r.max_new_tokens = request.sampling.max_tokens;
  r.n_choices = request.n;
  r.samples = !request.prefill_only;
  if (request.sparse != nullptr) r.options.Set(request.sparse);
  return r;
}

void KvPlanners::PublishStats(SchedulerStats* stats) const { stats->sparse = sparse_->stats(); }

}  // namespace attic::engine
