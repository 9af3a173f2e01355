// The compute buffer's KV storage: a fixed pool of blocks, each holding `block_size`
// token slots of K and V for every layer. Sequences own blocks through a SequenceKv
// (their block table). K here has RoPE applied (it is what attention reads); KV that
// outlives a step is saved pre-RoPE by the store (DESIGN.md decision 1).
//
// Layout: for layer l and block b, K is [n_kv_heads][block_size][head_dim] elements of
// shape().k_dtype (f32, or f16 to halve the bytes decode attention reads) at element
// b * block_stride() of k_data(l), V likewise (of v_dtype) in v_data(l). Rows enter and
// leave as f32 (WriteRows / ReadRows convert).
// q8_0 (a quarter of f32's bytes plus one f16 scale per 32 values; attention/kv_q8.h):
// block b is the LayerBytes(kQ8_0) bytes at b * LayerBytes(kQ8_0): the int8 values
// [n_kv_heads][block_size][head_dim] (block_stride() bytes), then their f16 scales
// [n_kv_heads][block_size][head_dim / q8_group()] at byte scales_offset(kQ8_0). WriteRows
// quantizes each row in one pass; the attention kernels read the blocks as they are.
// q4_0 (attention/kv_q4.h) likewise, with head_dim / 2 bytes of codes per row: the codes
// (attention::KvValueBytes(kQ4_0, block_stride()) bytes), then the scales at scales_offset(kQ4_0).
// K and V may have different types: each tensor's buffers follow its own type.
//
// Sharing: blocks are reference-counted. SequenceKv::Fork makes a second sequence that
// shares every block of the first (n choices of one prompt: the prompt is prefilled
// once); a block returns to the free list when its last owner frees it, and a shared
// block counts once against the pool. Blocks are copied on write: before a sequence
// appends into a shared, partially filled last block it takes a private copy of it
// (SequenceKv::Append), so a sequence never writes into a block another one reads.
//
// Thread-safety: BlockPool allocation is not thread-safe; the engine's step loop owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "attic/attention/attention.h"
#include "attic/attention/kv_q8.h"
#include "attic/core/status.h"
#include "attic/tensor/buffer.h"
#include "attic/tensor/dtype.h"

namespace attic::backend {
class ThreadPool;
}

namespace attic::kv {

// Tokens per block by default. A block holds one contiguous run of rows per KV head, and
// decode attention streams those runs from DRAM: 128-token runs (32 KiB of f32 K per head
// at head_dim 64) read ~1.4x faster than 16-token ones, which break the stream every
// 4 KiB (build/attention_bench --block-size). The cost is up to 127 reserved but unused
// slots per sequence.
inline constexpr int kDefaultBlockSize = 128;

struct KvShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = kDefaultBlockSize;
  // Element types of the stored K and V rows: kF32, kF16, kQ8_0 or kQ4_0 each. They may differ
  // (--kv-dtype-k / --kv-dtype-v); each tensor is laid out by its own type.
  DType k_dtype = DType::kF32;
  DType v_dtype = DType::kF32;

  // Both tensors in one type.
  void set_dtype(DType t) { k_dtype = v_dtype = t; }
  bool one_dtype() const { return k_dtype == v_dtype; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // q8_0 / q4_0: values per scale (32, or head_dim when it is smaller).
  int q8_group() const { return attention::KvQ8Group(head_dim); }
  // Elements of one layer's K (or V) in one block.
  int64_t block_stride() const { return static_cast<int64_t>(n_kv_heads) * block_size * head_dim; }
  // A block is [kv_head][row][head_dim]: elements from one head's rows to the next head's.
  int64_t head_stride() const { return static_cast<int64_t>(block_size) * head_dim; }
  // q8_0 / q4_0 of type t: bytes from a block's start to its scales.
  int64_t scales_offset(DType t) const { return attention::KvValueBytes(t, block_stride()); }
  // Bytes of one layer's K or V of type t in one block.
  int64_t LayerBytes(DType t) const {
    const int64_t values = attention::KvValueBytes(t, block_stride());
    return attention::KvHasScales(t) ? values + block_stride() / q8_group() * 2 : values;
  }
  int64_t k_layer_bytes() const { return LayerBytes(k_dtype); }
  int64_t v_layer_bytes() const { return LayerBytes(v_dtype); }
  // Bytes of K+V one block occupies across all layers.
  int64_t block_bytes() const { return n_layers * (k_layer_bytes() + v_layer_bytes()); }
};

// Attention's view of one layer's K and V laid out as `shape`'s blocks (the pool's, or a
// buffer in the same layout), each by its own type; the caller sets block_table and
// n_slots.
attention::KvLayerView LayerView(const KvShape& shape, const void* k, const void* v);

class BlockPool {
 public:
  // Allocates n_blocks blocks up front (bounded memory: the pool never grows) and zeroes
  // them, touching every page now rather than in the middle of a forward step. With
  // `threads`, the zeroing runs on them (gigabytes of fresh pages take seconds to fault
  // in) and `progress(done_bytes, total_bytes)`, if set, is called as it goes.
  BlockPool(const KvShape& shape, int n_blocks, backend::ThreadPool* threads = nullptr,
            const std::function<void(uint64_t, uint64_t)>& progress = nullptr);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  // The largest pool whose mapping (MappedBytes) fits in `budget_bytes` (at least one
  // block).
  static int BlocksForBudget(const KvShape& shape, int64_t budget_bytes);
  // Bytes a pool of n_blocks maps: each layer's K buffer and V buffer starts at a 4 KiB
  // boundary, so a type whose layer bytes per block are no multiple of 4 KiB (q8_0, q4_0)
  // maps up to 4 KiB more per buffer than n_blocks * block_bytes().
  static uint64_t MappedBytes(const KvShape& shape, int n_blocks);
  uint64_t mapped_bytes() const { return MappedBytes(shape_, n_blocks_); }

