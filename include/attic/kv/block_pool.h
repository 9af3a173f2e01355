// The compute buffer's KV storage: a fixed pool of blocks, each holding `block_size`
// token slots of K and V for every layer. Sequences own blocks through a SequenceKv
// (their block table). K here has RoPE applied (it is what attention reads); KV that
// outlives a step is saved pre-RoPE by the store (DESIGN.md decision 1).
//
// Layout: for layer l and block b, K is [n_kv_heads][block_size][head_dim] f32 at
// k_pool(l) + b * block_stride(), V likewise at v_pool(l) + b * block_stride().
//
// Thread-safety: BlockPool allocation is not thread-safe; the engine's step loop owns it.
#pragma once

#include <cstdint>
#include <vector>

#include "attic/core/status.h"
#include "attic/tensor/buffer.h"

namespace attic::kv {

struct KvShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;

  int kv_dim() const { return n_kv_heads * head_dim; }
  int64_t block_stride() const { return static_cast<int64_t>(n_kv_heads) * block_size * head_dim; }
  // A block is [kv_head][row][head_dim]: floats from one head's rows to the next head's.
  int64_t head_stride() const { return static_cast<int64_t>(block_size) * head_dim; }
  // Bytes of K+V one block occupies across all layers.
  int64_t block_bytes() const { return 2 * n_layers * block_stride() * 4; }
};

class BlockPool {
 public:
  // Allocates n_blocks blocks up front (bounded memory: the pool never grows).
  BlockPool(const KvShape& shape, int n_blocks);
  // The largest pool within `budget_bytes` (at least one block).
  static int BlocksForBudget(const KvShape& shape, int64_t budget_bytes);

  const KvShape& shape() const { return shape_; }
  int n_blocks() const { return n_blocks_; }
  int n_free() const { return static_cast<int>(free_.size()); }
  int n_used() const { return n_blocks_ - n_free(); }

  // ResourceExhausted when the pool is empty.
  StatusOr<int32_t> Allocate();
  void Free(int32_t block);

  float* k_pool(int layer) { return k_[layer].as<float>(); }
  float* v_pool(int layer) { return v_[layer].as<float>(); }
  float* k_block(int layer, int32_t block) { return k_pool(layer) + block * shape_.block_stride(); }
  float* v_block(int layer, int32_t block) { return v_pool(layer) + block * shape_.block_stride(); }
  // Head 0 of slot `slot` of the sequence whose block table is `blocks`, at `layer`;
  // head h is h * shape().head_stride() floats further.
  float* k_slot(int layer, const int32_t* blocks, int slot) {
    return k_block(layer, blocks[slot / shape_.block_size]) + (slot % shape_.block_size) * shape_.head_dim;
  }
  float* v_slot(int layer, const int32_t* blocks, int slot) {
    return v_block(layer, blocks[slot / shape_.block_size]) + (slot % shape_.block_size) * shape_.head_dim;
  }
  // Writes K and V ([n, kv_dim] each; k may be null: V only) into slots [first, first+n)
  // of the sequence whose block table is `blocks`, at `layer`. Touches only those
  // blocks, so it may run on another thread than the one allocating (the KV loader).
  void WriteRows(int layer, const int32_t* blocks, int first, int n, const float* k, const float* v);

 private:
  KvShape shape_;
  int n_blocks_;
  std::vector<AlignedBuffer> k_, v_;  // [n_layers]
  std::vector<int32_t> free_;
};

// One sequence's KV in the pool: its block table, and the token and position of every
// slot. Slot s is the s-th KV entry of the sequence; its position is what RoPE used.
class SequenceKv {
 public:
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
  // new slots (WriteKv) layer by layer.
  Status Append(const int32_t* tokens, const int32_t* positions, int n);
  // Drops slots >= n (frees whole blocks past the end).
  void Truncate(int n);
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
