// Internal: the Scheduler's per-request state, shared by scheduler*.cc.
#pragma once

#include <list>
#include <memory>
#include <string>
#include <vector>

#include "attic/engine/scheduler.h"
#include "attic/kv/block_pool.h"
#include "attic/tokenizer/tokenizer.h"
#include "engine/kv_loader.h"

namespace attic::engine {

// How a truncated prompt maps onto the session's stored entry. The stored entry E holds
// original tokens [0, keep) + [o, o+m); the prompt after truncation is original
// [0, keep) + [o+skip, n). `store_view` is the prompt as E saw it: original [0, keep) +
// [o, n) (what to look E up with).
struct Truncation {
  bool active = false;
  int keep = 0;
  int skip = 0;
  std::vector<int32_t> store_view;
};

// A queued request. The prompt is shared with look-ahead views.
struct Scheduler::Waiting {
  uint64_t id = 0;
  GenerationRequest req;  // req.prompt is moved into `prompt`
  std::shared_ptr<const std::vector<int32_t>> prompt;
  std::shared_ptr<ResultChannel> channel;
  Truncation truncation;
  std::shared_ptr<StagedFetch> staged;  // read buffer: its stored entry, fetched ahead
  bool deferred_for_save = false;       // admission put off while its session's save was queued
  // Its session's save still in the write buffer, read by Admit for this admission
  // attempt (KvStore::ReadQueuedSave) and loaded from by LoadFromStore; the prompt
  // shares `queued_common` tokens with it.
  std::shared_ptr<const store::KvEntry> queued_save;
  int queued_common = 0;
};

// Pre-RoPE K and V of a sequence's slots, kept on the host while a KV store is attached
// so that a turn can be saved without recomputation. Per layer: [n, kv_dim].
struct Scheduler::HostKv {
  // Slots [0, base.n_rows): the entry they were loaded from (stored, or a save still
  // queued), shared in place (no copy of the history); the slots after it: k, v per
  // layer, [rows, kv_dim].
  store::KvRowsBase base;
  std::vector<std::vector<float>> k, v;
  bool valid = true;  // false once a slot's KV is unknown (then the turn is not saved)
  // The last save made from these rows while the sequence stayed resident (its rows are
  // rows [0, saved->n_tokens()) here unless a branch replaced them), or null.
  std::shared_ptr<const store::KvEntry> saved;
  int n(int kv_dim) const { return base.n_rows + (k.empty() ? 0 : static_cast<int>(k[0].size() / kv_dim)); }
  // Sizes the per-layer lists and reserves room for slots up to `max_slots`, so that
  // appending each step's new KV never reallocates and copies (pages are touched only
  // when written).
  void Reserve(int n_layers, int max_slots, int kv_dim) {
    k.resize(n_layers);
    v.resize(n_layers);
    const size_t floats = static_cast<size_t>(std::max(0, max_slots - base.n_rows)) * kv_dim;
    for (auto& x : k) x.reserve(floats);
    for (auto& x : v) x.reserve(floats);
  }
  // Makes rows [0, n) of `e` (an immutable entry not serialized yet: a queued save) the
  // base, shared in place, and reserves room up to `max_slots` (see Reserve). A chain of
  // such entries deeper than kMaxUnserializedDepth is cut by copying e's own rows (one
  // level) instead. REQUIRES: no own rows yet.
  static constexpr int kMaxUnserializedDepth = 8;
  void BaseOn(std::shared_ptr<const store::KvEntry> e, int n, int max_slots, int n_layers, int kv_dim);
  // Once the writer has placed `saved` in the DRAM tier, its rows are read from the
  // tier's bytes (shared): the base becomes those bytes and the own rows they cover are
  // dropped. This ends a chain of unserialized saves and frees their rows' second copy.
  // tokens / positions: the sequence's slots now.
  void RebaseOnPlacedSave(store::KvStore& store, const std::vector<int32_t>& tokens,
                          const std::vector<int32_t>& positions, int kv_dim);
  void Truncate(int n_slots, int kv_dim) {
    base.n_rows = std::min(base.n_rows, n_slots);
    const size_t own = static_cast<size_t>(n_slots - base.n_rows) * kv_dim;
    for (auto& x : k) x.resize(std::min(x.size(), own));
    for (auto& x : v) x.resize(std::min(x.size(), own));
  }
};

// A finished (or cancelled) sequence whose KV stays in the compute buffer.
struct Scheduler::Resident {
  std::string tenant;
  std::string session_id;
  std::unique_ptr<kv::SequenceKv> kv;
  std::unique_ptr<HostKv> host;  // with a KV store: the slots' pre-RoPE KV
};

// Which resident sequence a new request reuses, and how.
struct Scheduler::ReusePlan {
  const Resident* source = nullptr;  // nullptr = no reuse
  int n_reuse = 0;                   // common-prefix tokens whose KV is reused
  bool take_over = false;            // adopt the source's blocks (else copy the prefix)
};

// An admitted request: prefilling while kv->n_slots() < prompt->size(), then decoding.
struct Scheduler::Running {
  Running(const tokenizer::Tokenizer& tok, const SamplingParams& params) : sampler(params), decoder(tok) {}

  uint64_t id = 0;
  GenerationRequest req;
  std::shared_ptr<const std::vector<int32_t>> prompt;
  std::shared_ptr<ResultChannel> channel;
  std::unique_ptr<kv::SequenceKv> kv;
  std::unique_ptr<HostKv> host;   // with a KV store: the slots' pre-RoPE KV
  // Stored KV still entering kv's blocks (layer-wise pre-loading); null when done.
  // Declared after kv and host: destroyed first, and waits for the loader, which writes
  // into both.
  struct LoadGuard {
    std::shared_ptr<LoadJob> job;
    ~LoadGuard() {
      if (job) job->WaitAll();
    }
  } load;
  std::string store_key;          // the store entry this turn extends ("" = none)
  Truncation truncation;
  std::vector<int32_t> stop_ids;  // sorted
  int max_slots = 0;              // KV slots this sequence may grow to
  int reserved_blocks = 0;        // BlocksFor(max_slots), reserved at admission
  int n_cached = 0;

  bool decoding = false;
  int32_t next_token = -1;  // sampled, fed at the next step
  Sampler sampler;
  tokenizer::StreamDecoder decoder;
  std::string text;         // generated text so far (cut at a stop string)
  size_t emitted = 0;       // bytes of `text` already pushed
  int n_generated = 0;
  bool done = false;

  double queue_seconds = 0;
  double ttft_seconds = -1;
  SchedClock::time_point last_token;
  std::vector<double> gaps;

  TokenUsage usage() const {
    TokenUsage u;
    u.prompt_tokens = static_cast<int>(prompt->size());
    u.completion_tokens = n_generated;
    u.cached_tokens = n_cached;
    return u;
  }
};

}  // namespace attic::engine
