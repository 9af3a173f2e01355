// Sparse decoding (paper 004: PQCache, and the baselines it is compared with) as methods
// on `attic eval`'s methods axis: "pq-R", "oracle-R", "streaming-R", "h2o-R" (R a ratio
// with a decimal point, or a slot count), each with "@key=value,..." options, exactly as
// pq::ParseSparseOptions reads them (include/attic/pq/sparse.h).
//
// What a sparse method does with a sequence:
//   1. the context (Score: tokens [0, first_scored); Greedy: the prompt) is prefilled with
//      full attention in chunks of the engine's max_batch_tokens, through the
//      SparseAttention hooks (h2o accumulates attention there; pq times it for adaptive
//      clustering);
//   2. the rest is decoded one token per forward step (Score: teacher forced; Greedy:
//      greedy), each step attending per KV head to initial + selected + local slots.
// One SparseAttention object serves one call (its state is the sequence's).
//
// min_slots: in eval a sequence decodes sparsely from kEvalMinSlots slots on unless the
// name sets "min=" (the serving default, 1024, is longer than stories260K's 512-token
// context, so every eval would otherwise be full attention).
//
// Thread-safety: as Method.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attic/eval/method.h"
#include "attic/pq/sparse.h"

namespace attic::eval {

inline constexpr int kEvalMinSlots = 64;

class SparseDecodingMethod : public Method {
 public:
  SparseDecodingMethod(engine::Engine& engine, std::string name, pq::SparseOptions options);

  std::string name() const override { return name_; }
  Status Score(const std::vector<int32_t>& tokens, int first_scored, std::vector<float>* logits) override;
  StatusOr<std::vector<int32_t>> Greedy(const std::vector<int32_t>& prompt, int max_new) override;

  const pq::SparseOptions& options() const { return options_; }
  // The hooks' stats of the last Score / Greedy call.
  const pq::SparseStats& last_stats() const { return stats_; }

 private:
  std::unique_ptr<pq::SparseAttention> NewHooks() const;
  // Prefills tokens[0, n) into `seq` through `hooks`; `last` gets the logits of token n-1.
  Status Prefill(const std::vector<int32_t>& tokens, size_t n, kv::SequenceKv* seq, pq::SparseAttention* hooks,
                 std::vector<float>* last);

  engine::Engine& engine_;
  std::string name_;
  pq::SparseOptions options_;
  pq::SparseStats stats_;
};

// Whether `name` spells a sparse method other than "full" (options checked, not the model).
bool IsSparseMethodName(const std::string& name);

// The sparse method called `name` on `engine`: NotFound when `name` is not a sparse
// method's name at all, InvalidArgument when its options do not fit the model.
StatusOr<std::unique_ptr<Method>> MakeSparseMethod(const std::string& name, engine::Engine& engine);

}  // namespace attic::eval
