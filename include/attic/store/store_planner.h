// StorePlanner: the KV store's part of the KV connector (kv/connector.h; paper 001,
// CachedAttention): a sequence's stored KV and its turn (turn.h). The planner
//   Check      truncates a prompt longer than the context window in the stored KV
//              (decoupled truncation, paper section 3.4: StorePlannerOptions::truncate_ratio)
//   Match      puts the queue's head off while the lookup it needs would wait for a queued
//              save (unless nothing runs: then the wait blocks nobody); hands the store the
//              queue as look-ahead jobs (eviction window, prefetch, read buffer) and the
//              engine's measured prefill rate (the read buffer's S_buf)
//   Start      enters stored KV when it covers more of the prompt than the compute buffer's
//              reuse (KvSlots::n_local): the session's entry, its save still queued (read
//              through), the tenant's longest stored prefix, or a truncated prompt's kept
//              rows -- plus what an extension enters after it (pic's linked chunks) -- by
//              the sequence's turn, as StorePlannerOptions::preload says; else the turn of
//              the resident sequence the slots came from (renewed or branched), or a new one
//   WaitLayer  waits for the turn's load layer by layer; after the last layer counts the
//              finished load, records its reused tokens, or reports a load that broke off
//              (KvSeq::lost: the sequence starts over)
//   Finish     saves the turn (asynchronously) with the attachments the planners before it
//              keep; the turn stays with a resident sequence
// A sequence's state hooks the turn saver into the forward pass: every layer's new
// pre-RoPE K and V go to its turn (appended, or written in place for recomputed slots).
//
// Thread-safety: the step loop's, like the connector.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attic/attention/rope.h"
#include "attic/backend/thread_pool.h"
#include "attic/kv/block_pool.h"
#include "attic/kv/connector.h"
#include "attic/store/kv_loader.h"
#include "attic/store/kv_store.h"
#include "attic/store/turn.h"

namespace attic::store {

// Loading stored KV, since start (step loop; the scheduler publishes it with its stats).
struct KvLoadStats {
  uint64_t loads = 0;               // entries entered into the compute buffer
  uint64_t layerwise_loads = 0;     // of which pre-loaded layer by layer
  uint64_t write_buffer_loads = 0;  // of which read from a save still queued (not waited for)
  uint64_t failed_loads = 0;        // loads whose streamed read broke off: the request recomputed
  uint64_t staged = 0;              // read-buffer fetches issued (the store's)
  uint64_t staged_used = 0;         // read-buffer fetches a job then used
  double fetch_seconds = 0;         // fetch + verify on the step loop (no read buffer)
  double enter_seconds = 0;         // entering (RoPE + copy), on whichever thread
  uint64_t entered_bytes = 0;       // stored KV bytes entered (its rate: entered_bytes / enter_seconds)
  double wait_seconds = 0;          // step loop waiting for a layer to be entered
  uint64_t deferred_for_save = 0;   // admissions put off a step: the session's save was queued
  double t_load_per_token = 0;      // measured (EMA), seconds
  double t_prefill_per_token = 0;   // measured (EMA), seconds
};

// How a truncated prompt maps onto the session's stored entry (paper 001 section 3.4).
// The stored entry E holds original tokens [0, keep) + [o, o+m); the prompt after
// truncation is original [0, keep) + [o+skip, n). `store_view` is the prompt as E saw
// it: original [0, keep) + [o, n) (what to look E up with; shared with look-ahead
// hints). `dropped`: the prompt tokens after the first `keep` that are gone (o - keep +
// skip). Check keeps it with the request (KvRequestOptions).
struct Truncation {
  int keep = 0;
  int skip = 0;
  int dropped = 0;
  std::shared_ptr<const std::vector<int32_t>> store_view;
};

// Where a sequence's slots come from in stored KV, before its first forward step:
// `segments` enter slots [0, n_cached) in slot order, each slot s at positions[s] (RoPE
// applied as it enters), holding tokens[s].
struct StoredPlan {
  std::vector<LoadSegment> segments;
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  int n_cached = 0;  // slots that exist when the sequence starts
  // What an extension (StoredKvExtension) entered: whether it added any slot; of the
  // slots, those whose KV is cached (the prefix and its own; -1 = n_cached) and those
  // of them it will compute again anyway (not counted as reused); whether the turn is
  // saved.
  bool extended = false;
  int n_stored = -1;
  int n_recomputed = 0;
  bool save = true;

