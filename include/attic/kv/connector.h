// KvConnector: the one seam between the engine and whatever supplies, shapes or keeps a
// sequence's KV (DESIGN.md decision 8). vLLM v1's KV connector is the model
// (`get_num_new_matched_tokens`, `start_load_kv`, `wait_for_layer_load`,
// `save_kv_layer`, `request_finished`); here the same questions are five calls:
//
//   Check      (Submit)     is the request's feature options valid, what may it take of
//                           the compute buffer (KvLimits), and its prompt as the planners
//                           shape it (the store's decoupled truncation)?
//   Match      (admission)  what does the queue's head need now (KvAdmission); the rest of
//                           the queue is look-ahead (KvQueue: fetch ahead, keep from eviction)
//   Start      (admitted)   its slots: stored KV a planner enters (KvSlots), else the
//                           compute buffer's; its per-layer hooks and the slots to compute
//   WaitLayer  (each step)  layer l of its KV is ready; after the last layer, what arrived
//   Finish     (it ended)   what to keep: whether it may stay resident, what to save with it
//
// Besides them the engine only reads the planners' counters (PublishStats, as vLLM's
// get_kv_connector_stats): it changes nothing and reaches no store.
//
// Each paper contributes one planner (KvPlanner) in its own module; a ComposedConnector
// calls them in the order they were added (Start in reverse: the last planner, the store,
// supplies the slots the others build on). A planner keeps what it made for one sequence
// in that sequence's KvSeq (KvSeqState: a turn, a selector, a link run), so the engine
// holds one KvSeq per sequence and names no feature. The per-layer hooks of a sequence
// are its states' hooks, called in planner order (KvSeq::ForEachHooks).
//
// Thread-safety: a connector and its planners are used by one thread (the step loop),
// except where a planner says otherwise.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attic/core/status.h"
#include "attic/kv/block_pool.h"
#include "attic/kv/layer_hooks.h"

namespace attic::kv {

// A named blob kept with a sequence's KV (a PQ index): saved with its stored entry, kept
// with it while it is resident.
struct KvAttachment {
  std::string kind;
  std::shared_ptr<const std::string> bytes;
};

// Values by type, at most one per type: a request's options for the planners (vLLM's
// kv_transfer_params: the engine's caller sets them, each planner reads its own) and the
// planners' counters (each publishes its own, KvConnector::PublishStats; readers take the
// type they know). The values are shared and never change: a copy is cheap.
class TypedValues {
 public:
  template <class T>
  void Set(std::shared_ptr<const T> value) {
    for (auto& [key, v] : items_) {
      if (key == Key<T>()) {
        v = std::move(value);
        return;
      }
    }
    items_.emplace_back(Key<T>(), std::move(value));
  }
  // Null when not set.
  template <class T>
  std::shared_ptr<const T> Get() const {
    for (const auto& [key, v] : items_)
      if (key == Key<T>()) return std::static_pointer_cast<const T>(v);
    return nullptr;
  }
  // A copy of the value; T{} when not set.
  template <class T>
  T Value() const {
    std::shared_ptr<const T> v = Get<T>();
    return v != nullptr ? *v : T{};
  }

