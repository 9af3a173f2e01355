// What the selectors of sparse.h share: the decode-step test, the lists handed to the
// attention, stats, reading K through a layer's view, and a top-k.
//
// Thread-safety: as SparseAttention (one step at a time).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "attic/pq/sparse.h"

namespace attic::pq::internal {

// Seconds since t0 (the selectors' and offload's timers).
inline double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// K rows of one layer as attention reads them (RoPE applied), f32 or f16 storage.
class KeyReader {
 public:
  KeyReader(const attention::KvLayerView& kv, int head_dim) : kv_(kv), head_dim_(head_dim) {}
  // Slot s's K of KV head h: a pointer into the pool (f32), or `buf` filled (f16).
  const float* Row(int h, int s, float* buf) const;
  // Slots [begin, end) of KV head h into out: [end - begin, head_dim].
  void Gather(int h, int begin, int end, float* out) const;

 private:
  const attention::KvLayerView& kv_;
  int head_dim_;
};

// Eight independent partial sums: the compiler may keep them in vector lanes (one
// running sum would have to be added in order).
inline float Dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The indices of the k largest of scores[0, n) (ties: the lower index; NaN lowest),
// ascending, each plus `offset`, appended to out: pq::TopK's contract, by bucket
// selection (several times faster on PQ scores' many ties).
void TopKAppend(const float* scores, int64_t n, int64_t k, int32_t offset, std::vector<int32_t>* out);

// The decode-step logic every selector shares (sparse.h): a one-row appending step over
// >= min_slots slots gets, per KV head, initial + SelectTop's choice + local.
class SelectorBase : public SparseAttention {
 public:
  SelectorBase(const SparseOptions& options, const attention::AttentionShape& shape, int n_layers,
               backend::ThreadPool& pool);

  const SparseOptions& options() const override { return options_; }
  const SparseStats& stats() const override { return stats_; }
  const std::vector<int32_t>& last_selection(int layer, int kv_head) const override {
    return lists_[layer][kv_head];
  }
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) final;
  void set_prefill_seconds(double seconds) final { given_prefill_seconds_ = seconds; }

 protected:
  // A step that attends in full (several rows; or one row below min_slots): the rows see
  // what vis presets (kv_end).
  virtual void OnFullStep(int layer, const kv::EntryRows& rows, const kv::Visibility& vis) {}
  // Sets (*top)[h] for every KV head h: at most b.top slots of [b.initial, n_slots - b.local),
  // ascending. (*top)[h] arrives empty.
  virtual void SelectTop(int layer, const kv::Visibility& vis, const Budget& b,
                         std::vector<std::vector<int32_t>>* top) = 0;
  // After the lists (last_selection) of this layer were set for the decode row.
  virtual void AfterSelect(int layer, const kv::Visibility& vis) {}

  // Seconds from the first BeforeAttention of a multi-row step to the first sparse step
  // (set at layer 0 of that step), or what set_prefill_seconds gave; nullopt when
  // neither.
  std::optional<double> prefill_seconds() const { return prefill_seconds_; }
  int group() const { return shape_.n_heads / shape_.n_kv_heads; }

  SparseOptions options_;
  attention::AttentionShape shape_;
  int n_layers_;
  backend::ThreadPool& pool_;
  SparseStats stats_;

 private:
  std::vector<std::vector<std::vector<int32_t>>> lists_;  // [layer][kv_head] ascending slots
  std::vector<std::vector<const int32_t*>> list_ptrs_;    // [layer][kv_head]
  std::vector<std::vector<int32_t>> list_lens_;           // [layer][kv_head]
  std::vector<std::vector<int32_t>> top_;                 // [kv_head] scratch
  std::optional<std::chrono::steady_clock::time_point> first_multi_row_;
  std::optional<double> prefill_seconds_;
  std::optional<double> given_prefill_seconds_;  // set_prefill_seconds
  bool any_sparse_ = false;
};

std::unique_ptr<SparseAttention> MakeWindowSelector(const SparseOptions& o, const attention::AttentionShape& shape,
                                                    int n_layers, backend::ThreadPool& pool);
std::unique_ptr<SparseAttention> MakeOracleSelector(const SparseOptions& o, const attention::AttentionShape& shape,
                                                    int n_layers, backend::ThreadPool& pool);
std::unique_ptr<SparseAttention> MakeH2oSelector(const SparseOptions& o, const attention::AttentionShape& shape,
                                                 int n_layers, backend::ThreadPool& pool);
std::unique_ptr<SparseAttention> MakePqSelector(const SparseOptions& o, const attention::AttentionShape& shape,
                                                int n_layers, backend::ThreadPool& pool);

}  // namespace attic::pq::internal
