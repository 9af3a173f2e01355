// KvFeatures (kv_features.h): the features' planners behind the scheduler's connector.
#include "attic/engine/kv_features.h"

#include "attic/pic/link_planner.h"
#include "attic/pq/sparse_planner.h"
#include "attic/store/store_planner.h"

namespace attic::engine {

namespace {

std::unique_ptr<kv::KvConnector> Connect(const KvFeatureOptions& options, Engine& engine, const SchedulerOptions& sched,
                                         store::KvStore* store) {
  const model::ModelConfig& c = engine.model().config();
  auto connector = std::make_unique<kv::ComposedConnector>();
  auto link = std::make_unique<pic::LinkPlanner>(store, engine.kv_pool().shape());
  pq::SparsePlannerOptions so;
  so.defaults = options.sparse;
  so.offload_bytes = options.sparse_offload_bytes;
  so.offload_dtype = options.sparse_offload_dtype;
  so.shape = AttentionShapeOf(c);
  so.n_layers = c.n_layers;
  so.context_length = engine.context_length();
  so.kv_shape = engine.kv_pool().shape();
  so.pool_blocks = engine.kv_pool().n_blocks();
  so.chunk_tokens = engine.transformer().max_batch_tokens();
  so.rope = &engine.transformer().rope();
  so.threads = &engine.threads();
  auto sparse = std::make_unique<pq::SparsePlanner>(std::move(so));
  std::unique_ptr<store::StorePlanner> kept;
  if (store != nullptr) {
    store::StorePlannerOptions o;
    o.store = store;
    o.pool = &engine.kv_pool();
    o.rope = &engine.transformer().rope();
    o.threads = &engine.threads();
    o.extension = link.get();
    o.context_length = engine.context_length();
    o.min_reuse_tokens = sched.min_reuse_tokens;
    o.lookahead = options.store_lookahead;
    o.save = options.store_save;
    o.preload = options.kv_preload;
    o.read_buffer_bytes = options.kv_read_buffer_bytes;
    o.truncate_ratio = options.truncate_ratio;
    o.truncate_keep_first = options.truncate_keep_first;
    o.truncate_recompute = options.truncate_recompute;
    kept = std::make_unique<store::StorePlanner>(std::move(o));
  }
  connector->Add(std::move(link));
  connector->Add(std::move(sparse));
  if (kept != nullptr) connector->Add(std::move(kept));
  return connector;
}

}  // namespace

KvConnectorFactory KvFeatures(KvFeatureOptions options) {
  return [options = std::move(options)](Engine& engine, const SchedulerOptions& sched, store::KvStore* store) {
    return Connect(options, engine, sched, store);
  };
}

}  // namespace attic::engine
