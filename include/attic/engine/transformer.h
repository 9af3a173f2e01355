// Transformer: the Llama-family forward pass over paged KV, exposed per layer so the KV
// store can load layer l+1 while layer l computes and save each layer's new KV as soon
// as it exists (paper 001 section 3.2; DESIGN.md decision 2).
//
// A forward step takes a batch of sequences, each with some new tokens (prefill chunk or
// one decode token). By default new tokens are appended to each sequence's SequenceKv;
// an entry may instead name the slot each token writes, so "recompute slots S at
// positions P over the cached KV" (KV linking) is one step. K is rotated (RoPE) at the
// given positions before it enters the compute buffer. kv::LayerHooks (layer_hooks.h) see
// each layer's new KV (the store saves the pre-RoPE K and V through one), may narrow what
// rows attend to, and may drop rows from the rest of the pass.
//
// Thread-safety: one Transformer per step loop; it owns scratch buffers.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "attic/attention/attention.h"
#include "attic/attention/rope.h"
#include "attic/backend/kernels.h"
#include "attic/backend/thread_pool.h"
#include "attic/core/status.h"
#include "attic/kv/block_pool.h"
#include "attic/kv/layer_hooks.h"
#include "attic/model/model.h"
#include "attic/tensor/buffer.h"

namespace attic::engine {

struct BatchEntry {
  kv::SequenceKv* seq = nullptr;
  std::vector<int32_t> tokens;     // new tokens
  // Positions of the new tokens; empty = continue from the last slot's position + 1
  // (or 0 for an empty sequence). Required with `slots`.
  std::vector<int32_t> positions;
  // The slot each new token writes; empty = append after the sequence's last slot (the
  // common case and the fast path). A slot < seq->n_slots() is recomputed in place (its
  // token and position are replaced); slots from n_slots() on are appended and must be
  // exactly n_slots(), n_slots() + 1, ... (in any row order). No slot twice. A row
  // writing slot s attends to slots [0, s] by slot order, including this step's other
  // rows below s (kv::LayerHooks::BeforeAttention may change that). With slots, the
  // sequence must not appear in another entry of the step.
  std::vector<int32_t> slots;
  bool want_logits = true;         // produce logits for the last new token
  bool all_logits = false;         // ... for every new token instead (evaluation: perplexity, KL)
};

// The attention's shape for a model: its heads, KV heads, head_dim, and the scale
// 1/sqrt(head_dim).
attention::AttentionShape AttentionShapeOf(const model::ModelConfig& config);

// InvalidArgument unless every token id is in the model's vocabulary [0, vocab_size):
// what a forward step and a submitted request are checked with.
Status CheckTokenIds(const model::ModelConfig& config, std::span<const int32_t> tokens);

// The linear matrices `model`'s forward multiplies by, as the backend's prepacking and
// kernel calibration walk them; packed copies are owned by the model (Model::Own).
backend::ModelLinears LinearsOf(model::Model& model);

// Where a forward step's time goes, summed over the steps timed (Transformer::
// set_step_phases): each layer's phases in order, then the logits. Begin (embedding) and
// the hooks' AfterLayer are in no phase. `attic bench` reports them per decode token next
// to the bytes each phase reads.
struct StepPhases {
  enum Phase {
    kNormQkv,     // attention norm, the q/k/v projections
    kRopeKv,      // RoPE, the new rows into the KV cache, the hooks' OnKv and BeforeAttention
    kAttention,   // attention over the cache
    kOut,         // the output projection and the residual add
    kFfnGateUp,   // FFN norm, the gate and up projections, SiLU(gate) * up
    kFfnDown,     // the down projection and the residual add
    kLogits,      // final norm and lm_head
    kCount
  };
  static const char* Name(int phase);
  double seconds[kCount] = {};
  int64_t steps = 0;  // steps timed (Finish calls)
};

class Transformer {
 public:
  // max_batch_tokens bounds the tokens of one step (scratch memory is sized for it).
  // row_invariant: every row's result is the same bits whatever else shares its step
  // (GEMV for every Linear, AttendMode::kRowInvariant): a sequence's output then does not
  // depend on batching, chunking or reuse, at some cost in prefill and decode speed.
  Transformer(const model::Model& model, backend::ThreadPool& pool, int max_batch_tokens, bool row_invariant = false);