  const KvShape& shape() const { return shape_; }
  int n_blocks() const { return n_blocks_; }
  int n_free() const { return static_cast<int>(free_.size()); }
  // Blocks held by at least one owner (a shared block counts once).
  int n_used() const { return n_blocks_ - n_free(); }

  // A free block with one owner. ResourceExhausted when the pool is empty.
  StatusOr<int32_t> Allocate();
  // Adds an owner to an allocated block. REQUIRES: refs(block) >= 1.
  void Share(int32_t block);
  // Drops one owner; the block is free again when it was the last.
  // REQUIRES: refs(block) >= 1.
  void Free(int32_t block);
  // Owners of `block` (0 = free).
  int refs(int32_t block) const { return refs_[block]; }
  // Copies every layer's K and V of block `src` into block `dst`.
  void CopyBlock(int32_t dst, int32_t src);

  // Layer `layer`'s K (V) storage: shape().k_dtype (v_dtype) elements, block b at
  // b * k_layer_bytes() (v_layer_bytes()) bytes.
  void* k_data(int layer) { return k_[layer]; }
  void* v_data(int layer) { return v_[layer]; }
  uint8_t* k_block_bytes(int layer, int32_t block) { return k_[layer] + block * shape_.k_layer_bytes(); }
  uint8_t* v_block_bytes(int layer, int32_t block) { return v_[layer] + block * shape_.v_layer_bytes(); }
  // Writes K and V ([n, kv_dim] each; k may be null: V only) into slots [first, first+n)
  // of the sequence whose block table is `blocks`, at `layer`. Touches only those
  // blocks, so it may run on another thread than the one allocating (the KV loader).
  void WriteRows(int layer, const int32_t* blocks, int first, int n, const float* k, const float* v);
  // Reads K and V of those slots into [n, kv_dim] f32 arrays.
  void ReadRows(int layer, const int32_t* blocks, int first, int n, float* k, float* v) const;
  // An f32 pool's storage of slot `slot` (of the sequence whose block table is `blocks`)
  // in layer `layer`'s K / V: head 0; head h is shape().head_stride() floats further.
  // For writers that produce a row in place (the KV loader rotates K straight into it).
  float* k_slot_f32(int layer, const int32_t* blocks, int slot) {
    return reinterpret_cast<float*>(k_slot_bytes(layer, blocks, slot));
  }
  float* v_slot_f32(int layer, const int32_t* blocks, int slot) {
    return reinterpret_cast<float*>(v_slot_bytes(layer, blocks, slot));
  }
  // The same for any element type: head 0 of the slot, head h is
  // attention::KvValueBytes(type, shape().head_stride()) bytes further (q8_0 / q4_0: the
  // values; the scales are k_slot_q8_scales).
  uint8_t* k_slot_bytes(int layer, const int32_t* blocks, int slot) {
    return k_[layer] + SlotByteOffset(blocks, slot, shape_.k_dtype);
  }
  uint8_t* v_slot_bytes(int layer, const int32_t* blocks, int slot) {
    return v_[layer] + SlotByteOffset(blocks, slot, shape_.v_dtype);
  }
  // A q8_0 / q4_0 tensor's scales of the slot: head 0's head_dim / q8_group() scales;
  // head h's are shape().head_stride() / q8_group() scales further.
  uint16_t* k_slot_q8_scales(int layer, const int32_t* blocks, int slot) {
    return reinterpret_cast<uint16_t*>(k_[layer] + SlotScaleByteOffset(blocks, slot, shape_.k_dtype));
  }
  uint16_t* v_slot_q8_scales(int layer, const int32_t* blocks, int slot) {
    return reinterpret_cast<uint16_t*>(v_[layer] + SlotScaleByteOffset(blocks, slot, shape_.v_dtype));
  }

