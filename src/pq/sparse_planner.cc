// SparsePlanner (sparse_planner.h): selectors, the PQ index and offload behind the KV
// connector.
#include "attic/pq/sparse_planner.h"

#include <algorithm>
#include <optional>

#include "attic/pq/pq_index.h"

namespace attic::pq {

void SparsePlanner::PublishStats(kv::KvStats* stats) const {
  stats->Set(std::make_shared<const SparseDecodeStats>(stats_));
}

void SparseDecodeStats::Add(SparseMethod method, const SparseStats& s) {
  ++requests[SparseMethodName(method)];
  sparse_steps += static_cast<uint64_t>(s.sparse_steps);
  full_steps += static_cast<uint64_t>(s.full_steps);
  attended_slots += static_cast<uint64_t>(s.attended_slots);
  context_slots += static_cast<uint64_t>(s.context_slots);
  select_seconds += s.select_seconds;
  clustered_keys += static_cast<uint64_t>(s.clustered_keys);
  cluster_seconds += s.cluster_seconds;
  encoded_keys += static_cast<uint64_t>(s.encoded_keys);
  imported_keys += static_cast<uint64_t>(s.imported_keys);
}

void SparseDecodeStats::AddOffload(const OffloadStats& s) {
  ++offloaded_requests;
  offloaded_blocks += static_cast<uint64_t>(s.offloaded_blocks);
  offload_cache_hits += static_cast<uint64_t>(s.cache_hits);
  offload_cache_misses += static_cast<uint64_t>(s.cache_misses);
  offload_fetched_bytes += static_cast<uint64_t>(s.fetched_bytes);
  offload_fetch_seconds += s.fetch_seconds;
  offload_errors += static_cast<uint64_t>(s.backing_errors);
}

// One sequence's selector: its layer hooks at every step (prefill and decode; it decides
// what to narrow). An offloaded one (`offloaded`) holds cache_blocks pool blocks and
// tier_bytes of the planner's tier, given back when the state goes.
struct SparsePlanner::Seq final : kv::KvSeqState {
  ~Seq() override { *tier_reserved -= tier_bytes; }
  kv::LayerHooks* hooks(bool decoding) override { return selector.get(); }
  int blocks_held(const kv::SequenceKv& kv) const override {
    return offloaded ? kv.n_resident_blocks() + cache_blocks : -1;
  }

