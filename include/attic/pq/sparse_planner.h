// SparsePlanner: sparse decoding's part of the KV connector (kv/connector.h; paper 004,
// PQCache). A request's pq::SparseOptions (its own, else the planner's default) decide
// whether it decodes with a selector (sparse.h); the planner
//   Check   validates them, refuses n > 1 choices with a selector, and for an offloaded
//           request (offload.h) checks that its context fits the offload tier and its
//           working set the compute buffer: such a request is bounded by the context
//           window, not the KV budget, and computes its prompt whole;
//   Match   for an offloaded request: the blocks of its working set and block cache, and
//           whether its tier bytes fit beside those of the running ones;
//   Start   makes the selector (the sequence's layer hooks), from the PQ index saved with
//           KV reused as it is (a stored prefix's attachment, a resident sequence's);
//           an offloaded one wrapped so that complete blocks leave for the offload tier,
//           which the planner owns;
//   Finish  exports the selector's PQ index (pq_index.h) as the sequence's attachment,
//           adds its stats; an offloaded sequence does not stay resident (its blocks are
//           gone).
//
// Thread-safety: the step loop's, like the connector.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "attic/attention/attention.h"
#include "attic/attention/rope.h"
#include "attic/backend/thread_pool.h"
#include "attic/kv/connector.h"
#include "attic/pq/offload.h"
#include "attic/pq/sparse.h"
#include "attic/store/tier.h"

namespace attic::pq {

// Sparse decoding, since start (step loop): the SparseStats of every request that decoded
// with a selector, added when it ended (finished, failed or cancelled). attended_slots /
// context_slots is the measured share of the context attended at sparse steps.
struct SparseDecodeStats {
  std::map<std::string, uint64_t> requests;  // by method name (pq, oracle, streaming, h2o)
  uint64_t sparse_steps = 0;     // decode steps that attended sparsely
  uint64_t full_steps = 0;       // decode steps of such requests below min_slots (full attention)
  uint64_t attended_slots = 0;   // per layer and KV head, summed over sparse steps
  uint64_t context_slots = 0;    // the sequences' slots, per layer and KV head, same steps
  double select_seconds = 0;     // scoring and top-k
  uint64_t clustered_keys = 0;   // pq: keys clustered, per layer and KV head
  double cluster_seconds = 0;    // pq: k-means
  uint64_t encoded_keys = 0;     // pq: keys coded after leaving the local window
  // pq: requests whose selector started from a saved index (a stored prefix's, or a
  // resident sequence's) instead of clustering, the coded keys it held (per layer and KV
  // head), and saved indexes found bad or built with other options (left out: such a
  // request clusters).
  uint64_t imported_indexes = 0;
  uint64_t imported_keys = 0;
  uint64_t rejected_indexes = 0;
  // Offload (offload.h): requests, blocks written to the tier and released, the block
  // cache's hits and misses (selected slots of released blocks), bytes and seconds of
  // reading the tier, and tier failures.
  uint64_t offloaded_requests = 0;
  uint64_t offloaded_blocks = 0;
  uint64_t offload_cache_hits = 0;
  uint64_t offload_cache_misses = 0;
  uint64_t offload_fetched_bytes = 0;
  double offload_fetch_seconds = 0;
  uint64_t offload_errors = 0;
  void Add(SparseMethod method, const SparseStats& s);
  // An offloaded request's OffloadStats, besides Add.
  void AddOffload(const OffloadStats& s);
};

struct SparsePlannerOptions {
  // What a request that names no options gets (the server's --sparse); null or method
  // full = full attention.
  std::shared_ptr<const SparseOptions> defaults;
  // The offload tier's capacity (--sparse-offload-bytes): a request waits until its whole
  // context fits beside the running ones', and one that cannot fit at all is refused.
  int64_t offload_bytes = int64_t{4} << 30;
  // The type of its blocks (OffloadOptions::tier_dtype; the server's store type).
  store::KvDtype offload_dtype = store::KvDtype::kF32;
  // The model and the compute buffer.
  attention::AttentionShape shape;
  int n_layers = 0;
  int context_length = 0;
  kv::KvShape kv_shape;
  int pool_blocks = 0;         // the compute buffer's blocks
  int chunk_tokens = 0;        // rows of one forward step (a prefill chunk)
  const attention::RopeTable* rope = nullptr;  // the model's; outlives the planner
  backend::ThreadPool* threads = nullptr;      // scoring and clustering; outlives the planner
};

class SparsePlanner final : public kv::KvPlanner {
 public:
  explicit SparsePlanner(SparsePlannerOptions options);
  ~SparsePlanner() override;

  Status Check(kv::KvRequest& request, kv::KvLimits* limits) override;
  void Match(const kv::KvQueue& queue, kv::KvAdmission* admission) override;
  Status Start(kv::KvSeq& seq, kv::KvSlots* slots) override;
  void Finish(kv::KvSeq& seq, const kv::SequenceKv* kv, kv::KvKeep* keep) override;

  // Since start (step loop); PublishStats publishes a copy.
  const SparseDecodeStats& stats() const { return stats_; }
  void PublishStats(kv::KvStats* stats) const override;

 private:
  struct Seq;
  // The request's options with a selector (not full attention), or null.
  const SparseOptions* SelectorOf(const kv::KvRequest& request) const;
  bool Offloads(const kv::KvRequest& request) const;
  // The pool blocks an offloaded sequence of at most max_slots slots holds at once, its
  // block cache included.
  int OffloadBlocks(const SparseOptions& o, int max_slots) const;
  std::unique_ptr<SparseAttention> NewSelector(const SparseOptions& o) const;
  // Starts `selector` (method pq) from the serialized index `blob`, valid for its first
  // n slots; counts it imported or rejected.
  void Import(SparseAttention& selector, std::string_view blob, int n);

  SparsePlannerOptions options_;
  std::unique_ptr<store::Tier> tier_;  // offloaded sequences' blocks (made at the first)
  int64_t tier_reserved_ = 0;          // its bytes the running offloaded sequences reserved
  SparseDecodeStats stats_;
};

}  // namespace attic::pq
