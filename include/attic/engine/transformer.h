// Transformer: the Llama-family forward pass over paged KV, exposed per layer so the KV
// store can load layer l+1 while layer l computes and save each layer's new KV as soon
// as it exists (paper 001 section 3.2; DESIGN.md decision 2).
//
// A forward step takes a batch of sequences, each with some new tokens (prefill chunk or
// one decode token). New tokens are appended to each sequence's SequenceKv; their K is
// rotated (RoPE) at the given positions before it enters the compute buffer, and the
// pre-RoPE K (with V) is handed to an optional observer for saving.
//
// Thread-safety: one Transformer per step loop; it owns scratch buffers.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "attic/attention/attention.h"
#include "attic/attention/rope.h"
#include "attic/backend/kernels.h"
#include "attic/backend/thread_pool.h"
#include "attic/core/status.h"
#include "attic/kv/block_pool.h"
#include "attic/model/model.h"
#include "attic/tensor/buffer.h"

namespace attic::engine {

struct BatchEntry {
  kv::SequenceKv* seq = nullptr;
  std::vector<int32_t> tokens;     // new tokens
  // Positions of the new tokens; empty = continue from the last slot's position + 1
  // (or 0 for an empty sequence).
  std::vector<int32_t> positions;
  bool want_logits = true;         // produce logits for the last new token
  bool all_logits = false;         // ... for every new token instead (evaluation: perplexity, KL)
};

// Sees each layer's new K (before RoPE) and V for one batch entry: [n_tokens, kv_dim].
using KvObserver = std::function<void(int layer, int entry, const float* k_pre_rope, const float* v, int n_tokens)>;

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

  // Whole step: Begin, every Layer, Finish. `logits` receives rows of vocab_size floats
  // in batch order: one per entry with want_logits (its last token), or one per new
  // token for an entry with all_logits.
  Status Forward(std::vector<BatchEntry>& batch, std::vector<float>* logits, const KvObserver& observer = nullptr);

  // Layer-wise step. Begin validates, reserves KV slots (all-or-nothing: on error no
  // sequence changed) and embeds; Layer(l) must then be called for l = 0..n_layers-1 in
  // order; Finish computes logits.
  Status Begin(std::vector<BatchEntry>& batch);
  void Layer(int layer, const KvObserver& observer = nullptr);
  void Finish(std::vector<float>* logits);

  // Enters saved pre-RoPE KV for slots [first, first+n) of `seq` at `layer`: rotates K to
  // the slots' recorded positions and writes it into the compute buffer. The slots must
  // already exist (SequenceKv::Append). k_pre_rope, v: [n, kv_dim].
  void EnterKv(kv::SequenceKv* seq, int layer, int first, int n, const float* k_pre_rope, const float* v);

  const attention::RopeTable& rope() const { return rope_; }

 private:
  const model::Model& model_;
  const model::ModelConfig& config_;
  backend::ThreadPool& pool_;
  attention::RopeTable rope_;
  int max_tokens_;
  backend::LinearMode linear_mode_;
  attention::AttendMode attend_mode_;

  // Current step.
  std::vector<BatchEntry>* batch_ = nullptr;
  std::vector<int> entry_offset_;   // first row of each entry in the step's token rows
  std::vector<int> entry_first_slot_;
  std::vector<int32_t> positions_;  // [n_rows]
  int n_rows_ = 0;

  // Scratch, sized for max_tokens_ rows.
  AlignedBuffer x_, xn_, q_, k_, v_, kr_, attn_, gate_, up_;
  AlignedBuffer enter_k_;
  std::vector<int32_t> kv_end_;
  std::vector<attention::AttendRequest> requests_;
};

}  // namespace attic::engine
