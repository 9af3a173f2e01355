// Offloading a sparse sequence's KV below the compute buffer (offload.h).
//
// Tier layout: one value per complete block b of the sequence, key "<prefix>-<b>",
// holding for each layer l its K then its V rows, [block_size, kv_dim] each, before RoPE
// (what the forward's OnKv hands over), in the tier's type (OffloadOptions::tier_dtype:
// the store's types and row layouts, store/entry.h; kivi4's K: the block's codes, then
// its one group's scales and minimums): layer l's part of block b is the range
// [l * L, (l + 1) * L) with L = TierRows::bytes(), so one layer of one block is one
// GetRange.
#include "attic/pq/offload.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attic/attention/kv_q4.h"
#include "attic/attention/kv_q8.h"
#include "attic/backend/convert.h"
#include "attic/core/log.h"
#include "attic/kv/enter_rows.h"
#include "attic/tensor/buffer.h"
#include "pq/sparse_internal.h"

namespace attic::pq {

namespace {

using internal::Since;

// One layer of one block in the tier: block_size rows of pre-RoPE K, then of V, in the
// store type `dtype` (store/entry.h's rows; a quantized type's groups are the compute
// buffer's, attention::KvQ8Group(head_dim), as the store's entries). kivi4: K's rows of
// codes, then one group of kv_dim scales and kv_dim minimums for the block's rows (its
// tokens are the group, KIVI's per-channel keys), then V's q4_0 rows.
class TierRows {
 public:
  TierRows(store::KvDtype dtype, int rows, int kv_dim, int head_dim)
      : dtype_(dtype),
        kt_(store::KvTensorDtype(dtype, false)),
        vt_(store::KvTensorDtype(dtype, true)),
        rows_(rows),
        kvd_(kv_dim),
        group_(store::KvDtypeQuantized(dtype) ? attention::KvQ8Group(head_dim) : 0),
        k_row_(store::KvRowBytes(kt_, kv_dim, group_)),
        v_row_(store::KvRowBytes(vt_, kv_dim, group_)) {}

  // Whether the type's rows can be written for this shape (quantized rows: the compute
  // buffer's groups must divide a head's row; kivi4's codes pair channels).
  static bool Supports(store::KvDtype dtype, int head_dim, int kv_dim) {
    if (store::KvDtypeGroupedK(dtype)) return kv_dim % 2 == 0 && attention::KvQ4Supports(head_dim);
    if (store::KvTensorDtype(dtype, true) == store::KvDtype::kQ4_0) return attention::KvQ4Supports(head_dim);
    return !store::KvDtypeQuantized(dtype) || attention::KvQ8Supports(head_dim);
  }

  int64_t k_bytes() const {
    return rows_ * static_cast<int64_t>(k_row_) +
           (store::KvDtypeGroupedK(dtype_) ? static_cast<int64_t>(store::KGroupParamBytes(kvd_)) : 0);
  }
  int64_t bytes() const { return k_bytes() + rows_ * static_cast<int64_t>(v_row_); }
  // One row's K and V bytes (kivi4: K's codes), the part a fetch of one row reads.
  int64_t row_bytes() const { return static_cast<int64_t>(k_row_ + v_row_); }

  // rows x kv_dim pre-RoPE K and V (f32) into `dst` (bytes() bytes).
  void Encode(const float* k, const float* v, uint8_t* dst) const {
    EncodeRows(kt_, k, dst, k_row_);
    if (store::KvDtypeGroupedK(dtype_)) {
      std::vector<uint16_t> params(store::KGroupParamBytes(kvd_) / sizeof(uint16_t));
      store::QuantizeKGroup(k, rows_, kvd_, dst, params.data());
      std::memcpy(dst + rows_ * k_row_, params.data(), store::KGroupParamBytes(kvd_));
    }
    EncodeRows(vt_, v, dst + k_bytes(), v_row_);
  }