 private:
  template <class T>
  static const void* Key() {
    static const char key = 0;
    return &key;
  }
  std::vector<std::pair<const void*, std::shared_ptr<const void>>> items_;
};
using KvRequestOptions = TypedValues;  // a request's options for the planners
using KvStats = TypedValues;           // the planners' counters

// What the connector sees of a request.
struct KvRequest {
  uint64_t id = 0;
  std::string tenant;
  std::string session_id;
  int64_t ttl_ms = -1;       // lifetime of what is kept of it (-1 = the keeper's default, 0 = forever)
  // The prompt's tokens; Check may replace them with a shorter prompt (the store's
  // decoupled truncation), which is then the one the engine computes.
  std::shared_ptr<const std::vector<int32_t>> prompt;
  int n_prompt = 0;          // prompt tokens
  int max_new_tokens = 0;    // tokens it may sample
  int n_choices = 1;         // sequences forked from the prompt
  bool samples = true;       // false: prefill only, it never decodes
  // Every prompt token's logits are wanted (prompt logprobs): the prompt is computed
  // whole, as it came (not shortened, nothing linked into it).
  bool prompt_logits = false;
  KvRequestOptions options;  // the planners' options
};

// What a request may take of the compute buffer; the engine fills the defaults, Check
// may change them.
struct KvLimits {
  int max_slots = 0;          // slots one sequence may reach
  bool whole_prompt = false;  // computed from slot 0, reusing no KV
  // Why n > 1 choices are refused (a feature's name, for the message); "" = allowed.
  std::string no_choices;
};

// One sequence's admission (Match).
struct KvAdmission {
  int max_slots = 0;   // in: the slots the sequence may reach now
  int blocks = -1;     // out: compute-buffer blocks to reserve instead of max_slots' (-1 = those)
  int free_first = 0;  // out: free blocks Start takes at once (the engine frees them first)
  bool ready = true;   // out: false = not now (a planner's own capacity is taken, or it
                       // would wait for what another sequence still writes)
  // out: a resident sequence's slots are reused only when they cover at least this many
  // of the prompt's (a linked prompt: all its chunks); 0 = any.
  int min_local = 0;
};

struct KvSeq;

// The waiting queue as the connector sees it at admission (read-only).
struct KvQueue {
  std::vector<const KvSeq*> waiting;  // in admission order: waiting[0] is the head
  bool idle = false;  // no sequence is running: waiting now blocks nobody
  // The engine's measured prefill time per token (its own compute, loads not counted) of
  // the mostly-prefill steps since the previous Match without a head, in order; for a
  // planner that sizes what it fetches ahead by it.
  std::vector<double> prefill_seconds_per_token;
};

class KvSeqState;

// What Start finds in a sequence's slots.
struct KvReused {
  // Slots [0, n_as_is) hold KV at the tokens and positions it was computed at (a stored
  // prefix or a resident sequence reused as it is), with `attachment` its attachments
  // (NotFound for a kind it lacks; another error for bad bytes).
  int n_as_is = 0;
  std::function<StatusOr<std::string_view>(std::string_view kind)> attachment;
  // The resident sequence the slots came from: the states the planners kept with it
  // (KvKeep, by planner), taken with its blocks (`adopted`: a planner may move its state
  // out) or copied (the resident stays); null when they came from none.
  std::vector<std::unique_ptr<KvSeqState>>* from = nullptr;
  bool adopted = false;
};

// A sequence's slots as Start makes them. A planner that supplies them from elsewhere (the
// store's stored KV, when it covers more than the compute buffer's reuse) makes `kv`
// itself; otherwise get() takes the compute buffer's (`local`: the engine's reuse of a
// resident sequence, or empty slots) when a planner first needs them, or after Start.
struct KvSlots {
  // in: slots of the prompt a resident sequence would supply as they are (0 = none).
  int n_local = 0;
  // in: the engine's: frees compute-buffer blocks (evicting resident sequences) so that at
  // least n are free; and makes the compute buffer's slots, saying what they hold.
  std::function<void(int n_blocks)> make_room;
  std::function<std::unique_ptr<SequenceKv>(KvReused* reused)> local;
  // out
  std::unique_ptr<SequenceKv> kv;
  KvReused reused;
  int n_cached = -1;  // of kv's slots, those that hold cached KV (usage); -1 = all of them

  SequenceKv* get() {
    if (kv == nullptr && local) kv = local(&reused);
    return kv.get();
  }
};

// What to keep when a sequence ends (Finish).
struct KvKeep {
  bool resident = true;                   // may stay in the compute buffer
  std::vector<KvAttachment> attachments;  // saved with its KV, kept with it resident
};

// What a planner made for one sequence.
class KvSeqState {
 public:
  virtual ~KvSeqState() = default;
  // The hooks of the sequence's batch entry at a step (null: none); `decoding`: its
  // prompt is in. The engine asks once per step, before the forward begins (the
  // sequence's slots are those before the step's).
  virtual LayerHooks* hooks(bool decoding) { return nullptr; }
  // Slots below the sequence's end that the forward computes (again) in place before
  // its remaining prompt slots, ascending (linking: the tokens between and at the
  // boundaries of linked chunks); null = none.
  virtual const std::vector<int32_t>* compute_slots() const { return nullptr; }
  // Of the cached slots, those computed again (counted out of the cached tokens).
  virtual int recomputed() const { return 0; }
  // The compute-buffer blocks the sequence holds when the planner keeps some of them
  // elsewhere or holds more (a block cache); -1 = its block table's.
  virtual int blocks_held(const SequenceKv& kv) const { return -1; }
};

// One sequence as the connector keeps it.
struct KvSeq {
  KvRequest request;
  KvLimits limits;  // Check's; at admission max_slots becomes the sequence's own
  std::vector<std::unique_ptr<KvSeqState>> states;  // by planner (ComposedConnector's order)
  // Set by a planner (WaitLayer) when the sequence's slots do not hold the KV they should
  // (a load broke off): the engine discards what the step computed for it and starts it
  // over, computing its whole prompt (KvLimits::whole_prompt).
  bool lost = false;

