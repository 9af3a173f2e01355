// Linking separately prefilled chunks (paper 002, Epic) as methods on `attic eval`'s
// methods axis: Naive, AttnLink-k and CacheBlend-r (pic/link.h), each with chunks
// prefilled from position 0 on their own or after a BOS token.
//
// What a linked method does with a sequence whose context is cut into chunks
// (Method::set_chunks; by default fixed runs of kDefaultChunkTokens after the BOS):
//   1. every chunk is prefilled on its own from position 0 -- after a BOS token with
//      the "+bos" variant, whose row is then dropped -- and its pre-RoPE K and V of every
//      layer are kept (what a context cache stores; kv::KvObserverHooks), and read back
//      as an entry of the cache's store type gives them (set_chunk_store_dtype; the
//      chunk's own rows, the BOS row dropped first);
//   2. one sequence gets every context slot at its position in the prompt, and each
//      chunk's K/V enters it at the chunk's slots (Transformer::EnterKv rotates K to the
//      new positions);
//   3. the slots LinkComputeSlots names (uncached tokens, the prompt's last slot, and
//      per method: k boundary tokens per chunk, or every slot with CacheBlend's
//      selection after the check layer) are recomputed in place over that KV
//      (BatchEntry::slots), in steps of the engine's max_batch_tokens (CacheBlend selects
//      within each step, as the scheduler does);
//   4. Score then decodes the scored tokens under teacher forcing, Greedy decodes
//      greedily, both over the linked KV.
// Steps 2-3 are what a server does when a request names cached chunks; their time is
// last_link_seconds() (step 1 is the caching, done ahead of requests).
//
// Names: "naive", "attnlink-K", "cacheblend-R[@LAYER]" (ParseLinkOptions), each with an
// optional "+bos" suffix. "full" is not a linked method here: Fully-Recompute is the
// reference, FullAttention.
//
// Thread-safety: as Method.
#pragma once

#include <string>
#include <vector>

#include "attic/eval/method.h"
#include "attic/pic/link.h"

namespace attic::eval {

// Chunk length of the default cut, used when no chunks were set (`attic eval perplexity`
// and `needle` with a linked method).
inline constexpr int kDefaultChunkTokens = 64;

// The BOS variant's suffix on a method name.
inline constexpr const char* kBosSuffix = "+bos";

class LinkedMethod : public Method {
 public:
  // chunk_bos: prefill each chunk after a BOS token (the engine's tokenizer must have one).
  LinkedMethod(engine::Engine& engine, std::string name, pic::LinkOptions options, bool chunk_bos);

  std::string name() const override { return name_; }
  Status Score(const std::vector<int32_t>& tokens, int first_scored, std::vector<float>* logits) override;
  StatusOr<std::vector<int32_t>> Greedy(const std::vector<int32_t>& prompt, int max_new) override;
  void set_chunks(std::vector<ContextChunk> chunks) override { chunks_ = std::move(chunks); }
  void set_chunk_store_dtype(store::KvDtype dtype) override { chunk_dtype_ = dtype; }

  const pic::LinkOptions& options() const { return options_; }
  bool chunk_bos() const { return chunk_bos_; }
  // Of the last Score / Greedy call: seconds from entering the chunks' KV to the first
  // scored (or generated) token's logits, and how many cached chunk tokens were
  // recomputed (CacheBlend: carried past the check layer) out of how many were linked.
  double last_link_seconds() const { return link_seconds_; }
  int last_recomputed() const { return recomputed_; }
  int last_linked() const { return linked_; }

 private:
  // Links tokens[0, n_prompt) into `seq` (steps 1-3 above) and sets `last` to the
  // logits of slot n_prompt - 1.
  Status Link(const std::vector<int32_t>& tokens, int n_prompt, kv::SequenceKv* seq, std::vector<float>* last);
  // The chunks of a context of n_prompt tokens: set_chunks' when set (checked), else
  // the default cut.
  StatusOr<std::vector<ContextChunk>> ChunksFor(const std::vector<int32_t>& tokens, int n_prompt) const;

  engine::Engine& engine_;
  std::string name_;
  pic::LinkOptions options_;
  bool chunk_bos_;
  std::vector<ContextChunk> chunks_;
  store::KvDtype chunk_dtype_ = store::KvDtype::kF32;
  double link_seconds_ = 0;
  int recomputed_ = 0;
  int linked_ = 0;
};

// A linked method named `name` ("attnlink-16", "cacheblend-0.15+bos", ...): NotFound
// when `name` is not a linked method's name at all (so MakeMethod can try others),
// InvalidArgument when it is one with bad parameters or "+bos" on a model without BOS.
StatusOr<std::unique_ptr<Method>> MakeLinkedMethod(const std::string& name, engine::Engine& engine);

// Whether `name` spells a linked method (parameters checked, not the model).
bool IsLinkedMethodName(const std::string& name);

}  // namespace attic::eval
