// KvSource: stored pre-RoPE KV that a sequence's slots can be entered from -- a stored
// entry's serialized bytes (fetched and verified by KvStore::Fetch), an entry not
// serialized yet (a save still in the write buffer, immutable once queued), or a stored
// entry whose layers are still arriving from a tier that streams them (KvStore::
// OpenForTurn of a remote tier: the bytes are filled layer by layer, each verified
// before it is published). Shared: the loader reads it in place, and a turn that
// extends it saves its rows from there instead of copying them (TurnRows).
//
// A streamed source's layer l may be read once AwaitLayer(l) returned OK, its
// attachments once AwaitAttachments() did, its bytes as a whole once AwaitAll() did; a
// read that failed makes every later wait return the error (the rows it did not
// deliver are never valid). The other sources are complete: every wait is OK at once.
//
// Thread-safety: immutable after construction but for a streamed source's arrival
// state (internally synchronized); share freely.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "attic/store/bytes.h"
#include "attic/store/entry.h"

namespace attic::store {

// The arrival of a streamed source's bytes: the reader fills the buffer and publishes
// what it filled; the source's users wait for it. Layers arrive in order.
class KvStream {
 public:
  // Layers [0, n) are in the buffer, verified. REQUIRES: n above what was published.
  void PublishLayers(int n);
  // The attachments (the entry's tail) are in the buffer.
  void PublishAttachments();
  // The read failed: nothing more arrives; every wait not yet satisfied returns `why`.
  void Fail(Status why);
  // Blocks until layer l is in (OK), or the read failed before it (its error).
  Status AwaitLayer(int l) const;
  Status AwaitAttachments() const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  int layers_ = 0;
  bool attachments_ = false;
  Status error_;
};

class KvSource {
 public:
  // A stored entry: its bytes, its parsed header and its key in the store.
  static std::shared_ptr<const KvSource> Stored(SharedBytes bytes, EntryHeader header, std::string key);
  // A stored entry still arriving: `bytes` (header.total_bytes, the header's own bytes
  // in place) is filled as `stream` publishes.
  static std::shared_ptr<const KvSource> Streamed(SharedBytes bytes, EntryHeader header, std::string key,
                                                  std::shared_ptr<KvStream> stream);
  // A save still queued in the write buffer.
  static std::shared_ptr<const KvSource> Queued(std::shared_ptr<const KvEntry> entry);

  // Arrival (streamed sources; OK at once for the others): layer l is readable, the
  // attachments are, the whole entry is.
  Status AwaitLayer(int l) const { return stream_ ? stream_->AwaitLayer(l) : Status(); }
  Status AwaitAttachments() const { return stream_ ? stream_->AwaitAttachments() : Status(); }
  Status AwaitAll() const;
  bool streamed() const { return stream_ != nullptr; }

  // Everything but the rows: tokens, positions, n_layers, kv_dim, tenant, session.
  const KvEntry& meta() const { return queued_ ? *queued_ : header_.meta; }
  int n_rows() const { return meta().n_tokens(); }
  int n_layers() const { return meta().n_layers; }
  int kv_dim() const { return meta().kv_dim; }
  // The stored entry's key ("" for a queued save).
  const std::string& key() const { return key_; }
  bool queued() const { return queued_ != nullptr; }
  const std::shared_ptr<const KvEntry>& queued_entry() const { return queued_; }
  const SharedBytes& bytes() const { return bytes_; }
  const EntryHeader& header() const { return header_; }

  KvDtype dtype() const { return meta().dtype; }

  // The attachment `kind` (entry.h), valid while the source lives: a queued save's as
  // it was given, a stored entry's verified against its checksum on every call (the
  // tier's bytes, whichever tier). NotFound when there is none, DataLoss when its bytes
  // are bad (the KV itself may still be good). A streamed source waits for its
  // attachments first (its read's error when they never came).
  StatusOr<std::string_view> attachment(std::string_view kind) const;

  // One layer's rows (a streamed source's: after AwaitLayer(l)): KBytes(row) / VBytes(row)
  // are entry row `row` (of the entry's K / V type, KvTensorDtype); K / V for an f32
  // source, K16 / V16 (IEEE half bits) for an f16 one, KQ / VQ (a quantized row: values,
  // then scales) for a quantized one. A serialized layer's rows are contiguous; a queued
  // save's are looked up through its bases.
  struct Layer {
    const KvEntry* queued;
    int layer;
    // A serialized entry's layer (its K and V rows), or null (queued).
    const char* k;
    const char* v;
    size_t k_row_size, v_row_size;  // bytes of a K / V row
    // kivi4: a serialized layer's K groups (the header's ends) and rows; null otherwise.
    const std::vector<int32_t>* k_group_ends = nullptr;
    int n_rows = 0, kv_dim = 0;
    // K row `row` as f32: how a kivi4 source's K is read (its rows are codes of their
    // group's scales, KBytes alone does not give them).
    void KF32(int row, float* y) const {
      if (k == nullptr) return queued->KRowF32(layer, row, y);
      DequantizeEntryKRow(k, n_rows, *k_group_ends, kv_dim, row, y);
    }
    const char* KBytes(int row) const { return k ? k + row * k_row_size : queued->k_row_bytes(layer, row); }
    const char* VBytes(int row) const { return v ? v + row * v_row_size : queued->v_row_bytes(layer, row); }
    const float* K(int row) const { return reinterpret_cast<const float*>(KBytes(row)); }
    const float* V(int row) const { return reinterpret_cast<const float*>(VBytes(row)); }
    const uint16_t* K16(int row) const { return reinterpret_cast<const uint16_t*>(KBytes(row)); }
    const uint16_t* V16(int row) const { return reinterpret_cast<const uint16_t*>(VBytes(row)); }
    const uint8_t* KQ(int row) const { return reinterpret_cast<const uint8_t*>(KBytes(row)); }
    const uint8_t* VQ(int row) const { return reinterpret_cast<const uint8_t*>(VBytes(row)); }
  };
  Layer layer(int l) const;

 private:
  KvSource() = default;
  SharedBytes bytes_;
  EntryHeader header_;
  std::string key_;
  std::shared_ptr<const KvEntry> queued_;
  std::shared_ptr<KvStream> stream_;
};

// A kivi4 layer's K rows as f32 (how the loader reads them): a serialized layer's group
// scales and minimums are widened to f32 once, so a row is one multiply-add a value (the
// same values as KvSource::Layer::KF32, which widens a group's per row); a queued save's
// rows go through KF32. Valid while `src`'s source lives.
class GroupedKRows {
 public:
  explicit GroupedKRows(const KvSource::Layer& src);
  void Row(int row, float* y) const;

 private:
  KvSource::Layer src_;
  std::vector<float> params_;  // per group: kv_dim scales, then kv_dim minimums (serialized)
};

}  // namespace attic::store
