// Sparse decoding (paper 004, PQCache): at each decode step every KV head of every layer
// attends exactly (softmax over the chosen slots) to a subset of its sequence's slots:
// the initial slots (attention sinks), the local (most recent) slots, and the `top`
// slots of the rest that a selector ranks highest, through the attention's per-KV-head
// index lists (kv::Visibility::head_indices). The selectors share one token budget:
//   full       every slot (the reference; also what a sequence below min_slots gets)
//   pq         PQCache: keys product-quantized (codebook.h) when the first decode step
//              meets a layer; each step scores every coded slot from q . centroid tables
//              and the codes, and takes the top; a slot leaving the local window gets its
//              codes by nearest centroid
//   oracle     exact q . k over every middle slot, the same top (what pq approximates)
//   streaming  StreamingLLM: initial + local only (local takes the whole budget)
//   h2o        H2O: heavy hitters by attention accumulated over every query so far
//              (prefill rows included); a slot it drops is never attended again
// GQA: the query heads sharing a KV head select together; `combine` says how their
// scores of one slot become one (sum of inner products, or their max).
//
// A SparseAttention is the kv::LayerHooks of one sequence's forward steps (kv/layer_hooks.h):
// a step of several rows (prefill) attends in full (h2o accumulates there; the others
// time it, for adaptive clustering); a one-row appending step (decode) narrows each KV
// head to its selection. Nothing outside the hooks changes: the scheduler, `attic eval`
// and the benchmarks attach the same object.
//
// Thread-safety: one SparseAttention per sequence, used by one step at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attic/attention/attention.h"
#include "attic/backend/thread_pool.h"
#include "attic/core/status.h"
#include "attic/kv/layer_hooks.h"
#include "attic/pq/block_cache.h"
#include "attic/pq/codebook.h"
#include "attic/pq/pq_index.h"