  std::unique_ptr<SparseAttention> selector;
  bool offloaded = false;
  int cache_blocks = 0;
  int64_t tier_bytes = 0;
  int64_t* tier_reserved = nullptr;
};

SparsePlanner::SparsePlanner(SparsePlannerOptions options) : options_(std::move(options)) {}

SparsePlanner::~SparsePlanner() = default;

const SparseOptions* SparsePlanner::SelectorOf(const kv::KvRequest& request) const {
  const std::shared_ptr<const SparseOptions> o = request.options.Get<SparseOptions>();
  return o != nullptr && o->method != SparseMethod::kFull ? o.get() : nullptr;
}

bool SparsePlanner::Offloads(const kv::KvRequest& request) const {
  const SparseOptions* o = SelectorOf(request);
  return o != nullptr && o->offload() && request.samples;
}

int SparsePlanner::OffloadBlocks(const SparseOptions& o, int max_slots) const {
  return OffloadWorkingBlocks(o, options_.kv_shape.block_size, max_slots, options_.chunk_tokens) +
         o.offload_cache_blocks;
}

std::unique_ptr<SparseAttention> SparsePlanner::NewSelector(const SparseOptions& o) const {
  return MakeSparseAttention(o, options_.shape, options_.n_layers, *options_.threads);
}

Status SparsePlanner::Check(kv::KvRequest& request, kv::KvLimits* limits) {
  if (request.options.Get<SparseOptions>() == nullptr) request.options.Set(options_.defaults);
  const std::shared_ptr<const SparseOptions> o = request.options.Get<SparseOptions>();
  if (o != nullptr) {
    if (Status st = o->Validate(options_.shape.head_dim); !st.ok()) {
      return InvalidArgumentError(st.message().rfind("sparse", 0) == 0 ? st.message() : "sparse: " + st.message());
    }
  }
  if (SelectorOf(request) != nullptr) limits->no_choices = "sparse decoding";
  if (!Offloads(request)) return OkStatus();
  // An offloaded sequence keeps only its working set in the compute buffer: the window,
  // not the KV budget, bounds it; its whole context must fit the offload tier.
  const int64_t want = std::min<int64_t>(
      static_cast<int64_t>(request.n_prompt) + std::max(1, request.max_new_tokens) - 1, options_.context_length);
  const int64_t tier = OffloadTierBytes(options_.kv_shape, static_cast<int>(want), options_.offload_dtype);
  if (tier > options_.offload_bytes) {
    return OutOfRangeError("an offloaded context of " + std::to_string(want) + " tokens needs " +
                           std::to_string(tier >> 20) + " MiB of offload tier, more than its capacity of " +
                           std::to_string(options_.offload_bytes >> 20) + " MiB (--sparse-offload-bytes)");
  }
  const int blocks = OffloadBlocks(*o, static_cast<int>(want));
  if (blocks > options_.pool_blocks) {
    return OutOfRangeError("an offloaded sequence needs " + std::to_string(blocks) +
                           " KV blocks resident (its window, a prefill chunk and the block cache), more than the " +
                           std::to_string(options_.pool_blocks) + " the compute buffer holds");
  }
  limits->max_slots = options_.context_length;
  // Entering reused KV into an offloaded sequence is not built: it computes its prompt.
  limits->whole_prompt = true;
  return OkStatus();
}

void SparsePlanner::Match(const kv::KvQueue& queue, kv::KvAdmission* admission) {
  if (admission == nullptr) return;
  const kv::KvSeq& seq = *queue.waiting.front();
  if (!Offloads(seq.request)) return;
  const SparseOptions& o = *SelectorOf(seq.request);
  admission->blocks = OffloadBlocks(o, admission->max_slots);
  admission->free_first = o.offload_cache_blocks;
  admission->ready =
      tier_reserved_ + OffloadTierBytes(options_.kv_shape, admission->max_slots, options_.offload_dtype) <=
      options_.offload_bytes;
}

Status SparsePlanner::Start(kv::KvSeq& seq, kv::KvSlots* slots) {
  std::unique_ptr<kv::KvSeqState>& slot = state(seq);
  slot.reset();
  kv::SequenceKv* kv = slots->get();
  const kv::KvReused& reused = slots->reused;
  // A prefill-only request samples nothing: it never decodes, sparsely or not.
  const SparseOptions* o = SelectorOf(seq.request);
  if (o == nullptr || !seq.request.samples) return OkStatus();
  auto s = std::make_unique<Seq>();
  s->tier_reserved = &tier_reserved_;
  if (Offloads(seq.request)) {
    // The selector, wrapped so that the sequence's complete blocks leave for the tier.
    if (!tier_) tier_ = std::make_unique<store::DramTier>(options_.offload_bytes);
    OffloadOptions oo;
    oo.cache_blocks = o->offload_cache_blocks;
    oo.policy = o->offload_policy;
    oo.tier_dtype = options_.offload_dtype;
    auto made = MakeOffloadedSparseAttention(NewSelector(*o), oo, kv, *options_.rope, tier_.get(), options_.n_layers,
                                             *options_.threads);
    if (!made.ok()) return made.status();  // no room for the cache yet (the reservation check makes this rare)
    s->selector = std::move(*made);
    s->offloaded = true;
    s->cache_blocks = o->offload_cache_blocks;
    s->tier_bytes = OffloadTierBytes(options_.kv_shape, seq.limits.max_slots, options_.offload_dtype);
    tier_reserved_ += s->tier_bytes;
  } else {
    s->selector = NewSelector(*o);
    // KV reused as it was computed keeps the PQ index saved with it (pq_index.h); a bad
    // one is counted and left out (this request clusters).
    if (reused.n_as_is > 0 && reused.attachment) {
      StatusOr<std::string_view> index = reused.attachment(kPqIndexAttachment);
      if (index.ok()) {
        Import(*s->selector, *index, reused.n_as_is);
      } else if (index.status().code() != StatusCode::kNotFound) {
        ++stats_.rejected_indexes;
      }
    }
  }
  slot = std::move(s);
  return OkStatus();
}

void SparsePlanner::Import(SparseAttention& selector, std::string_view blob, int n) {
  if (selector.options().method != SparseMethod::kPq) return;
  StatusOr<PqIndex> index = DeserializePqIndex(blob);
  if (index.ok()) {
    index->Truncate(n);
    if (selector.ImportIndex(std::move(*index)).ok()) {
      ++stats_.imported_indexes;
      return;
    }
  }
  ++stats_.rejected_indexes;  // bad bytes, or built with other m / bits
}

void SparsePlanner::Finish(kv::KvSeq& seq, const kv::SequenceKv* kv, kv::KvKeep* keep) {
  std::unique_ptr<kv::KvSeqState>& slot = state(seq);
  auto* s = static_cast<Seq*>(slot.get());
  if (s == nullptr || s->selector == nullptr) return;
  // The PQ index goes with the sequence's KV: saved with its turn, kept with it resident;
  // codes only of the slots the sequence (and its save) holds.
  if (kv != nullptr) {
    if (std::optional<PqIndex> index = s->selector->ExportIndex()) {
      index->Truncate(kv->n_slots());
      keep->attachments.push_back({kPqIndexAttachment, std::make_shared<const std::string>(SerializePqIndex(*index))});
    }
  }
  stats_.Add(s->selector->options().method, s->selector->stats());
  if (s->offloaded) {
    stats_.AddOffload(static_cast<const OffloadedSparseAttention&>(*s->selector).offload_stats());
    // Its released blocks are gone: it cannot stay resident.
    keep->resident = false;
  }
  slot.reset();  // an offloaded sequence's blocks leave the tier, its cache the pool
}

}  // namespace attic::pq