  // One fetched layer's rows (`bytes`, bytes() of them), values [first, first + n) (whole
  // KV heads), as f32: an f32 tier's in place, any other decoded into a scratch of n
  // floats (exact: each type's values are f32 numbers). kivi4's scales and minimums of
  // those channels (the block's one group) are widened once, for every row read.
  class Layer {
   public:
    Layer(const TierRows& t, const uint8_t* bytes, int first, int n) : t_(t), bytes_(bytes), first_(first), n_(n) {
      if (!store::KvDtypeGroupedK(t.dtype_)) return;
      // The layer's bytes are aligned only to 2: copied out first.
      thread_local std::vector<uint16_t> bits;
      bits.resize(2 * static_cast<size_t>(n));
      const uint8_t* params = bytes + t.rows_ * t.k_row_;
      std::memcpy(bits.data(), params + 2 * static_cast<size_t>(first), 2 * static_cast<size_t>(n));
      std::memcpy(bits.data() + n, params + 2 * (static_cast<size_t>(t.kvd_) + first), 2 * static_cast<size_t>(n));
      wide_.resize(bits.size());
      backend::ConvertF16ToF32(bits.data(), wide_.data(), static_cast<int64_t>(bits.size()));
    }
    const float* K(int row, float* scratch) const {
      const uint8_t* at = bytes_ + static_cast<size_t>(row) * t_.k_row_;
      if (wide_.empty()) return t_.DecodeRow(t_.kt_, at, first_, n_, scratch);
      store::DequantizeKGroupRowF32(at + first_ / 2, wide_.data(), wide_.data() + n_, n_, scratch);
      return scratch;
    }
    const float* V(int row, float* scratch) const {
      return t_.DecodeRow(t_.vt_, bytes_ + t_.k_bytes() + static_cast<size_t>(row) * t_.v_row_, first_, n_, scratch);
    }

   private:
    const TierRows& t_;
    const uint8_t* bytes_;
    int first_, n_;
    std::vector<float> wide_;  // kivi4: n scales, then n minimums
  };

 private:
  void EncodeRows(store::KvDtype t, const float* x, uint8_t* dst, size_t row_bytes) const {
    const int64_t n = static_cast<int64_t>(rows_) * kvd_;
    if (t == store::KvDtype::kF32) {
      std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
    } else if (t == store::KvDtype::kF16) {
      backend::ConvertF32ToF16(x, reinterpret_cast<uint16_t*>(dst), n);
    } else if (t == store::KvDtype::kQ8_0 || t == store::KvDtype::kQ4_0) {
      for (int r = 0; r < rows_; ++r)
        store::QuantizeRow(t, x + static_cast<int64_t>(r) * kvd_, kvd_, group_, dst + r * row_bytes);
    }  // kivi4's K: its group, by Encode
  }
  const float* DecodeRow(store::KvDtype t, const uint8_t* row, int first, int n, float* scratch) const {
    if (t == store::KvDtype::kF32) return reinterpret_cast<const float*>(row) + first;
    if (t == store::KvDtype::kF16) {
      backend::ConvertF16ToF32(reinterpret_cast<const uint16_t*>(row) + first, scratch, n);
    } else {
      store::DequantizeRowRange(t, row, kvd_, group_, first, n, scratch);
    }
    return scratch;
  }

  store::KvDtype dtype_, kt_, vt_;
  int rows_, kvd_, group_;
  size_t k_row_, v_row_;
};

TierRows TierRowsOf(const kv::KvShape& s, store::KvDtype dtype) {
  return TierRows(dtype, s.block_size, s.kv_dim(), s.head_dim);
}

// One block's value in the tier: every layer's TierRows.
int64_t BlockValueBytes(const kv::KvShape& s, store::KvDtype dtype) {
  return static_cast<int64_t>(s.n_layers) * TierRowsOf(s, dtype).bytes();
}

std::string KeyPrefix() {
  static std::atomic<uint64_t> next{0};
  char buf[64];
  std::snprintf(buf, sizeof(buf), "offload-%08x-%llu", static_cast<unsigned>(std::random_device{}()),
                static_cast<unsigned long long>(next++));
  return buf;
}

// A buffer laid out like one layer of the pool's blocks ([block][kv_head][row][head_dim]
// of the pool's K / V element type; q8_0: each block's scales after its values, as in the
// pool), K and V: attention reads it through `view`.
struct LayerBuffer {
  AlignedBuffer k, v;
  std::vector<int32_t> table;
  size_t k_bytes = 0, v_bytes = 0;
  void Reserve(int n_blocks, int64_t k_layer_bytes, int64_t v_layer_bytes) {
    const size_t k_need = static_cast<size_t>(n_blocks) * k_layer_bytes;
    const size_t v_need = static_cast<size_t>(n_blocks) * v_layer_bytes;
    if (k_need > k_bytes) {
      k.ResizeUninitialized(k_need);
      k_bytes = k_need;
    }
    if (v_need > v_bytes) {
      v.ResizeUninitialized(v_need);
      v_bytes = v_need;
    }
    if (static_cast<int>(table.size()) < n_blocks) {
      const int from = static_cast<int>(table.size());
      table.resize(n_blocks);
      for (int b = from; b < n_blocks; ++b) table[b] = b;
    }
  }
  void Free() {
    k = AlignedBuffer();
    v = AlignedBuffer();
    k_bytes = v_bytes = 0;
  }
};

class Offloaded final : public OffloadedSparseAttention {
 public:
  // `cache_phys`: the cache's blocks, taken from the sequence's pool.
  Offloaded(std::unique_ptr<SparseAttention> inner, const OffloadOptions& options, kv::SequenceKv* seq,
            const attention::RopeTable& rope, store::Tier* backing, int n_layers, backend::ThreadPool& pool,
            std::vector<int32_t> cache_phys)
      : inner_(std::move(inner)), opt_(options), seq_(seq), rope_(rope), backing_(backing), n_layers_(n_layers),
        pool_(pool), ks_(seq->pool()->shape()), tier_(TierRowsOf(ks_, options.tier_dtype)), prefix_(KeyPrefix()),
        cache_phys_(std::move(cache_phys)) {
    pend_k_.resize(n_layers);
    pend_v_.resize(n_layers);
    caches_.resize(n_layers);
    cache_where_.resize(n_layers);
    cache_free_.resize(n_layers);
    for (int l = 0; l < n_layers; ++l) {
      for (int h = 0; h < ks_.n_kv_heads; ++h) {
        caches_[l].emplace_back(opt_.cache_blocks, opt_.policy, ks_.block_size, opt_.update_blocks);
        cache_where_[l].emplace_back();
        std::vector<int> free(opt_.cache_blocks);
        for (int i = 0; i < opt_.cache_blocks; ++i) free[i] = opt_.cache_blocks - 1 - i;
        cache_free_[l].push_back(std::move(free));
      }
    }
    compact_.resize(ks_.n_kv_heads);
    released_sel_.resize(ks_.n_kv_heads);
    compact_ptrs_.resize(ks_.n_kv_heads);
    compact_lens_.resize(ks_.n_kv_heads);
  }