  const model::ModelConfig& config() const { return config_; }
  int max_batch_tokens() const { return max_tokens_; }
  kv::KvShape kv_shape(int block_size) const;

  // Whole step: Begin, every Layer (with `hooks`, may be null), Finish.
  Status Forward(std::vector<BatchEntry>& batch, std::vector<float>* logits, kv::LayerHooks* hooks = nullptr);

  // Layer-wise step. Begin validates (InvalidArgument for bad tokens, positions or
  // slots), reserves KV slots (all-or-nothing: on error no sequence changed), records
  // the tokens and positions of in-place slots and embeds; Layer(l) must then be called
  // for l = 0..n_layers-1 in order; Finish computes logits. `batch` must outlive Finish.
  Status Begin(std::vector<BatchEntry>& batch);
  void Layer(int layer, kv::LayerHooks* hooks = nullptr);
  // `logits` receives rows of vocab_size floats in batch order: per entry with
  // all_logits, one per kept row (kept_rows); with want_logits, one for its last kept row;
  // none for an entry whose rows were all dropped. Without dropped rows: the last new
  // token's, or every new token's.
  void Finish(std::vector<float>* logits);
  // After Finish (until the next Begin): the rows of entry `entry` that went through
  // every layer (indices into its tokens, ascending); all rows unless a hook dropped some.
  std::span<const int32_t> kept_rows(int entry) const;

  // Enters saved pre-RoPE KV for slots [first, first+n) of `seq` at `layer`: rotates K to
  // the slots' recorded positions and writes it into the compute buffer. The slots must
  // already exist (SequenceKv::Append). k_pre_rope, v: [n, kv_dim].
  void EnterKv(kv::SequenceKv* seq, int layer, int first, int n, const float* k_pre_rope, const float* v);

  const attention::RopeTable& rope() const { return rope_; }

  // While set (not null), every step adds its phases' wall time to `phases` (a few clock
  // reads per layer). The caller keeps it alive until it is unset.
  void set_step_phases(StepPhases* phases) { phases_ = phases; }

 private:
  const model::Model& model_;
  const model::ModelConfig& config_;
  backend::ThreadPool& pool_;
  attention::RopeTable rope_;
  int max_tokens_;
  backend::LinearMode linear_mode_;
  attention::AttendMode attend_mode_;

  // A run of rows writing consecutive slots: rows [row, row + n) -> slots [slot, slot + n).
  struct SlotRun {
    int row, slot, n;
  };
  kv::EntryRows Rows(int entry) const;
  void BuildRuns();
  // Calls hooks->AfterLayer for every entry and compacts the step's rows to the kept ones.
  void DropRows(int layer, kv::LayerHooks* hooks);

  // Current step. Row r is the step's r-th token row still in the pass; an entry's rows
  // are [entry_offset_[i], entry_offset_[i] + entry_rows_[i]).
  std::vector<BatchEntry>* batch_ = nullptr;
  std::vector<int> entry_offset_;
  std::vector<int> entry_rows_;
  std::vector<int32_t> positions_;  // [n_rows]
  std::vector<int32_t> row_slot_;   // [n_rows] the slot each row writes
  std::vector<int32_t> row_token_;  // [n_rows] index of the row's token in its entry
  std::vector<SlotRun> runs_;       // entry i's runs: [run_begin_[i], run_begin_[i + 1])
  std::vector<int> run_begin_;
  int n_rows_ = 0;
  StepPhases* phases_ = nullptr;

  // Scratch, sized for max_tokens_ rows.
  AlignedBuffer x_, xn_, q_, k_, v_, kr_, attn_, gate_, up_;
  std::vector<int32_t> kv_end_;
  std::vector<attention::AttendRequest> requests_;
  // With hooks: per-layer copies a hook may change, and AfterLayer's keep flags.
  std::vector<int32_t> hook_kv_end_;
  std::vector<uint8_t> keep_;
};

}  // namespace attic::engine