  bool empty() const { return n_cached == 0; }
};

// The first n rows of a stored source, at the positions they were computed at.
StoredPlan PlanStoredPrefix(std::shared_ptr<const KvSource> source, int n);
// A truncated prompt over its session's stored entry `source`, whose first `common`
// tokens match t.store_view: entry rows [0, keep) and [keep + skip, common) re-enter at
// positions 0, 1, ... (K is pre-RoPE, so re-embedding is exact per token; the KV itself
// was computed with the dropped tokens in context -- the paper's approximation), at most
// `cap` of them. `prompt`: the truncated prompt (the slots' tokens).
StoredPlan PlanTruncated(const Truncation& t, std::shared_ptr<const KvSource> source, int common, int cap,
                         const std::vector<int32_t>& prompt);

// Stored KV that another planner enters with a sequence's own (pic's linked chunks,
// pic/link_planner.h): the store asks it at Start, when no resident sequence's slots are
// reused and the stored prefix does not cover what it needs.
class StoredKvExtension {
 public:
  virtual ~StoredKvExtension() = default;
  // The prompt slots [0, n) that KV from elsewhere must cover to make the extension
  // unneeded for `seq` (0: it adds nothing).
  virtual int Needs(const kv::KvSeq& seq) const = 0;
  // Extends `plan` (stored KV for the first plan->n_cached slots, maybe none) with what
  // it enters after them, into `slots` (the sequence's slots, still empty: the plan fills
  // them). Leaves `plan` as it is when it has nothing to add.
  virtual void Extend(kv::KvSeq& seq, const kv::SequenceKv* slots, StoredPlan* plan) = 0;
  // Look-ahead: the stored entries a waiting `seq` reads besides its own (after its job).
  virtual void AppendJobs(const kv::KvSeq& seq, std::vector<QueuedJob>* jobs) const = 0;
};

struct StorePlannerOptions {
  KvStore* store = nullptr;                    // outlives the planner
  kv::BlockPool* pool = nullptr;               // the compute buffer; outlives the planner
  const attention::RopeTable* rope = nullptr;  // the model's; outlives the planner
  backend::ThreadPool* threads = nullptr;      // the step's threads (inline entering); outlives it
  StoredKvExtension* extension = nullptr;      // null = none; outlives the planner
  int context_length = 0;
  int min_reuse_tokens = 8;    // shortest stored prefix worth loading
  int lookahead = 64;          // waiting requests shown to the store
  bool save = true;            // save each finished turn (false: a read-only store)
  Preload preload = Preload::kLayerwise;  // how stored KV enters
  int64_t read_buffer_bytes = -1;         // KvStore::SetReadBuffer (-1: S_buf per job)
  // Decoupled truncation (SchedulerOptions says more): drop at least this ratio of the
  // tokens after the first truncate_keep_first of an overlong prompt (0 = off); with
  // truncate_recompute, recompute what is kept instead of reusing its stored KV (TT).
  double truncate_ratio = 0;
  int truncate_keep_first = 0;
  bool truncate_recompute = false;
};

class StorePlanner final : public kv::KvPlanner {
 public:
  // Attaches the compute buffer to the store (once) and sets its read buffer.
  explicit StorePlanner(StorePlannerOptions options);
  ~StorePlanner() override;

  Status Check(kv::KvRequest& request, kv::KvLimits* limits) override;
  void Match(const kv::KvQueue& queue, kv::KvAdmission* head) override;
  Status Start(kv::KvSeq& seq, kv::KvSlots* slots) override;
  double WaitLayer(kv::KvSeq& seq, int layer) override;
  void Finish(kv::KvSeq& seq, const kv::SequenceKv* kv, kv::KvKeep* keep) override;

  // Since start, with the store's read-buffer figures (step loop); PublishStats publishes
  // them.
  KvLoadStats stats() const;
  void PublishStats(kv::KvStats* stats) const override;

 private:
  struct Seq;
  // The prompt shortened to `limit` tokens (Truncation), sticky across a session's turns.
  void TruncatePrompt(kv::KvRequest& request, int limit) const;
  // Stored KV for the sequence (the store's match, planned for its prompt: a prefix, or a
  // truncated prompt's kept rows); an empty plan when none of at least min_tokens.
  StoredPlan PlanStored(const kv::KvSeq& seq, int min_tokens) const;
  // Enters `plan` into slots->kv (still empty) by a new turn of `s`; false when the load
  // broke off at once (a sync load; NoteFailedLoad).
  bool LoadPlan(kv::KvSeq& seq, Seq& s, StoredPlan plan, kv::KvSlots* slots);
  // s's load broke off (its turn's load_failed()): its slots hold no valid KV.
  void NoteFailedLoad(const kv::KvSeq& seq, Seq& s);
  // A new turn of the sequence (invalidated when not saved).
  std::unique_ptr<Turn> NewTurn(const kv::KvSeq& seq, bool save) const;
  // Collects `turn`'s finished load (if any) into stats_: enter time, bytes.
  void CountFinishedLoad(Turn& turn);

  StorePlannerOptions options_;
  KvStore& store_;
  KvLoadStats stats_;
  uint64_t last_deferred_ = 0;  // the last head put off (counted once)
};

}  // namespace attic::store