  ~Offloaded() override {
    for (int b = 0; b < static_cast<int>(in_tier_.size()); ++b)
      if (in_tier_[b]) (void)backing_->Erase(Key(b));
    for (int32_t p : cache_phys_) seq_->pool()->Free(p);
  }

  const SparseOptions& options() const override { return inner_->options(); }
  const SparseStats& stats() const override { return inner_->stats(); }
  const OffloadStats& offload_stats() const override { return stats_; }
  const std::vector<int32_t>& last_selection(int layer, int kv_head) const override {
    return inner_->last_selection(layer, kv_head);
  }
  const PqCodebook* codebook(int layer, int kv_head) const override { return inner_->codebook(layer, kv_head); }
  const std::vector<uint8_t>* codes(int layer, int kv_head) const override { return inner_->codes(layer, kv_head); }
  void set_prefill_seconds(double seconds) override { inner_->set_prefill_seconds(seconds); }
  std::optional<PqIndex> ExportIndex() const override { return inner_->ExportIndex(); }

  void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kv) override {
    const int kvd = ks_.kv_dim();
    const int expect = flushed_ + static_cast<int>(pend_k_[layer].size() / kvd);
    for (int r = 0; r < rows.n_rows; ++r)
      ATTIC_CHECK(rows.slots[r] == expect + r);  // offloaded sequences only append (offload.h)
    pend_k_[layer].insert(pend_k_[layer].end(), kv.k_pre_rope, kv.k_pre_rope + static_cast<int64_t>(rows.n_rows) * kvd);
    pend_v_[layer].insert(pend_v_[layer].end(), kv.v, kv.v + static_cast<int64_t>(rows.n_rows) * kvd);
    inner_->OnKv(layer, rows, kv);
  }

  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    if (stats_.offloaded_blocks == 0) {  // nothing released yet: the compute buffer has it all
      inner_->BeforeAttention(layer, rows, vis);
      return;
    }
    const int n = vis->n_slots;
    const int n_blocks = (n + ks_.block_size - 1) / ks_.block_size;
    const SparseOptions& o = inner_->options();
    const bool decode = rows.n_rows == 1 && rows.slots[0] == n - 1;
    const bool sparse = decode && o.method != SparseMethod::kFull && n >= o.min_slots;
    const bool trains = o.method == SparseMethod::kPq && inner_->codebook(layer, 0) == nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    if (!sparse || trains) {
      StageAll(layer, n_blocks);
      vis->view = &view_;
      vis->kv = &view_;
      stats_.stage_seconds += Since(t0);
      inner_->BeforeAttention(layer, rows, vis);  // the selection, if any, is in slot numbering
      if (!failed_blocks_.empty()) LeaveOut(vis);
      if (sparse) {
        // Warm the cache with this step's selection; its blocks are in the staged layer.
        for (int h = 0; h < ks_.n_kv_heads; ++h) UpdateCache(layer, h, inner_->last_selection(layer, h), &full_, &stats_);
      }
      return;
    }
    inner_->BeforeAttention(layer, rows, vis);  // reads codes, and keys of the resident tail only
    ATTIC_CHECK(vis->head_indices != nullptr);
    StageSelection(layer, *vis);
    vis->head_indices = compact_ptrs_.data();
    vis->n_head_indices = compact_lens_.data();
    vis->kv_end[0] = view_.n_slots;
    vis->view = &view_;
    vis->kv = &view_;
    stats_.stage_seconds += Since(t0);
  }

