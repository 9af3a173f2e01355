// Turn: one sequence's turn as the KV store keeps it -- the store side of the engine <->
// store seam (vLLM's KV connector, per request): what of the sequence the store held
// (its sources), loading those rows into the compute buffer layer by layer, the turn's
// new pre-RoPE K/V recorded as the forward computes them, and the save when the turn
// ends. How rows are shared (a history kept in place, a save still in the write buffer
// read through, rebasing on a save once placed) is the store's business: the engine
// sees slots, sources and layers.
//
// Memory: the rows a turn holds of its own (not shared with a stored entry) count
// toward the store's turn budget (StoreOptions::turn_bytes); a turn that would exceed it
// stops recording (invalid: it is not saved) rather than grow past it.
//
// Thread-safety: a Turn is used by one thread (the step loop); the loader writes its
// copied rows (LoadJob::copy_k) while a load runs, which WaitLoad() ends.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attic/store/entry.h"
#include "attic/store/kv_loader.h"
#include "attic/store/kv_source.h"

namespace attic::store {

class KvStore;

// A sequence's pre-RoPE K and V by slot: slots [0, base.n_rows) shared in place from
// where they came from (a stored entry's bytes, or a save not serialized yet), the
// slots after them held here, per layer [rows, kv_dim], in the store's dtype (that of
// the store's type, StoreOptions::kv_dtype): k, v for f32, k16, v16 (IEEE half bits) for
// f16, kq, vq (rows of the K / V type's bytes: entry.h) for a quantized type (kivi4: K in
// k, f32, until its save quantizes each group whole; V in vq); the other pairs hold empty
// layers.
struct TurnRows {
  KvRowsBase base;
  std::vector<std::vector<float>> k, v;
  std::vector<std::vector<uint16_t>> k16, v16;
  std::vector<std::vector<uint8_t>> kq, vq;
  // Rows held: base rows and own rows (kv_dim elements, or k_row_size bytes for kq).
  int n(int kv_dim, size_t k_row_size) const {
    const size_t own = (k.empty() ? 0 : k[0].size()) / kv_dim + (k16.empty() ? 0 : k16[0].size()) / kv_dim +
                       (kq.empty() ? 0 : kq[0].size()) / k_row_size;
    return base.n_rows + static_cast<int>(own);
  }
  uint64_t own_bytes() const;
  // Applies f(rows, is_v) to k, v, k16, v16, kq and vq (each a per-layer vector of row
  // vectors; is_v: V's rows).
  template <class F>
  void ForEachRows(F f) {
    f(k, false);
    f(v, true);
    f(k16, false);
    f(v16, true);
    f(kq, false);
    f(vq, true);
  }
  void ResizeLayers(int n_layers) {
    ForEachRows([&](auto& rows, bool) { rows.resize(n_layers); });
  }
};

class Turn {
 public:
  ~Turn();
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;

  const std::string& tenant() const { return tenant_; }
  const std::string& session_id() const { return session_id_; }
  // Whether the turn still knows every slot's KV (else it will not be saved).
  bool valid() const { return valid_; }
  int n_slots() const { return rows_.n(kv_dim_, k_row_size_); }

  // --- Loading (at admission) ---
  // Enters `segments` into the slots of the sequence with block table `blocks` and
  // per-slot `positions` (every slot the sequence starts with), as `mode` says, and
  // takes the rows for the turn: a first segment that is a prefix of its source (source
  // rows [0, n) into slots [0, n)) is shared in place; the other slots are the turn's
  // own: rows the segments enter are copied as they are entered, slots between segments
  // (computed in place later: linking) are written by the forward (Write). Room is
  // reserved for `max_slots` slots (Reserve). REQUIRES: the turn holds no slot yet;
  // segments ascending and disjoint by slot.
  void Load(std::vector<LoadSegment> segments, std::vector<int32_t> blocks, std::vector<int32_t> positions,
            int max_slots, Preload mode, backend::ThreadPool& threads);
  // The load still running (null when none, or done and collected).
  LoadJob* loading() const { return load_ ? load_.get() : nullptr; }
  // Blocks until layer l of the load is entered (no-op without a load); seconds waited.
  double WaitLayer(int l) { return load_ ? load_->WaitLayer(l) : 0; }
  // Waits until the whole load is entered; returns the seconds waited.
  double WaitLoad();
  // The load failed (a streamed source's read broke off, KvLoader): the sequence's slots
  // do not hold the stored KV. The turn is then invalid (never saved); the caller
  // recomputes the sequence.
  bool load_failed() const { return !load_failure_.ok() || (load_ && load_->failed()); }
  // Why (OK when it did not fail).
  Status load_failure() const { return load_ && load_->failed() ? load_->failure() : load_failure_; }
  // Drops the finished load's bookkeeping; returns (enter seconds, rows, stored bytes
  // entered) for the rates.
  bool CollectLoad(double* enter_seconds, int* rows, uint64_t* bytes = nullptr);