namespace attic::pq {

enum class SparseMethod { kFull, kPq, kOracle, kStreaming, kH2o };
// Every method, as the API and the metrics list them: the selectors, then full.
inline constexpr SparseMethod kSparseMethods[] = {SparseMethod::kPq, SparseMethod::kOracle, SparseMethod::kStreaming,
                                                  SparseMethod::kH2o, SparseMethod::kFull};
const char* SparseMethodName(SparseMethod m);  // "full", "pq", "oracle", "streaming", "h2o"
// The method SparseMethodName calls `name`; NotFound for any other name.
StatusOr<SparseMethod> ParseSparseMethod(std::string_view name);
// "pq, oracle, streaming, h2o, full": the names, for messages.
std::string SparseMethodNames();

// How the query heads of one KV head combine their scores of a slot.
enum class GqaCombine { kSum, kMax };

// The block cache offload gets when asked for without a size (the server's
// "offload": true).
inline constexpr int kDefaultOffloadCacheBlocks = 16;

struct SparseOptions {
  SparseMethod method = SparseMethod::kPq;
  double ratio = 0.2;    // budget: this share of the sequence's slots at each step ...
  int count = 0;         // ... or this many slots (count > 0 wins)
  int n_initial = 4;     // always attended
  int n_local = -1;      // the most recent slots, always attended; -1 = a quarter of the budget
  int min_slots = 1024;  // a sequence with fewer slots decodes with full attention
  GqaCombine combine = GqaCombine::kSum;
  PqOptions pq;                 // m, bits, seed; pq.iterations is used when fixed_iterations
  bool fixed_iterations = false;  // false: adaptive (section 3.3), from measured rates
  // adaptive: clustering may take this share of the prefill time the hooks measured (first
  // multi-row step to the first sparse step), split evenly over the layers; the first
  // layer clustered calibrates the cost with 2 iterations. A sequence with no multi-row
  // step through the hooks (KV loaded from a store) uses 6 iterations.
  double cluster_share = 0.05;
  // Offload (offload.h): the sequence's KV below the compute buffer, with a block cache of
  // this many pool blocks (for every layer and KV head) and its victim policy; -1 = off,
  // every slot resident. pq and streaming only (the others read every key each step).
  int offload_cache_blocks = -1;
  CachePolicy offload_policy = CachePolicy::kLru;
  bool offload() const { return offload_cache_blocks >= 0; }
  // InvalidArgument for a ratio outside (0, 1], a negative count, local or initial,
  // offload with another method, or PQ options that do not fit head_dim.
  Status Validate(int head_dim) const;
  // "pq-0.2", "oracle-0.1", "streaming-2048", "h2o-0.2", "full"; options that differ from
  // the defaults follow as "@key=value,..." (ParseSparseOptions reads it back).
  std::string ToString() const;
};

// METHOD[-RATIO|-COUNT][@key=value,...]: "pq-0.2", "pq-0.1@iters=8", "oracle-512",
// "h2o-0.2@local=64,initial=4", "pq-0.2@m=4,bits=8,combine=max,min=2048", "full".
// Keys: initial, local, min, combine (sum|max), m, bits, iters (fixed iterations),
// share (adaptive share), offload (cache blocks: offload on), cache (lru|lfu). A ratio
// has a decimal point; a count does not. The server's --sparse and `attic eval
// --methods` both read this.
StatusOr<SparseOptions> ParseSparseOptions(std::string_view text);

// The budget at a step over n_slots slots (n_slots >= min_slots), split: initial +
// local + top == min(n_slots, budget), each >= 0. The budget is ratio * n_slots rounded
// to nearest (or count), at least 1. local >= 1: the decoding token's own slot is the
// last local one (a budget of at most n_initial slots gives up initial ones for it).
struct Budget {
  int initial = 0, local = 0, top = 0;
};
Budget SplitBudget(const SparseOptions& options, int n_slots);

struct SparseStats {
  int64_t sparse_steps = 0;    // decode steps that attended sparsely
  int64_t full_steps = 0;      // decode steps below min_slots
  int64_t attended_slots = 0;  // per layer and KV head, summed over sparse steps
  int64_t context_slots = 0;   // n_slots per layer and KV head, summed over sparse steps
  double select_seconds = 0;   // scoring and top-k (pq, oracle, h2o)
  // pq:
  int64_t clustered_keys = 0;  // per layer and KV head
  double cluster_seconds = 0;
  int iterations = 0;          // the k-means iterations used (last layer clustered)
  int64_t encoded_keys = 0;    // keys coded after leaving the local window
  int64_t index_bytes = 0;     // codebooks + codes held now
  int64_t imported_layers = 0; // layers that started from an imported index (no clustering)
  int64_t imported_keys = 0;   // coded slots taken from it, per layer and KV head
};

class SparseAttention : public kv::LayerHooks {
 public:
  virtual const SparseOptions& options() const = 0;
  virtual const SparseStats& stats() const = 0;
  // The slots KV head `kv_head` of layer `layer` attended to at the most recent sparse
  // step (ascending); empty before any. Tests and the block-cache benchmark read it.
  virtual const std::vector<int32_t>& last_selection(int layer, int kv_head) const = 0;
  // pq only (nullptr otherwise, and before the layer's first sparse step): the codebook
  // of KV head `kv_head` of layer `layer`, and the codes of its slots [0, n_coded)
  // ([n_coded, m] bytes: slots leave the local window in order). Tests read them.
  virtual const PqCodebook* codebook(int layer, int kv_head) const { return nullptr; }
  virtual const std::vector<uint8_t>* codes(int layer, int kv_head) const { return nullptr; }
  // The prefill time adaptive clustering shares (SparseOptions::cluster_share), for a
  // sequence whose prefill the hooks did not see (its KV was prefilled elsewhere and
  // copied in, as a benchmark does, or entered from a store): given before the first
  // sparse step, it replaces the measured time (and the fixed fallback without one).
  virtual void set_prefill_seconds(double seconds) = 0;
  // pq only (nullopt otherwise, or before any layer's first sparse step): the index built
  // so far (pq_index.h), e.g. when the request ends, to save it with the turn's KV.
  virtual std::optional<PqIndex> ExportIndex() const { return std::nullopt; }
  // pq only, before the first step: start from `index` (pq_index.h says for which slots
  // it is valid: the caller truncates it to the slots reused as they were). At its first
  // sparse step a layer the index built is not clustered: its codebooks are the index's,
  // and the slots the index does not code that have left the local window are coded by
  // nearest centroid, as new tokens always are. FailedPrecondition for other methods or
  // after the first step; InvalidArgument when m, bits, head_dim, KV heads or layers
  // differ from the selector's.
  virtual Status ImportIndex(PqIndex index) {
    return FailedPreconditionError(std::string("sparse: method ") + SparseMethodName(options().method) +
                                   " has no PQ index");
  }
};

// `pool` runs scoring and clustering (the step's thread waits for it, as for attention).
std::unique_ptr<SparseAttention> MakeSparseAttention(const SparseOptions& options, const attention::AttentionShape& shape,
                                                     int n_layers, backend::ThreadPool& pool);

}  // namespace attic::pq