  void AfterLayer(int layer, const kv::EntryRows& rows, uint8_t* keep) override {
    inner_->AfterLayer(layer, rows, keep);
    if (layer == n_layers_ - 1) EndStep();
  }

 private:
  std::string Key(int block) const { return prefix_ + "-" + std::to_string(block); }
  int64_t LayerRangeBytes() const { return tier_.bytes(); }
  // What entering one row of one KV head reads of a fetched layer: its share of the row.
  int64_t HeadRowBytes() const { return tier_.row_bytes() / ks_.n_kv_heads; }
  // Bytes from a layer-block's start (a pool block's, or a staging buffer's block) of a
  // tensor of type t to row `row` of KV head h: its values, and (q8_0, q4_0) its f16
  // scales. Within a head, rows are consecutive in both.
  int64_t ValueAt(DType t, int h, int row) const {
    return attention::KvValueBytes(t, ElementAt(h, row));
  }
  int64_t ScalesPerRow() const { return ks_.head_dim / ks_.q8_group(); }
  // q8_0 / q4_0 only: the pool's formula, as BlockPool::k_slot_q8_scales.
  int64_t ScaleAt(DType t, int h, int row) const {
    return attention::KvQ8ScaleAt(ks_.scales_offset(t), ElementAt(h, row), ks_.head_dim);
  }
  // The index of row `row` of KV head h's first value among a layer-block's values.
  int64_t ElementAt(int h, int row) const {
    return static_cast<int64_t>(h) * ks_.head_stride() + static_cast<int64_t>(row) * ks_.head_dim;
  }
  // n consecutive rows of KV head h of a tensor of type t, from row src_row of the
  // layer-block at src to row dst_row of the one at dst.
  void CopyRows(DType t, const uint8_t* src, int src_row, uint8_t* dst, int dst_row, int h, int n) const {
    std::memcpy(dst + ValueAt(t, h, dst_row), src + ValueAt(t, h, src_row),
                static_cast<size_t>(attention::KvValueBytes(t, static_cast<int64_t>(n) * ks_.head_dim)));
    if (attention::KvHasScales(t)) {
      std::memcpy(dst + ScaleAt(t, h, dst_row), src + ScaleAt(t, h, src_row),
                  static_cast<size_t>(n) * ScalesPerRow() * sizeof(uint16_t));
    }
  }

  // Adds what a pool thread's (or a KV head's) own stats counted while staging: reads,
  // fetches and the cache's hits and misses.
  void AddReadCounts(const OffloadStats& t) {
    stats_.resident_reads += t.resident_reads;
    stats_.cache_hits += t.cache_hits;
    stats_.cache_misses += t.cache_misses;
    stats_.backing_errors += t.backing_errors;
    stats_.fetched_bytes += t.fetched_bytes;
    stats_.fetch_seconds += t.fetch_seconds;
  }

  // One layer of block b from the tier: K rows then V rows, pre-RoPE (TierRows). The read's time
  // and a failure (logged) are added to `stats` (stats_, or a pool thread's own).
  StatusOr<store::ByteRange> ReadLayer(int layer, int block, OffloadStats* stats) const {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = backing_->GetRange(Key(block), static_cast<uint64_t>(layer) * LayerRangeBytes(), LayerRangeBytes());
    stats->fetch_seconds += Since(t0);
    if (!r.ok()) {
      ++stats->backing_errors;
      Log(LogLevel::kWarn, "sparse offload: reading block %d, layer %d: %s", block, layer, r.status().ToString().c_str());
    }
    return r;
  }

  // KV heads [h, h + n_heads) of a tier range (one layer of a block: K rows, then V rows).
  TierRows::Layer HeadsOf(const store::ByteRange& range, int h, int n_heads) const {
    return TierRows::Layer(tier_, reinterpret_cast<const uint8_t*>(range.data), h * ks_.head_dim,
                           n_heads * ks_.head_dim);
  }

  // Row `row` of `src` (HeadsOf(range, h, n_heads)): decoded from the tier's type (in
  // place for f32), K rotated to `position`, both stored in the pool's element type, to
  // row dst_row of the layer-blocks at k_block / v_block.
  void EnterRow(const TierRows::Layer& src, int row, int h, int n_heads, int32_t position, uint8_t* k_block,
                uint8_t* v_block, int dst_row) const {
    thread_local std::vector<float> k_row, v_row;
    k_row.resize(static_cast<size_t>(n_heads) * ks_.head_dim);
    v_row.resize(static_cast<size_t>(n_heads) * ks_.head_dim);
    const float* k = src.K(row, k_row.data());
    const float* v = src.V(row, v_row.data());
    auto scales = [&](DType t, uint8_t* block) {
      return attention::KvHasScales(t) ? reinterpret_cast<uint16_t*>(block + ScaleAt(t, h, dst_row)) : nullptr;
    };
    kv::EnterRotatedHeads(ks_.k_dtype, ks_.v_dtype, rope_, k, v, n_heads, ks_.head_dim, position,
                          k_block + ValueAt(ks_.k_dtype, h, dst_row), v_block + ValueAt(ks_.v_dtype, h, dst_row),
                          ks_.head_stride(), scales(ks_.k_dtype, k_block), scales(ks_.v_dtype, v_block),
                          ks_.block_size * ScalesPerRow());
  }