  // --- Recording (every forward step) ---
  // Sizes the per-layer rows for up to `max_slots` slots (appending each step's KV then
  // never reallocates; pages are touched only when written).
  void Reserve(int max_slots);
  // Layer `layer`'s pre-RoPE K and V of the n slots appended after n_slots() ([n,
  // kv_dim] f32 each; kept in the store's dtype: an f16 store rounds them to f16, which
  // is exact for what an f16 compute buffer's forward hands over; a q8_0 store quantizes
  // each row in one pass, as the q8_0 compute buffer does). Every layer of a step
  // must be recorded.
  void Append(int layer, const float* k, const float* v, int n);
  // Layer `layer`'s pre-RoPE K and V of n slots recomputed in place (each < n_slots(),
  // [n, kv_dim] f32 each, row i for slots[i]): they replace what the turn held there.
  // A slot the turn shares (its base) cannot be replaced: the turn is invalidated.
  void Write(int layer, const int32_t* slots, const float* k, const float* v, int n);
  // Keeps slots [0, n) (the sequence was cut back to them).
  void Truncate(int n);
  // A turn of another request of the same tenant: a copy sharing what this turn shares
  // and copying its own rows, cut to n slots (a new sequence reusing this one's prefix
  // by copy).
  std::unique_ptr<Turn> Branch(int n, std::string session_id, int64_t ttl_ms) const;
  // This turn goes on as the turn of another request of the same tenant (a new request
  // adopting the finished sequence): its session and TTL, and it replaces no entry.
  void Renew(std::string session_id, int64_t ttl_ms);
  // The turn no longer knows its slots' KV (a sequence whose slots came from somewhere
  // it did not see): it records nothing more and is not saved.
  void Invalidate();

  // --- Saving (when the turn ends) ---
  // Saves the sequence (tokens, positions: one per slot) as the session's entry,
  // asynchronously, replacing the entry the turn was loaded from when it extends it.
  // keep_rows: the sequence stays resident and the turn goes on recording (its rows are
  // then based on the saved entry, shared with the writer); else the rows move into the
  // save and the turn records nothing more. `attachments` are saved with the entry
  // (entry.h): they must describe the saved slots (e.g. the sequence's PQ index,
  // pq/pq_index.h).
  void Commit(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions, bool keep_rows,
              std::vector<EntryAttachment> attachments = {});

 private:
  friend class KvStore;
  Turn(KvStore& store, std::string tenant, std::string session_id, int64_t ttl_ms);
  // Makes rows [0, n) of `e` (a queued save) the base; a chain of unserialized saves
  // deeper than kMaxUnserializedDepth is cut by copying e's own rows instead.
  static constexpr int kMaxUnserializedDepth = 8;
  void BaseOn(std::shared_ptr<const KvEntry> e, int n);
  // Once the writer has placed `saved_`, its rows are read from the tier's bytes: the
  // base becomes those bytes and the own rows they cover are dropped.
  void RebaseOnPlacedSave(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions);
  void AccountOwnBytes();  // updates the store's turn-bytes counter to rows_.own_bytes()
  // When the (finished) load failed: keeps why, and the turn is invalid. REQUIRES: load_.
  bool NoteLoadFailure();

  KvStore& store_;
  std::string tenant_, session_id_;
  int64_t ttl_ms_ = -1;
  int n_layers_ = 0, kv_dim_ = 0;
  KvDtype dtype_ = KvDtype::kF32;  // of the rows and the saves: the store's
  int group_ = 0;                  // values per scale of a quantized dtype_ (the buffer's q8_0 grouping)
  size_t k_row_size_ = 0, v_row_size_ = 0;  // bytes of a K / V row the turn holds (KvRowBytes of each's type; kivi4's K: f32)
  // Units (vector elements) of one row in `rows` (V's when v): kv_dim_ values, or a
  // quantized row's bytes.
  template <class Rows>
  size_t RowUnits(const Rows&, bool v) const {
    using Elem = typename Rows::value_type::value_type;
    return sizeof(Elem) == 1 ? (v ? v_row_size_ : k_row_size_) : static_cast<size_t>(kv_dim_);
  }
  TurnRows rows_;
  bool valid_ = true;
  uint64_t accounted_ = 0;                // own bytes counted toward the store's turn budget
  std::string supersedes_;                // the stored entry this turn extends ("" = none)
  std::shared_ptr<const KvEntry> saved_;  // the last save while the rows stayed kept
  std::shared_ptr<LoadJob> load_;
  Status load_failure_;  // a failed load's error, kept once the load is collected
};

}  // namespace attic::store
