// KV linking (paper 002, Epic): a prompt whose chunks come with KV cached on their own
// (each prefilled from position 0) is joined position-independently: the chunks' stored
// pre-RoPE K and V enter the compute buffer at the positions they take in this prompt,
// and the forward recomputes a set of slots in place over them. The methods differ in
// that set (section 4 of the paper):
//   naive       the prompt's uncached tokens only
//   full        every token (Fully-Recompute: nothing cached is used)
//   attnlink-k  the uncached tokens plus k tokens at every chunk boundary: the last k/2
//               of a chunk and the first k/2 of the next (the first chunk's start too)
//   cacheblend  every token through layers [0, check_layer]; at the check layer the
//               `ratio` of the chunks' tokens whose fresh K/V deviate most from the
//               cached ones go on through the later layers, the others keep their cached
//               KV there (CacheBlend's selective recompute)
// A recomputed row attends to every slot before it at its new position; its fresh KV
// replaces the cached KV (Transformer's target slots). The scheduler runs a linked prompt
// like any other (continuous batching) as the KV connector's planners plan it
// (link_planner.h); this file holds what is specific to linking.
//
// Thread-safety: value types and pure functions; a CacheBlendHooks object is used by one
// step at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attic/core/status.h"
#include "attic/kv/block_pool.h"
#include "attic/kv/layer_hooks.h"

namespace attic::pic {

enum class LinkMethod { kNaive, kFull, kAttnLink, kCacheBlend };
const char* LinkMethodName(LinkMethod m);  // "naive", "full", "attnlink", "cacheblend"
StatusOr<LinkMethod> ParseLinkMethod(std::string_view name);

struct LinkOptions {
  LinkMethod method = LinkMethod::kAttnLink;
  int k = 16;              // attnlink: tokens recomputed at each chunk boundary
  double ratio = 0.15;     // cacheblend: share of the chunks' tokens recomputed
  int check_layer = 1;     // cacheblend: the layer where tokens are selected
  // InvalidArgument for k < 0, ratio outside [0, 1], check_layer outside [0, n_layers).
  Status Validate(int n_layers) const;
  // "attnlink-16", "cacheblend-0.15@1", "naive", "full".
  std::string ToString() const;
};
// "naive" | "full" | "attnlink[-K]" | "cacheblend[-RATIO[@LAYER]]" (the server's --link).
StatusOr<LinkOptions> ParseLinkOptions(std::string_view text);

// A chunk of the prompt whose KV is stored: slots [slot, slot + n) take rows
// [src_row, src_row + n) of the stored entry `store_key` (src_row 1 when the chunk was
// prefilled after a BOS token the prompt does not repeat there).
struct LinkedChunk {
  int slot = 0;
  int n = 0;
  std::string store_key;
  int src_row = 0;
};

struct LinkSpec {
  std::vector<LinkedChunk> chunks;  // ascending, disjoint
  LinkOptions options;
  // InvalidArgument unless the chunks are non-empty, ascending, disjoint and inside a
  // prompt of n_prompt tokens, and the options are valid.
  Status Validate(int n_prompt, int n_layers) const;
};

// The slots in [from, n_prompt) that a link computes (ascending): every slot no chunk
// in `present` covers, the boundary slots attnlink adds, every slot for cacheblend and
// full, and always the prompt's last slot (its logits are the first token's). `present`:
// the chunks whose KV is entered (ascending, within [from, n_prompt)).
std::vector<int32_t> LinkComputeSlots(const LinkOptions& options, const std::vector<LinkedChunk>& present, int from,
                                      int n_prompt);

// CacheBlend's selection as layer hooks for one sequence being linked: at the check
// layer each chunk row's fresh K and V are compared with the cached ones still in the
// compute buffer (squared L2 distance over K and V), and after that layer only the
// `ratio` of the step's chunk rows that deviate most go on (rows of uncached tokens, and
// the prompt's last slot, always do). Entries other than `entry` are not touched.
class CacheBlendHooks : public kv::LayerHooks {
 public:
  // is_chunk_slot[s]: slot s holds cached chunk KV. last_slot: always kept.
  CacheBlendHooks(const kv::SequenceKv* seq, std::vector<uint8_t> is_chunk_slot, int last_slot, double ratio,
                  int check_layer);
  void set_entry(int entry) { entry_ = entry; }
  void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kv) override;
  void AfterLayer(int layer, const kv::EntryRows& rows, uint8_t* keep) override;
  // Chunk rows carried past the check layer so far (the cached tokens recomputed).
  int selected() const { return selected_; }

 private:
  const kv::SequenceKv* seq_;
  std::vector<uint8_t> is_chunk_;
  int last_slot_;
  double ratio_;
  int check_layer_;
  int entry_ = -1;
  int selected_ = 0;
  std::vector<uint8_t> keep_;  // this step's selection, by row
  std::vector<float> k_old_, v_old_;
};

// One prompt being linked, from the chunks whose KV entered its sequence to what the link
// recomputed: the slots the forward computes in place (LinkComputeSlots), CacheBlend's
// selection as the hooks of those steps (cacheblend; null for the other methods), and the
// cached tokens recomputed. The scheduler runs one per linked request and `attic eval`
// one per linked method's prompt; both drive the forward over compute_slots() in slot
// order with hooks().
class LinkRun {
 public:
  // `present`: the chunks whose KV is entered in `seq` (ascending, within [from,
  // n_prompt)); slots below `from` are a stored prefix. `seq` must outlive the run.
  LinkRun(const LinkOptions& options, const std::vector<LinkedChunk>& present, int from, int n_prompt,
          const kv::SequenceKv* seq);

  const std::vector<int32_t>& compute_slots() const { return slots_; }
  // The hooks of the steps that compute compute_slots(), or null; `entry` is the
  // sequence's index in such a step's batch.
  kv::LayerHooks* hooks() { return blend_.get(); }
  void set_entry(int entry) {
    if (blend_) blend_->set_entry(entry);
  }
  // Cached tokens recomputed to link them (CacheBlend: selected so far).
  int recomputed() const { return blend_ ? blend_->selected() : recomputed_; }

 private:
  std::vector<int32_t> slots_;
  std::unique_ptr<CacheBlendHooks> blend_;
  int recomputed_ = 0;
};

}  // namespace attic::pic