  void SetView(const LayerBuffer& buf, int n_slots) {
    view_ = kv::LayerView(ks_, buf.k.data(), buf.v.data());  // the pool's layout (engine/transformer.cc)
    view_.block_table = buf.table.data();
    view_.n_slots = n_slots;
  }

  // Every slot of the layer into full_, in slot numbering. The blocks are staged in
  // parallel; each pool thread counts its reads in its own stats, added up after.
  void StageAll(int layer, int n_blocks) {
    ++stats_.full_stagings;
    const int64_t klb = ks_.k_layer_bytes(), vlb = ks_.v_layer_bytes();
    full_.Reserve(n_blocks, klb, vlb);
    NoteBuffer();
    const auto* kp = reinterpret_cast<const uint8_t*>(seq_->pool()->k_data(layer));
    const auto* vp = reinterpret_cast<const uint8_t*>(seq_->pool()->v_data(layer));
    const int bs = ks_.block_size;
    const auto& table = seq_->block_table();
    const auto& pos = seq_->positions();
    std::vector<OffloadStats> per_thread(static_cast<size_t>(pool_.n_threads()));
    std::vector<std::vector<int32_t>> failed(per_thread.size());
    pool_.ParallelFor(n_blocks, [&](int64_t b, int thread) {
      uint8_t* kd = full_.k.as<uint8_t>() + b * klb;
      uint8_t* vd = full_.v.as<uint8_t>() + b * vlb;
      if (table[b] != kv::SequenceKv::kNoBlock) {
        std::memcpy(kd, kp + table[b] * klb, klb);
        std::memcpy(vd, vp + table[b] * vlb, vlb);
        return;
      }
      auto range = ReadLayer(layer, static_cast<int>(b), &per_thread[thread]);
      if (!range.ok()) {
        failed[thread].push_back(static_cast<int32_t>(b));  // its slots are left out (LeaveOut)
        return;
      }
      per_thread[thread].fetched_bytes += static_cast<int64_t>(range->size);
      const TierRows::Layer src = HeadsOf(*range, 0, ks_.n_kv_heads);
      for (int r = 0; r < bs; ++r) EnterRow(src, r, 0, ks_.n_kv_heads, pos[b * bs + r], kd, vd, r);
    });
    for (size_t t = 0; t < per_thread.size(); ++t) {
      AddReadCounts(per_thread[t]);
      failed_blocks_.insert(failed_blocks_.end(), failed[t].begin(), failed[t].end());
    }
    SetView(full_, seq_->n_slots());
  }

  // After a whole-layer staging that could not read some blocks: what the rows see,
  // without those blocks' slots (an index list per head, or one for all).
  void LeaveOut(kv::Visibility* vis) {
    std::sort(failed_blocks_.begin(), failed_blocks_.end());
    const int bs = ks_.block_size;
    auto failed = [&](int32_t s) { return std::binary_search(failed_blocks_.begin(), failed_blocks_.end(), s / bs); };
    if (vis->head_indices != nullptr) {
      for (int h = 0; h < ks_.n_kv_heads; ++h) {
        compact_[h].clear();
        for (int i = 0; i < vis->n_head_indices[h]; ++i)
          if (!failed(vis->head_indices[h][i])) compact_[h].push_back(vis->head_indices[h][i]);
        compact_ptrs_[h] = compact_[h].data();
        compact_lens_[h] = static_cast<int32_t>(compact_[h].size());
      }
      vis->head_indices = compact_ptrs_.data();
      vis->n_head_indices = compact_lens_.data();
    } else {
      const int32_t* from = vis->indices;
      const int n_from = from != nullptr ? vis->n_indices : vis->n_slots;
      visible_.clear();
      for (int i = 0; i < n_from; ++i) {
        const int32_t s = from != nullptr ? from[i] : i;
        if (!failed(s)) visible_.push_back(s);
      }
      vis->indices = visible_.data();
      vis->n_indices = static_cast<int>(visible_.size());
    }
    failed_blocks_.clear();
  }

