// KvPlanners (kv_planners.h): the features' planners behind the scheduler's connector.
#include "engine/kv_planners.h"

#include "attic/pic/link_planner.h"

namespace attic::engine {

KvPlanners::KvPlanners(Engine& engine, const SchedulerOptions& options) : engine_(engine), options_(options) {
  SetStore(nullptr);
}

KvPlanners::~KvPlanners() = default;

void KvPlanners::SetStore(store::KvStore* store) {
  const model::ModelConfig& c = engine_.model().config();
  auto connector = std::make_unique<kv::ComposedConnector>();
  std::unique_ptr<pic::LinkPlanner> link;
  if (store != nullptr) link = std::make_unique<pic::LinkPlanner>(*store, engine_.kv_pool().shape());
  pq::SparsePlannerOptions so;
  so.defaults = options_.sparse;
  so.offload_bytes = options_.sparse_offload_bytes;
  so.shape = AttentionShapeOf(c);
  so.n_layers = c.n_layers;
  so.context_length = engine_.context_length();
  so.kv_shape = engine_.kv_pool().shape();
  so.pool_blocks = engine_.kv_pool().n_blocks();
  so.chunk_tokens = engine_.transformer().max_batch_tokens();
  so.rope = &engine_.transformer().rope();
  so.threads = &engine_.threads();
  auto sparse = std::make_unique<pq::SparsePlanner>(std::move(so));
  std::unique_ptr<store::StorePlanner> kept;
  if (store != nullptr) {
    store::StorePlannerOptions o;
    o.store = store;
    o.pool = &engine_.kv_pool();
    o.rope = &engine_.transformer().rope();
    o.threads = &engine_.threads();
    o.extension = link.get();
    o.context_length = engine_.context_length();
    o.min_reuse_tokens = options_.min_reuse_tokens;
    o.lookahead = options_.store_lookahead;
    o.save = options_.store_save;
    o.preload = options_.kv_preload;
    o.read_buffer_bytes = options_.kv_read_buffer_bytes;
    o.truncate_ratio = options_.truncate_ratio;
    o.truncate_keep_first = options_.truncate_keep_first;
    o.truncate_recompute = options_.truncate_recompute;
    kept = std::make_unique<store::StorePlanner>(std::move(o));
  }
  if (link != nullptr) connector->Add(std::move(link));
  connector->Add(std::move(sparse));
  if (kept != nullptr) connector->Add(std::move(kept));
  connector_ = std::move(connector);
}

kv::KvRequest KvPlanners::RequestOf(const GenerationRequest& request,
                                    std::shared_ptr<const std::vector<int32_t>> prompt) const {
  kv::KvRequest r;
  r.tenant = request.tenant;
  r.session_id = request.session_id;
  r.ttl_ms = request.session_ttl_ms;
  r.n_prompt = static_cast<int>(std::min<size_t>(prompt->size(), 1u << 30));
  r.prompt = std::move(prompt);
  r.max_new_tokens = request.sampling.max_tokens;
  r.n_choices = request.n;
  r.samples = !request.prefill_only;
  r.options = request.kv_options;
  return r;
}

}  // namespace attic::engine
