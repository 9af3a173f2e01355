#include "attic/kv/block_pool.h"

#include <algorithm>
#include <cstring>

#include "attic/backend/convert.h"
#include "attic/backend/thread_pool.h"
#include "attic/core/huge_pages.h"
#include "attic/attention/kv_q4.h"
#include "attic/kv/enter_rows.h"

namespace attic::kv {

namespace {
// One layer's K (or V) buffer for n_blocks, to its 4 KiB page boundary.
size_t PageRounded(int n_blocks, int64_t layer_bytes) {
  return (static_cast<size_t>(n_blocks) * static_cast<size_t>(layer_bytes) + 4095) / 4096 * 4096;
}
}  // namespace

uint64_t BlockPool::MappedBytes(const KvShape& shape, int n_blocks) {
  return static_cast<uint64_t>(shape.n_layers) *
         (PageRounded(n_blocks, shape.k_layer_bytes()) + PageRounded(n_blocks, shape.v_layer_bytes()));
}

BlockPool::BlockPool(const KvShape& shape, int n_blocks, backend::ThreadPool* threads,
                     const std::function<void(uint64_t, uint64_t)>& progress)
    : shape_(shape), n_blocks_(n_blocks) {
  ATTIC_CHECK(n_blocks > 0 && shape.block_size > 0);
  for (DType t : {shape.k_dtype, shape.v_dtype}) {
    ATTIC_CHECK(t == DType::kF32 || t == DType::kF16 ||
                (t == DType::kQ8_0 && attention::KvQ8Supports(shape.head_dim)) ||
                (t == DType::kQ4_0 && attention::KvQ4Supports(shape.head_dim)));
  }
  // Each buffer at a 4 KiB boundary of the one mapping.
  const size_t k_bytes = PageRounded(n_blocks, shape.k_layer_bytes());
  const size_t v_bytes = PageRounded(n_blocks, shape.v_layer_bytes());
  const size_t total_bytes = MappedBytes(shape, n_blocks);
  storage_ = AllocateHugePageAligned(total_bytes);
  uint8_t* base = reinterpret_cast<uint8_t*>(storage_.get());
  k_.resize(shape.n_layers);
  v_.resize(shape.n_layers);
  for (int l = 0; l < shape.n_layers; ++l) {
    k_[l] = base + static_cast<size_t>(l) * (k_bytes + v_bytes);
    v_[l] = k_[l] + k_bytes;
  }
  // Zeroed (so its pages are taken now, not on first use) in chunks (one per task), a
  // round of one chunk per thread between progress reports.
  constexpr size_t kChunk = 32 << 20;
  const int64_t n_chunks = static_cast<int64_t>((total_bytes + kChunk - 1) / kChunk);
  auto zero = [&](int64_t c) {
    const size_t at = static_cast<size_t>(c) * kChunk;
    std::memset(base + at, 0, std::min(kChunk, total_bytes - at));
  };
  const int64_t round = threads != nullptr ? threads->n_threads() : 1;
  for (int64_t c0 = 0; c0 < n_chunks; c0 += round) {
    const int64_t n = std::min(round, n_chunks - c0);
    if (threads != nullptr) {
      threads->ParallelFor(n, [&](int64_t i, int) { zero(c0 + i); });
    } else {
      zero(c0);  // a round is one chunk
    }
    if (progress) progress(std::min<uint64_t>(total_bytes, static_cast<uint64_t>(c0 + n) * kChunk), total_bytes);
  }
  free_.reserve(n_blocks);
  for (int b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
  refs_.assign(n_blocks, 0);
}

attention::KvLayerView LayerView(const KvShape& shape, const void* k, const void* v) {
  attention::KvLayerView view;
  switch (shape.k_dtype) {
    case DType::kQ8_0: view.k_q8 = static_cast<const int8_t*>(k); break;
    case DType::kQ4_0: view.k_q4 = static_cast<const uint8_t*>(k); break;
    case DType::kF16: view.k_f16 = static_cast<const uint16_t*>(k); break;
    default: view.k_pool = static_cast<const float*>(k); break;
  }
  switch (shape.v_dtype) {
    case DType::kQ8_0: view.v_q8 = static_cast<const int8_t*>(v); break;
    case DType::kQ4_0: view.v_q4 = static_cast<const uint8_t*>(v); break;
    case DType::kF16: view.v_f16 = static_cast<const uint16_t*>(v); break;
    default: view.v_pool = static_cast<const float*>(v); break;
  }
  // q8_0 / q4_0 blocks are addressed in bytes, f32 / f16 ones in elements.
  auto stride = [&](DType t) { return attention::KvHasScales(t) ? shape.LayerBytes(t) : shape.block_stride(); };
  view.block_stride = stride(shape.k_dtype);
  view.v_block_stride = stride(shape.v_dtype);
  view.q8_scales = shape.scales_offset(shape.k_dtype);
  view.v_q8_scales = shape.scales_offset(shape.v_dtype);
  view.block_size = shape.block_size;
  return view;
}

int BlockPool::BlocksForBudget(const KvShape& shape, int64_t budget_bytes) {
  // n * block_bytes() is what the blocks hold; the mapping adds up to 4 KiB per buffer
  // (2 * n_layers of them), so step down from there to the largest n that fits.
  const uint64_t budget = static_cast<uint64_t>(std::max<int64_t>(0, budget_bytes));
  int64_t n = std::max<int64_t>(1, std::min<int64_t>(budget_bytes / shape.block_bytes(), 1 << 30));
  while (n > 1 && MappedBytes(shape, static_cast<int>(n)) > budget) --n;
  return static_cast<int>(n);
}

StatusOr<int32_t> BlockPool::Allocate() {
  if (free_.empty()) {
    return ResourceExhaustedError("KV cache is full (" + std::to_string(n_blocks_) + " blocks of " +
                                  std::to_string(shape_.block_size) + " tokens)");
  }
  int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  return b;
}

void BlockPool::Share(int32_t block) {
  ATTIC_CHECK(block >= 0 && block < n_blocks_ && refs_[block] >= 1);
  ++refs_[block];
}

void BlockPool::Free(int32_t block) {
  ATTIC_CHECK(block >= 0 && block < n_blocks_ && refs_[block] >= 1);
  if (--refs_[block] == 0) free_.push_back(block);
}

void BlockPool::CopyBlock(int32_t dst, int32_t src) {
  const size_t k_bytes = static_cast<size_t>(shape_.k_layer_bytes());
  const size_t v_bytes = static_cast<size_t>(shape_.v_layer_bytes());
  for (int l = 0; l < shape_.n_layers; ++l) {
    std::memcpy(k_block_bytes(l, dst), k_block_bytes(l, src), k_bytes);
    std::memcpy(v_block_bytes(l, dst), v_block_bytes(l, src), v_bytes);
  }
}

int SequenceKv::n_pending_copies() const {
  const int bs = pool_->shape().block_size;
  return n_slots() % bs != 0 && !blocks_.empty() && blocks_.back() != kNoBlock && pool_->refs(blocks_.back()) > 1
             ? 1
             : 0;
}

int SequenceKv::BlocksToAppend(int n) const {
  if (n <= 0) return 0;
  const int bs = pool_->shape().block_size;
  return (n_slots() + n + bs - 1) / bs - static_cast<int>(blocks_.size()) + n_pending_copies();
}

Status SequenceKv::Append(const int32_t* tokens, const int32_t* positions, int n) {
  const int need_blocks = BlocksToAppend(n);
  if (need_blocks > pool_->n_free()) {
    return ResourceExhaustedError("KV cache is full: need " + std::to_string(need_blocks) + " more blocks, " +
                                  std::to_string(pool_->n_free()) + " free");
  }
  const int copies = n > 0 ? n_pending_copies() : 0;
  if (copies > 0) {
    // Copy-on-write: the slots after the shared rows go into a private copy of the block.
    const int32_t copy = *pool_->Allocate();
    pool_->CopyBlock(copy, blocks_.back());
    pool_->Free(blocks_.back());
    blocks_.back() = copy;
  }
  for (int i = copies; i < need_blocks; ++i) blocks_.push_back(*pool_->Allocate());
  tokens_.insert(tokens_.end(), tokens, tokens + n);
  positions_.insert(positions_.end(), positions, positions + n);
  return OkStatus();
}

void SequenceKv::SetSlot(int slot, int32_t token, int32_t position) {
  ATTIC_CHECK(slot >= 0 && slot < n_slots());
  const int32_t block = blocks_[slot / pool_->shape().block_size];
  ATTIC_CHECK(block == kNoBlock || pool_->refs(block) == 1);  // never rewrite a shared block
  tokens_[slot] = token;
  positions_[slot] = position;
}

void SequenceKv::Truncate(int n) {
  if (n >= n_slots()) return;
  tokens_.resize(n);
  positions_.resize(n);
  const int bs = pool_->shape().block_size;
  size_t keep = static_cast<size_t>((n + bs - 1) / bs);
  while (blocks_.size() > keep) {
    if (blocks_.back() != kNoBlock) pool_->Free(blocks_.back());
    blocks_.pop_back();
  }
}

void SequenceKv::ReleaseBlock(int index) {
  ATTIC_CHECK(index >= 0 && index < static_cast<int>(blocks_.size()));
  if (blocks_[index] == kNoBlock) return;
  pool_->Free(blocks_[index]);
  blocks_[index] = kNoBlock;
}

std::unique_ptr<SequenceKv> SequenceKv::Fork() const {
  auto fork = std::make_unique<SequenceKv>(pool_);
  for (int32_t b : blocks_)
    if (b != kNoBlock) pool_->Share(b);
  fork->blocks_ = blocks_;
  fork->tokens_ = tokens_;
  fork->positions_ = positions_;
  return fork;
}

int SequenceKv::n_exclusive_blocks() const {
  return static_cast<int>(
      std::count_if(blocks_.begin(), blocks_.end(), [&](int32_t b) { return b != kNoBlock && pool_->refs(b) == 1; }));
}

int SequenceKv::n_resident_blocks() const {
  return static_cast<int>(std::count_if(blocks_.begin(), blocks_.end(), [](int32_t b) { return b != kNoBlock; }));
}

void SequenceKv::Release() {
  for (int32_t b : blocks_)
    if (b != kNoBlock) pool_->Free(b);
  blocks_.clear();
  tokens_.clear();
  positions_.clear();
}

void SequenceKv::WriteKv(int layer, int first, int n, const float* k, const float* v) {
  pool_->WriteRows(layer, blocks_.data(), first, n, k, v);
}

namespace {

// One slot's heads of one tensor of type t (values heads hs bytes apart, q8_0's / q4_0's
// scales ss scales apart) to f32 [n_heads][head_dim]; writing is StoreHeads (enter_rows.h).
void GetHeads(DType t, const uint8_t* src, const uint16_t* scales, float* dst, int n_heads, int hd, int64_t hs,
              int64_t ss) {
  for (int h = 0; h < n_heads; ++h) {
    float* row = dst + static_cast<int64_t>(h) * hd;
    if (t == DType::kQ8_0) {
      attention::DequantizeKvRowQ8(reinterpret_cast<const int8_t*>(src + h * hs), scales + h * ss, hd, row);
    } else if (t == DType::kQ4_0) {
      attention::DequantizeKvRowQ4(src + h * hs, scales + h * ss, hd, row);
    } else {
      backend::ConvertRowToF32(t, src + h * hs, row, hd);
    }
  }
}

}  // namespace

void BlockPool::WriteRows(int layer, const int32_t* blocks, int first, int n, const float* k, const float* v) {
  const KvShape& s = shape_;
  const int hd = s.head_dim, kvd = s.kv_dim();
  const int64_t ss = s.head_stride() / s.q8_group();  // q8_0 / q4_0: scales from one head's rows to the next's
  const bool kq8 = attention::KvHasScales(s.k_dtype), vq8 = attention::KvHasScales(s.v_dtype);
  for (int i = 0; i < n; ++i) {  // each head's row converted (or quantized) in one pass
    const int slot = first + i;
    const int64_t src = static_cast<int64_t>(i) * kvd;
    if (k != nullptr) {
      StoreHeads(s.k_dtype, k + src, s.n_kv_heads, hd, k_slot_bytes(layer, blocks, slot), s.head_stride(),
                 kq8 ? k_slot_q8_scales(layer, blocks, slot) : nullptr, ss);
    }
    StoreHeads(s.v_dtype, v + src, s.n_kv_heads, hd, v_slot_bytes(layer, blocks, slot), s.head_stride(),
               vq8 ? v_slot_q8_scales(layer, blocks, slot) : nullptr, ss);
  }
}

void BlockPool::ReadRows(int layer, const int32_t* blocks, int first, int n, float* k, float* v) const {
  const KvShape& s = shape_;
  const int hd = s.head_dim, kvd = s.kv_dim();
  const int64_t khs = attention::KvValueBytes(s.k_dtype, s.head_stride());
  const int64_t vhs = attention::KvValueBytes(s.v_dtype, s.head_stride());
  const int64_t ss = s.head_stride() / s.q8_group();
  auto scales = [&](const uint8_t* buffer, DType t, int slot) {
    return attention::KvHasScales(t) ? reinterpret_cast<const uint16_t*>(buffer + SlotScaleByteOffset(blocks, slot, t))
                                 : nullptr;
  };
  for (int i = 0; i < n; ++i) {
    const int slot = first + i;
    const int64_t dst = static_cast<int64_t>(i) * kvd;
    GetHeads(s.k_dtype, k_[layer] + SlotByteOffset(blocks, slot, s.k_dtype), scales(k_[layer], s.k_dtype, slot),
             k + dst, s.n_kv_heads, hd, khs, ss);
    GetHeads(s.v_dtype, v_[layer] + SlotByteOffset(blocks, slot, s.v_dtype), scales(v_[layer], s.v_dtype, slot),
             v + dst, s.n_kv_heads, hd, vhs, ss);
  }
}

void SequenceKv::ReadKv(int layer, int first, int n, float* k, float* v) const {
  pool_->ReadRows(layer, blocks_.data(), first, n, k, v);
}

}  // namespace attic::kv