  // The cache of (layer, h) after one step's selection: counts the selected slots of
  // released blocks, then fills the blocks that entered from `staged` (a whole-layer
  // staging, slot numbering) or from the tier.
  // Touches only (layer, h)'s cache, its rows of the cache's pool blocks and `stats`, so
  // the KV heads may run in parallel (each with stats of its own).
  void UpdateCache(int layer, int h, const std::vector<int32_t>& selection, const LayerBuffer* staged,
                   OffloadStats* stats) {
    std::vector<int32_t>& sel = released_sel_[h];
    sel.clear();
    const auto& table = seq_->block_table();
    for (int32_t s : selection) {
      if (table[s / ks_.block_size] == kv::SequenceKv::kNoBlock) sel.push_back(s);
      else ++stats->resident_reads;
    }
    BlockCache& cache = caches_[layer][h];
    const AccessResult r = cache.Access(sel.data(), static_cast<int>(sel.size()));
    stats->cache_hits += r.token_hits;
    stats->cache_misses += r.token_misses;
    if (r.block_insertions == 0 && r.block_evictions == 0) return;
    auto& where = cache_where_[layer][h];
    auto& free = cache_free_[layer][h];
    for (auto it = where.begin(); it != where.end();) {
      if (!cache.Contains(it->first)) {
        free.push_back(it->second);
        it = where.erase(it);
      } else {
        ++it;
      }
    }
    const int bs = ks_.block_size;
    const int64_t klb = ks_.k_layer_bytes(), vlb = ks_.v_layer_bytes();
    auto* kp = reinterpret_cast<uint8_t*>(seq_->pool()->k_data(layer));
    auto* vp = reinterpret_cast<uint8_t*>(seq_->pool()->v_data(layer));
    const auto& pos = seq_->positions();
    for (int32_t b : cache.CachedBlocks()) {
      if (where.count(b) != 0) continue;
      ATTIC_CHECK(!free.empty());
      const int idx = free.back();
      free.pop_back();
      where[b] = idx;
      uint8_t* kd = kp + cache_phys_[idx] * klb;
      uint8_t* vd = vp + cache_phys_[idx] * vlb;
      if (staged != nullptr) {
        CopyRows(ks_.k_dtype, staged->k.as<uint8_t>() + b * klb, 0, kd, 0, h, bs);
        CopyRows(ks_.v_dtype, staged->v.as<uint8_t>() + b * vlb, 0, vd, 0, h, bs);
        continue;
      }
      auto range = ReadLayer(layer, b, stats);
      if (!range.ok()) {
        where.erase(b);  // not filled: served from the tier (or left out) until it enters again
        free.push_back(idx);
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      const TierRows::Layer src = HeadsOf(*range, h, 1);
      for (int r = 0; r < bs; ++r) EnterRow(src, r, h, 1, pos[b * bs + r], kd, vd, r);
      stats->fetch_seconds += Since(t0);
      stats->fetched_bytes += bs * HeadRowBytes();
    }
  }

  // The selection of each KV head, compacted into stage_: head h's i-th selected slot
  // becomes slot i of the view. The KV heads are staged in parallel on the pool (each
  // writes its own rows of stage_ and counts in its own stats; fetch_seconds is then a
  // sum over threads).
  void StageSelection(int layer, const kv::Visibility& vis) {
    const int n_kv = ks_.n_kv_heads, bs = ks_.block_size;
    int m = 0;
    for (int h = 0; h < n_kv; ++h) m = std::max(m, vis.n_head_indices[h]);
    const int n_blocks = std::max(1, (m + bs - 1) / bs);
    const int64_t klb = ks_.k_layer_bytes(), vlb = ks_.v_layer_bytes();
    stage_.Reserve(n_blocks, klb, vlb);
    NoteBuffer();
    const auto& table = seq_->block_table();
    const auto& pos = seq_->positions();
    const auto* kp = reinterpret_cast<const uint8_t*>(seq_->pool()->k_data(layer));
    const auto* vp = reinterpret_cast<const uint8_t*>(seq_->pool()->v_data(layer));
    std::vector<OffloadStats> per_head(static_cast<size_t>(n_kv));
    pool_.ParallelFor(n_kv, [&](int64_t hh, int) {
      const int h = static_cast<int>(hh);
      OffloadStats* stats = &per_head[h];
      const std::vector<int32_t>& sel = inner_->last_selection(layer, h);
      UpdateCache(layer, h, sel, nullptr, stats);
      const auto& where = cache_where_[layer][h];
      std::vector<int32_t>& out = compact_[h];
      out.clear();
      int i = 0;
      StatusOr<store::ByteRange> fetched = store::ByteRange();
      std::optional<TierRows::Layer> src;  // the fetched block's rows of head h (none: its read failed)
      int fetched_block = -1;
      for (size_t j = 0; j < sel.size(); ++j) {
        const int32_t s = sel[j], b = s / bs;
        uint8_t* kd = stage_.k.as<uint8_t>() + (i / bs) * klb;  // row i % bs of this block
        uint8_t* vd = stage_.v.as<uint8_t>() + (i / bs) * vlb;
        if (table[b] != kv::SequenceKv::kNoBlock || where.count(b) != 0) {
          const int64_t p = table[b] != kv::SequenceKv::kNoBlock ? table[b] : cache_phys_[where.at(b)];
          CopyRows(ks_.k_dtype, kp + p * klb, s % bs, kd, i % bs, h, 1);
          CopyRows(ks_.v_dtype, vp + p * vlb, s % bs, vd, i % bs, h, 1);
        } else {
          if (b != fetched_block) {
            fetched = ReadLayer(layer, b, stats);
            fetched_block = b;
            src.reset();
            if (fetched.ok()) src.emplace(HeadsOf(*fetched, h, 1));
          }
          if (!src) continue;  // left out of this step (logged)
          const auto t0 = std::chrono::steady_clock::now();
          EnterRow(*src, s % bs, h, 1, pos[s], kd, vd, i % bs);
          stats->fetch_seconds += Since(t0);
          stats->fetched_bytes += HeadRowBytes();
        }
        out.push_back(i++);
      }
      compact_ptrs_[h] = out.data();
      compact_lens_[h] = static_cast<int32_t>(out.size());
    });
    for (const OffloadStats& t : per_head) AddReadCounts(t);
    SetView(stage_, std::max(1, m));
  }

  // After a step's last layer: complete blocks go to the tier, and the ones outside the
  // first block and the next step's local window leave the compute buffer.
  void EndStep() {
    const int bs = ks_.block_size, kvd = ks_.kv_dim();
    const int pend = static_cast<int>(pend_k_[0].size() / kvd);
    for (int l = 1; l < n_layers_; ++l) ATTIC_CHECK(static_cast<int>(pend_k_[l].size() / kvd) == pend);
    const int full_blocks = pend / bs;
    for (int i = 0; i < full_blocks; ++i) {
      const int b = flushed_ / bs;
      // Written once (each layer encoded in the tier's type), into a store buffer a DRAM
      // tier keeps as it is (PutShared).
      std::unique_ptr<store::Bytes> value =
          store::Bytes::Allocate(static_cast<size_t>(n_layers_) * static_cast<size_t>(LayerRangeBytes()));
      for (int l = 0; l < n_layers_; ++l) {
        const int64_t first = static_cast<int64_t>(i) * bs * kvd;
        tier_.Encode(pend_k_[l].data() + first, pend_v_[l].data() + first,
                     reinterpret_cast<uint8_t*>(value->data()) + l * LayerRangeBytes());
      }
      if (static_cast<int>(in_tier_.size()) <= b) in_tier_.resize(b + 1, false);
      const int64_t value_bytes = static_cast<int64_t>(value->size());
      const Status st = backing_->PutShared(Key(b), std::move(value));
      if (st.ok()) {
        in_tier_[b] = true;
        stats_.backing_bytes += value_bytes;
      } else {
        ++stats_.backing_errors;
        Log(LogLevel::kWarn, "sparse offload: writing block %d: %s (it stays resident)", b, st.ToString().c_str());
      }
      flushed_ += bs;
    }
    for (int l = 0; l < n_layers_; ++l) {
      pend_k_[l].erase(pend_k_[l].begin(), pend_k_[l].begin() + static_cast<int64_t>(full_blocks) * bs * kvd);
      pend_v_[l].erase(pend_v_[l].begin(), pend_v_[l].begin() + static_cast<int64_t>(full_blocks) * bs * kvd);
    }
    const int n = seq_->n_slots();
    const SparseOptions& o = inner_->options();
    if (n + 1 >= o.min_slots && o.method != SparseMethod::kFull) {
      // Keep the next step's local window, and the block before it (slots leaving the
      // window are coded from the compute buffer).
      const int keep_from = std::max(0, n + 1 - SplitBudget(o, n + 1).local - bs);
      for (int b = 1; b < static_cast<int>(in_tier_.size()) && (b + 1) * bs <= keep_from; ++b) {
        if (in_tier_[b] && seq_->resident(b)) {
          seq_->ReleaseBlock(b);
          ++stats_.offloaded_blocks;
        }
      }
    }
    // The whole-layer staging buffer is kept only while steps use it.
    if (stats_.full_stagings == last_full_stagings_) full_.Free();
    last_full_stagings_ = stats_.full_stagings;
    NoteBuffer();
  }

  void NoteBuffer() {
    stats_.buffer_bytes = static_cast<int64_t>(seq_->n_resident_blocks() + cache_phys_.size()) * ks_.block_bytes() +
                          static_cast<int64_t>(full_.k_bytes + full_.v_bytes + stage_.k_bytes + stage_.v_bytes);
    stats_.peak_buffer_bytes = std::max(stats_.peak_buffer_bytes, stats_.buffer_bytes);
  }

  std::unique_ptr<SparseAttention> inner_;
  OffloadOptions opt_;
  kv::SequenceKv* seq_;
  const attention::RopeTable& rope_;
  store::Tier* backing_;
  int n_layers_;
  backend::ThreadPool& pool_;
  kv::KvShape ks_;
  TierRows tier_;  // the layout of one layer of a block in the tier
  std::string prefix_;
  std::vector<int32_t> cache_phys_;  // the cache's pool blocks: index i holds, per (layer, head), one cached block
  OffloadStats stats_;

  std::vector<std::vector<float>> pend_k_, pend_v_;  // [layer]: rows of slots [flushed_, ...), pre-RoPE
  int flushed_ = 0;                                  // slots [0, flushed_) were written (whole blocks)
  std::vector<bool> in_tier_;                        // [block]

  std::vector<std::vector<BlockCache>> caches_;                             // [layer][kv_head]
  std::vector<std::vector<std::unordered_map<int32_t, int>>> cache_where_;  // [layer][kv_head]: block -> cache index
  std::vector<std::vector<std::vector<int>>> cache_free_;                   // [layer][kv_head]: free cache indices

  LayerBuffer full_, stage_;
  int64_t last_full_stagings_ = 0;
  attention::KvLayerView view_;
  std::vector<std::vector<int32_t>> released_sel_;  // [kv_head]: UpdateCache's scratch
  std::vector<int32_t> failed_blocks_;  // StageAll's blocks that could not be read
  std::vector<int32_t> visible_;
  std::vector<std::vector<int32_t>> compact_;
  std::vector<const int32_t*> compact_ptrs_;
  std::vector<int32_t> compact_lens_;
};

}  // namespace