 private:
  // Byte offset of head 0 of slot `slot` in a layer's K (or V) storage of type t; head h
  // is attention::KvValueBytes(t, h * shape().head_stride()) bytes further.
  int64_t SlotByteOffset(const int32_t* blocks, int slot, DType t) const {
    return blocks[slot / shape_.block_size] * shape_.LayerBytes(t) +
           attention::KvValueBytes(t, static_cast<int64_t>(slot % shape_.block_size) * shape_.head_dim);
  }
  // q8_0 / q4_0 storage of type t: byte offset of head 0's first scale of slot `slot`.
  int64_t SlotScaleByteOffset(const int32_t* blocks, int slot, DType t) const {
    return blocks[slot / shape_.block_size] * shape_.LayerBytes(t) +
           attention::KvQ8ScaleAt(shape_.scales_offset(t),
                                  static_cast<int64_t>(slot % shape_.block_size) * shape_.head_dim, shape_.head_dim);
  }

  KvShape shape_;
  int n_blocks_;
  // Every layer's K and V in one 2 MiB-aligned mapping, in huge pages where the kernel
  // gives them (core/huge_pages.h): decode attention streams them, and a layer's buffer
  // of its own is often under 2 MiB (17 blocks of a 135M model: 1.7 MiB), so 4 KiB pages.
  std::shared_ptr<std::byte> storage_;
  std::vector<uint8_t*> k_, v_;  // [n_layers]: each layer's buffer in storage_
  std::vector<int32_t> free_;
  std::vector<int32_t> refs_;  // [n_blocks]: owners of each block
};

// One sequence's KV in the pool: its block table, and the token and position of every
// slot. Slot s is the s-th KV entry of the sequence; its position is what RoPE used.
//
// A block may be released while its slots stay in the sequence (ReleaseBlock: a sparse
// sequence whose older KV lives in a slower tier, pq/offload.h): its table entry is then
// kNoBlock, and whoever lets attention see those slots must give it the rows from
// elsewhere (kv::Visibility::view). Reading or writing a released block's slots is a
// caller bug.
class SequenceKv {
 public:
  static constexpr int32_t kNoBlock = -1;

  explicit SequenceKv(BlockPool* pool) : pool_(pool) {}
  ~SequenceKv() { Release(); }
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  int n_slots() const { return static_cast<int>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int32_t>& positions() const { return positions_; }
  const std::vector<int32_t>& block_table() const { return blocks_; }
  BlockPool* pool() const { return pool_; }

  // Makes room for `n` more slots (allocating blocks) and records their tokens and
  // positions. On ResourceExhausted nothing changes. The caller then writes K/V of the
  // new slots (WriteKv) layer by layer. A partially filled last block that is shared
  // (Fork) is first replaced by a private copy (copy-on-write).
  Status Append(const int32_t* tokens, const int32_t* positions, int n);
  // Blocks Append(n) would take from the pool: new blocks, plus the copy of a shared
  // partially filled last block.
  int BlocksToAppend(int n) const;
  // 1 when the last block is shared and partially filled (the next Append copies it).
  int n_pending_copies() const;
  // Replaces the token and position recorded for existing slot `slot` (recompute in
  // place: the caller then rewrites the slot's K/V layer by layer).
  // REQUIRES: 0 <= slot < n_slots(); the slot's block is not shared.
  void SetSlot(int slot, int32_t token, int32_t position);
  // A new sequence with the same slots, sharing every block (each gains an owner):
  // nothing is copied until one of them appends into a shared block.
  std::unique_ptr<SequenceKv> Fork() const;
  // Blocks of the table this sequence alone owns (what releasing it would free).
  int n_exclusive_blocks() const;
  // Drops slots >= n (frees whole blocks past the end).
  void Truncate(int n);
  // Frees block `index` of the table (slots [index * block_size, (index + 1) *
  // block_size)); the slots keep their tokens and positions. No-op when already released.
  // REQUIRES: 0 <= index < block_table().size().
  void ReleaseBlock(int index);
  bool resident(int index) const { return blocks_[index] != kNoBlock; }
  // Blocks of the pool the sequence holds (its table minus the released ones).
  int n_resident_blocks() const;
  // Frees every block.
  void Release();

  // Writes K/V rows for slots [first, first + n) of `layer`.
  // k, v: [n, n_kv_heads * head_dim] (K already rotated).
  void WriteKv(int layer, int first, int n, const float* k, const float* v);
  // Reads K/V rows of slots [first, first + n) into [n, kv_dim] arrays.
  void ReadKv(int layer, int first, int n, float* k, float* v) const;

 private:
  BlockPool* pool_;
  std::vector<int32_t> blocks_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> positions_;
};

}  // namespace attic::kv