  // f(LayerHooks*) for each state's hooks at this step, in planner order.
  template <class F>
  void ForEachHooks(bool decoding, F&& f) const {
    for (const auto& s : states)
      if (s != nullptr)
        if (LayerHooks* h = s->hooks(decoding)) f(h);
  }
  bool has_hooks(bool decoding) const {
    bool any = false;
    ForEachHooks(decoding, [&](LayerHooks*) { any = true; });
    return any;
  }
  // The first state's compute_slots() (null: none).
  const std::vector<int32_t>* compute_slots() const {
    for (const auto& s : states)
      if (s != nullptr)
        if (const std::vector<int32_t>* c = s->compute_slots()) return c;
    return nullptr;
  }
  int recomputed() const {
    int n = 0;
    for (const auto& s : states)
      if (s != nullptr) n += s->recomputed();
    return n;
  }
  // The compute-buffer blocks the sequence holds: a state's answer, else its table's (a
  // shared, partly filled last block it is still to copy not counted).
  int blocks_held(const SequenceKv& kv) const {
    for (const auto& s : states)
      if (s != nullptr)
        if (int n = s->blocks_held(kv); n >= 0) return n;
    return static_cast<int>(kv.block_table().size()) - kv.n_pending_copies();
  }
};

class KvConnector {
 public:
  virtual ~KvConnector() = default;

  // Submit: the request's options valid (InvalidArgument / OutOfRange otherwise), its
  // defaults filled in, `limits` narrowed or widened.
  virtual Status Check(KvRequest& request, KvLimits* limits) { return OkStatus(); }
  // Admission, every step (Check passed for every waiting sequence). With `head`, what
  // queue.waiting[0] needs to be admitted now (it changes nothing of the sequence); the
  // engine asks for each head it tries, then once with `head` null: the queue as it
  // stays, for the look-ahead (what to fetch ahead, what to keep from eviction).
  virtual void Match(const KvQueue& queue, KvAdmission* head) {}
  // `seq` is admitted (`seq.limits.max_slots` its own now): its slots (`slots`: a planner
  // that supplies them makes them, else slots->get()), its states (replacing any: a
  // sequence started over after a failed load, KvSeq::lost, starts anew with its whole
  // prompt) and what Match asked for reserved. An error: not admitted now (nothing is
  // kept).
  virtual Status Start(KvSeq& seq, KvSlots* slots) { return OkStatus(); }
  // Before layer `layer` of a step runs over `seq`: waits until its KV of the layer is
  // in; returns the seconds the step spent on it (waiting, or entering it on the step's
  // own threads). After the last layer (`layer` = the model's layer count): what the step
  // was waiting for has arrived or failed (KvSeq::lost); returns 0.
  virtual double WaitLayer(KvSeq& seq, int layer) { return 0; }
  // `seq` ended (finished, failed or cancelled) with `kv` its slots (may be null). `keep`
  // comes with the engine's own answer (resident: whether it would keep the slots) and
  // each planner narrows it in turn, seeing what those before it decided. A state a
  // planner leaves in seq.states stays with the slots while they are resident (the
  // store's turn: KvReused::from); the others are released.
  virtual void Finish(KvSeq& seq, const SequenceKv* kv, KvKeep* keep) {}
  // The planners' counters since start, into `stats` by type (each planner its own
  // type; the engine publishes them with its own statistics).
  virtual void PublishStats(KvStats* stats) const {}
};

// A planner: a connector's part for one paper. Its state for a sequence is
// seq.states[index] (state()).
class KvPlanner : public KvConnector {
 protected:
  std::unique_ptr<KvSeqState>& state(KvSeq& seq) const;
  const KvSeqState* state(const KvSeq& seq) const;
  // Its place in a sequence's states (KvSeq::states, KvReused::from).
  int index() const { return index_; }

 private:
  friend class ComposedConnector;
  int index_ = 0;
};

// The planners in the order they were added (that is also the order of each sequence's
// hooks). Check stops at the first error; Match reserves the most blocks any planner
// asks for, frees the sum of free_first, takes the largest min_local, is ready when all
// are; Start runs them last to first (the last planner added, the store, makes the slots
// the others build on) and stops at the first error; WaitLayer sums; Finish passes `keep`
// through them in order (the last, the store, saves what the others keep); PublishStats
// asks each.
class ComposedConnector final : public KvConnector {
 public:
  void Add(std::unique_ptr<KvPlanner> planner);
  int size() const { return static_cast<int>(planners_.size()); }

  Status Check(KvRequest& request, KvLimits* limits) override;
  void Match(const KvQueue& queue, KvAdmission* head) override;
  Status Start(KvSeq& seq, KvSlots* slots) override;
  double WaitLayer(KvSeq& seq, int layer) override;
  void Finish(KvSeq& seq, const SequenceKv* kv, KvKeep* keep) override;
  void PublishStats(KvStats* stats) const override;

 private:
  std::vector<std::unique_ptr<KvPlanner>> planners_;
};

}  // namespace attic::kv