int OffloadWorkingBlocks(const SparseOptions& options, int block_size, int max_slots, int chunk_tokens) {
  auto blocks = [block_size](int64_t slots) { return static_cast<int>((slots + block_size - 1) / block_size); };
  const int chunk = blocks(chunk_tokens) + 1;  // a chunk may straddle a block boundary
  const int below = blocks(std::min(options.min_slots, max_slots)) + chunk;
  const int tail = 3 + blocks(SplitBudget(options, max_slots).local) + chunk;
  return std::min(blocks(max_slots), std::max(below, tail));
}

int64_t OffloadTierBytes(const kv::KvShape& shape, int n_slots, store::KvDtype dtype) {
  return static_cast<int64_t>((n_slots + shape.block_size - 1) / shape.block_size) * BlockValueBytes(shape, dtype);
}

StatusOr<std::unique_ptr<OffloadedSparseAttention>> MakeOffloadedSparseAttention(
    std::unique_ptr<SparseAttention> inner, const OffloadOptions& options, kv::SequenceKv* seq,
    const attention::RopeTable& rope, store::Tier* backing, int n_layers, backend::ThreadPool& pool) {
  if (inner == nullptr || seq == nullptr || backing == nullptr) return InvalidArgumentError("sparse offload: missing part");
  const SparseMethod m = inner->options().method;
  if (m != SparseMethod::kPq && m != SparseMethod::kStreaming) {
    return InvalidArgumentError(std::string("sparse offload needs method pq or streaming (") + SparseMethodName(m) +
                                " reads every key at every step)");
  }
  if (options.cache_blocks < 0) return InvalidArgumentError("sparse offload: cache_blocks must be >= 0");
  const kv::KvShape& shape = seq->pool()->shape();
  if (!TierRows::Supports(options.tier_dtype, shape.head_dim, shape.kv_dim())) {
    return InvalidArgumentError(std::string("sparse offload: a tier of type ") + store::KvDtypeName(options.tier_dtype) +
                                " cannot hold rows of head_dim " + std::to_string(shape.head_dim));
  }
  if (seq->n_slots() != 0) return FailedPreconditionError("sparse offload: the sequence must start empty");
  std::vector<int32_t> cache_phys;
  for (int i = 0; i < options.cache_blocks; ++i) {
    auto p = seq->pool()->Allocate();
    if (!p.ok()) {
      for (int32_t b : cache_phys) seq->pool()->Free(b);
      return ResourceExhaustedError("sparse offload: the compute buffer has no room for a block cache of " +
                                    std::to_string(options.cache_blocks) + " blocks");
    }
    cache_phys.push_back(*p);
  }
  return std::unique_ptr<OffloadedSparseAttention>(
      new Offloaded(std::move(inner), options, seq, rope, backing, n_layers, pool, std::move(cache_phys)));
}

}  // namespace attic::pq
