// LayerHooks: the points of the forward pass where the KV store, KV linking (AttnLink,
// CacheBlend) and sparse decoding (PQCache) plug in, layer by layer:
//
//   for each layer l:  q/k/v projection, RoPE
//                      (1) OnKv            the layer's new K (pre- and post-RoPE) and V
//                      K/V enter the compute buffer; attention
//                      (2) BeforeAttention  (between the two lines above) narrow what rows see
//                      output projection, FFN
//                      (3) AfterLayer      drop rows from the rest of the pass
//
// Hooks are called per batch entry, in entry order, on the thread running the step; the
// pointers they receive are valid only during the call. A Transformer step without hooks
// (nullptr) does none of this work.
//
// Thread-safety: a LayerHooks object is used by one step at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "attic/attention/attention.h"

namespace attic::kv {

// The rows of one batch entry that are still in the pass at a layer (all of the entry's
// new tokens, unless a hook dropped some after an earlier layer). Row i is the entry's
// token rows[i]; every array has n_rows elements.
struct EntryRows {
  int entry = 0;                       // index in the step's batch
  int n_rows = 0;
  const int32_t* rows = nullptr;       // index into BatchEntry::tokens, ascending
  const int32_t* slots = nullptr;      // the slot each row writes
  const int32_t* positions = nullptr;  // the position its q and K are rotated to
};

// One entry's new K and V at one layer: [n_rows, kv_dim] each, row i of EntryRows.
struct LayerKv {
  const float* k_pre_rope = nullptr;  // what the store saves (DESIGN.md decision 1)
  const float* k = nullptr;           // rotated to the rows' positions: what attention reads
  const float* v = nullptr;
};

// What an entry's rows see in one layer's attention (attention::AttendRequest's terms).
// The forward pass presets kv_end[i] = slots[i] + 1 (a row sees every slot up to its own,
// by slot order) and no index lists; a hook may lower or raise kv_end (at most n_slots)
// and set either one index list for all heads or one list per KV head. Lists are owned
// by the hook and must stay valid until the Layer call returns.
struct Visibility {
  int32_t* kv_end = nullptr;  // [n_rows]: row i sees slots < kv_end[i]
  int n_slots = 0;            // the sequence's slots after this step's appends
  // What a hook may read to choose (sparse decoding scores slots against the query):
  // the rows' queries, rotated to their positions, [n_rows, n_heads, head_dim], and the
  // layer's KV of the sequence as attention reads it (K rotated; this step's rows
  // already written; kv->n_slots == n_slots).
  const float* q = nullptr;
  const attention::KvLayerView* kv = nullptr;
  const int32_t* indices = nullptr;  // ascending slots, for every head ...
  int n_indices = 0;
  const int32_t* const* head_indices = nullptr;  // ... or per KV head: [n_kv_heads] lists
  const int32_t* n_head_indices = nullptr;       // [n_kv_heads] their lengths
  // Where attention reads the KV instead of the compute buffer's view (`kv`): a hook
  // that keeps some of the sequence's KV elsewhere (a released block, kv::SequenceKv;
  // pq/offload.h) stages what the rows will see and points here. Slots are numbered as
  // the view says (kv_end and the index lists above are in its numbering; view->n_slots
  // bounds them); the view must hold the rows' own K/V where they see them. Owned by the
  // hook, valid until the Layer call returns; the hook also points `kv` at it, so that
  // later hooks read what attention will.
  const attention::KvLayerView* view = nullptr;
};

// Override what you need; every method defaults to doing nothing.
class LayerHooks {
 public:
  virtual ~LayerHooks() = default;

  // (1) Layer `layer`'s new K and V of an entry's rows, before they enter the compute
  // buffer: a slot recomputed in place still holds its previous KV of this layer there
  // (so a hook can measure how far the fresh KV deviates from the cached one).
  virtual void OnKv(int layer, const EntryRows& rows, const LayerKv& kv) {}

  // (2) Before layer `layer`'s attention (the rows' K/V are in the compute buffer): may
  // narrow (or widen) what the entry's rows see, reading the rows' queries and the
  // layer's KV (vis->q, vis->kv). Called anew at every layer, with the default preset.
  virtual void BeforeAttention(int layer, const EntryRows& rows, Visibility* vis) {}

  // (3) After layer `layer` (attention and FFN done): set keep[i] = 0 to drop row i
  // (keep is [n_rows], preset to 1) from the rest of the pass. A dropped row's K/V of the
  // later layers is not computed: its slot keeps whatever the compute buffer held there
  // (the cached KV when recomputing in place; zeros or stale rows for an appended slot),
  // and later rows that see the slot read that. Logits follow the kept rows (see
  // Transformer::Finish).
  virtual void AfterLayer(int layer, const EntryRows& rows, uint8_t* keep) {}
};

// For callers that only save (tests, tools): hands each entry's new pre-RoPE K and V,
// [n_rows, kv_dim] each, to a function.
using KvObserver = std::function<void(int layer, int entry, const float* k_pre_rope, const float* v, int n_rows)>;
class KvObserverHooks : public LayerHooks {
 public:
  explicit KvObserverHooks(KvObserver observer) : observer_(std::move(observer)) {}
  void OnKv(int layer, const EntryRows& rows, const LayerKv& kv) override {
    observer_(layer, rows.entry, kv.k_pre_rope, kv.v, rows.n_rows);
  }

 private:
  KvObserver observer_;
};

}  // namespace attic::kv
