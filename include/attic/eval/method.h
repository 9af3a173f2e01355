// Methods of running a model over a token sequence, the axis `attic eval` compares: "full"
// (ordinary causal attention, the reference every other method is measured against)
// and, added by later work, approximations of it -- linking separately prefilled chunks
// (Epic's KVLink), sparse decoding (PQCache top-k, StreamingLLM, H2O), ...
//
// A method sees only token sequences and answers with logits or greedy tokens; how it
// gets them (one causal prefill, chunks prefilled apart and then joined, token-by-token
// decode steps over a restricted set of KV slots) is its own business. That is the seam:
// a new approximation is a new Method subclass plus one line in MakeMethod.
//
// Thread-safety: a Method drives its Engine; use it from one thread at a time, and not
// while anything else runs forward steps on the same Engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "attic/engine/engine.h"
#include "attic/store/entry.h"

namespace attic::eval {

// A run of context tokens [begin, begin + n) that a caching method prefills on its own
// and links into the sequence (Epic's chunks; `attic eval link` cuts them).
struct ContextChunk {
  int begin = 0;
  int n = 0;
};

class Method {
 public:
  virtual ~Method() = default;

  // The name on the methods axis, as `--methods` spells it.
  virtual std::string name() const = 0;

  // Runs `tokens` (BOS first when the model has one) through the model and sets `logits`
  // to the next-token logits that predict tokens[first_scored .. n-1]:
  //   logits: [n - first_scored, vocab_size] row-major; row r is the model's output at
  //   position first_scored - 1 + r and predicts tokens[first_scored + r].
  // Tokens [0, first_scored) are context only: an approximation may treat them as a
  // prompt (prefilled whole, or in separately cached chunks) and the rest as the
  // continuation it decodes under teacher forcing. The method's KV is released before
  // it returns.
  // REQUIRES: 1 <= first_scored < tokens.size(). OutOfRange when the sequence does not
  // fit the engine's context window or KV pool.
  virtual Status Score(const std::vector<int32_t>& tokens, int first_scored, std::vector<float>* logits) = 0;

  // Greedy continuation of `prompt`: at most max_new tokens, ending before the first of
  // the engine's stop tokens (not included). The method's KV is released before it
  // returns. OutOfRange when prompt + max_new does not fit.
  virtual StatusOr<std::vector<int32_t>> Greedy(const std::vector<int32_t>& prompt, int max_new) = 0;

  // How the context of the next Score / Greedy calls is cut into separately cached
  // chunks (ascending, disjoint; tokens no chunk covers are new tokens, computed). Only
  // methods that link cached chunks use it; the others, "full" included, ignore it. An
  // empty list restores the method's own default cut. Chunks must lie inside the context
  // (Score: [0, first_scored); Greedy: the prompt), else those calls fail InvalidArgument.
  virtual void set_chunks(std::vector<ContextChunk> chunks) {}

  // The store type the context cache keeps those chunks in (`--kv-store-dtype`): a method
  // that links cached chunks reads each chunk's K and V as an entry of that type gives
  // them back (store::RoundTripRows), the rest ignore it. Default f32: the chunks' KV as
  // the forward pass computed it.
  virtual void set_chunk_store_dtype(store::KvDtype dtype) {}
};

// "full": the engine's ordinary forward pass, causal attention over every earlier token,
// prefilled in chunks of the engine's max_batch_tokens. The reference of every metric.
class FullAttention : public Method {
 public:
  explicit FullAttention(engine::Engine& engine) : engine_(engine) {}
  std::string name() const override { return "full"; }
  Status Score(const std::vector<int32_t>& tokens, int first_scored, std::vector<float>* logits) override;
  StatusOr<std::vector<int32_t>> Greedy(const std::vector<int32_t>& prompt, int max_new) override;

 private:
  engine::Engine& engine_;
};

// OutOfRange when a sequence of n_tokens does not fit the engine's context window.
Status CheckFits(const engine::Engine& engine, size_t n_tokens);
// What every Score checks first: InvalidArgument unless 1 <= first_scored < n_tokens,
// then CheckFits.
Status CheckScore(const engine::Engine& engine, size_t n_tokens, int first_scored);

// The name of the reference method, always first on the methods axis.
inline constexpr const char* kReferenceMethod = "full";

// The names MakeMethod accepts, in the order `--help` lists them; parametric families
// are listed by their pattern ("attnlink-K", see link_method.h).
std::vector<std::string> MethodNames();

// The method called `name` on `engine` (InvalidArgument naming the known ones otherwise).
StatusOr<std::unique_ptr<Method>> MakeMethod(const std::string& name, engine::Engine& engine);

// `names` as the methods axis: "full" first (added when missing), duplicates dropped,
// every name checked against MethodNames() (InvalidArgument naming the known ones).
StatusOr<std::vector<std::string>> MethodsAxis(const std::vector<std::string>& names);

}  // namespace attic::eval
