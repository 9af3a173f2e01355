// KvConnector: the one seam between the engine and whatever supplies, shapes or keeps a
// sequence's KV (DESIGN.md decision 8). vLLM v1's KV connector is the model
// (`get_num_new_matched_tokens`, `start_load_kv`, `wait_for_layer_load`,
// `save_kv_layer`, `request_finished`); here the same questions are five calls:
//
//   Check      (Submit)     is the request's feature options valid, and what may it take of
//                           the compute buffer (KvLimits)?
//   Match      (admission)  what of it is available and what does it need now (KvAdmission)?
//   Start      (admitted)   its slots exist: make its per-layer hooks, start what loads
//   WaitLayer  (each step)  layer l of its KV is ready
//   Finish     (it ended)   what to keep: whether it may stay resident, what to save with it
//
// Each paper contributes one planner (KvPlanner) in its own module; a ComposedConnector
// calls them in the order they were added. A planner keeps what it made for one sequence
// in that sequence's KvSeq (KvSeqState: a selector, a link run), so the engine holds one
// KvSeq per sequence and names no feature. The per-layer hooks of a sequence are its
// states' hooks, called in planner order (KvSeq::ForEachHooks).
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

// A request's options for the planners, at most one value per type (vLLM's
// kv_transfer_params): the engine's caller sets them, each planner reads its own.
class KvRequestOptions {
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

 private:
  template <class T>
  static const void* Key() {
    static const char key = 0;
    return &key;
  }
  std::vector<std::pair<const void*, std::shared_ptr<const void>>> items_;
};

// What the connector sees of a request.
struct KvRequest {
  uint64_t id = 0;
  std::string tenant;
  std::string session_id;
  int n_prompt = 0;          // prompt tokens
  int max_new_tokens = 0;    // tokens it may sample
  int n_choices = 1;         // sequences forked from the prompt
  bool samples = true;       // false: prefill only, it never decodes
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
  bool ready = true;   // out: false = not now (a planner's own capacity is taken)
};

// What Start finds in a sequence's slots.
struct KvReused {
  // Slots [0, n_as_is) hold KV at the tokens and positions it was computed at (a stored
  // prefix or a resident sequence reused as it is), with `attachment` its attachments
  // (NotFound for a kind it lacks; another error for bad bytes).
  int n_as_is = 0;
  std::function<StatusOr<std::string_view>(std::string_view kind)> attachment;
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
  // prompt is in.
  virtual LayerHooks* hooks(bool decoding) { return nullptr; }
  // The compute-buffer blocks the sequence holds when the planner keeps some of them
  // elsewhere or holds more (a block cache); -1 = its block table's.
  virtual int blocks_held(const SequenceKv& kv) const { return -1; }
};

// One sequence as the connector keeps it.
struct KvSeq {
  KvRequest request;
  KvLimits limits;  // Check's; at admission max_slots becomes the sequence's own
  std::vector<std::unique_ptr<KvSeqState>> states;  // by planner (ComposedConnector's order)

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
  // Admission of `seq` (Check passed): what it needs now. Changes nothing.
  virtual void Match(const KvSeq& seq, KvAdmission* admission) {}
  // `seq` is admitted and its slots exist in `kv` (`reused` says what they hold): makes
  // its states (replacing any: a sequence restarted after a failed load starts anew) and
  // reserves what Match asked for. An error: not admitted now (nothing is kept).
  virtual Status Start(KvSeq& seq, SequenceKv* kv, const KvReused& reused) { return OkStatus(); }
  // Before layer `layer` of a step runs over `seq`: waits until its KV of the layer is
  // in; returns the seconds waited.
  virtual double WaitLayer(KvSeq& seq, int layer) { return 0; }
  // `seq` ended (finished, failed or cancelled) with `kv` its slots (may be null): its
  // states are released and `keep` says what to keep.
  virtual void Finish(KvSeq& seq, const SequenceKv* kv, KvKeep* keep) {}
};

// A planner: a connector's part for one paper. Its state for a sequence is
// seq.states[index] (state()).
class KvPlanner : public KvConnector {
 protected:
  std::unique_ptr<KvSeqState>& state(KvSeq& seq) const;
  const KvSeqState* state(const KvSeq& seq) const;

 private:
  friend class ComposedConnector;
  int index_ = 0;
};

// The planners in the order they were added (that is also the order of each sequence's
// hooks). Check stops at the first error; Match reserves the most blocks any planner
// asks for, frees the sum of free_first, is ready when all are; Start stops at the
// first error; WaitLayer sums; Finish keeps a sequence resident only when every planner
// lets it, and gathers the attachments.
class ComposedConnector final : public KvConnector {
 public:
  void Add(std::unique_ptr<KvPlanner> planner);
  int size() const { return static_cast<int>(planners_.size()); }

  Status Check(KvRequest& request, KvLimits* limits) override;
  void Match(const KvSeq& seq, KvAdmission* admission) override;
  Status Start(KvSeq& seq, SequenceKv* kv, const KvReused& reused) override;
  double WaitLayer(KvSeq& seq, int layer) override;
  void Finish(KvSeq& seq, const SequenceKv* kv, KvKeep* keep) override;

 private:
  std::vector<std::unique_ptr<KvPlanner>> planners_;
};

}  // namespace attic::kv
