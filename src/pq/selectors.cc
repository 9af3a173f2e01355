// The decode-step logic shared by every selector, and the selectors without a codebook:
// full and streaming (windows only), oracle (exact q . k), h2o (accumulated attention).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "attic/attention/kv_q4.h"
#include "attic/attention/kv_q8.h"
#include "attic/backend/convert.h"
#include "pq/sparse_internal.h"

namespace attic::pq::internal {

const float* KeyReader::Row(int h, int s, float* buf) const {
  const int64_t block = kv_.block_table[s / kv_.block_size] * kv_.block_stride;
  const int64_t in_block = (static_cast<int64_t>(h) * kv_.block_size + s % kv_.block_size) * head_dim_;
  const int64_t off = block + in_block;
  if (kv_.k_pool != nullptr) return kv_.k_pool + off;
  if (kv_.k_q8 != nullptr) {  // off counts bytes: the row's int8 values, its scales after the block's values
    const int64_t scales = block + attention::KvQ8ScaleAt(kv_.q8_scales, in_block, head_dim_);
    attention::DequantizeKvRowQ8(kv_.k_q8 + off, reinterpret_cast<const uint16_t*>(kv_.k_q8 + scales), head_dim_,
                                 buf);
    return buf;
  }
  if (kv_.k_q4 != nullptr) {  // as q8_0's, with half a byte per value
    const int64_t scales = block + attention::KvQ8ScaleAt(kv_.q8_scales, in_block, head_dim_);
    attention::DequantizeKvRowQ4(kv_.k_q4 + block + in_block / 2, kv_.k_q4 + scales, head_dim_, buf);
    return buf;
  }
  backend::ConvertF16ToF32(kv_.k_f16 + off, buf, head_dim_);
  return buf;
}

void KeyReader::Gather(int h, int begin, int end, float* out) const {
  for (int s = begin; s < end; ++s) {
    float* dst = out + static_cast<int64_t>(s - begin) * head_dim_;
    const float* row = Row(h, s, dst);
    if (row != dst) std::copy(row, row + head_dim_, dst);
  }
}

namespace {

// Order-preserving map of a float to an unsigned key (NaN ranks as -infinity).
inline uint32_t OrderKey(float f) {
  if (std::isnan(f)) return 0x007FFFFFu;  // OrderKey(-infinity)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace

// Bucket selection: the scores' range is cut into 2,048 equal buckets (a monotone map,
// so equal scores share a bucket); one pass counts them and finds the bucket that holds
// the k-th largest, a second takes every index above it and collects the bucket's; only
// those are ordered exactly. PQ scores take few distinct values (m=2, 6 bits: 4,096),
// and comparison-based selection (nth_element) is slow on their ties.
void TopKAppend(const float* scores, int64_t n, int64_t k, int32_t offset, std::vector<int32_t>* out) {
  if (k <= 0 || n <= 0) return;
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) out->push_back(static_cast<int32_t>(offset + i));
    return;
  }
  constexpr int kBuckets = 2048;
  double lo = INFINITY, hi = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(scores[i])) continue;
    lo = std::min<double>(lo, scores[i]);
    hi = std::max<double>(hi, scores[i]);
  }
  const bool linear = hi > lo && std::isfinite(hi - lo);
  const double scale = linear ? (kBuckets - 0.5) / (hi - lo) : 0;
  // Without a finite range the float's order bits decide (NaN as -infinity).
  auto bucket_of = [&](float f) -> int { return static_cast<int>(OrderKey(f) >> 21); };
  thread_local std::vector<int64_t> hist;
  thread_local std::vector<int32_t> above, bucket;
  thread_local std::vector<uint16_t> keys;
  hist.assign(linear ? kBuckets : 1 << 11, 0);
  keys.resize(static_cast<size_t>(n));
  if (linear) {
    const float flo = static_cast<float>(lo), fscale = static_cast<float>(scale);
    for (int64_t i = 0; i < n; ++i) {
      // NaN fails both comparisons: bucket 0, with -infinity's rank below.
      const float x = (scores[i] - flo) * fscale;
      keys[i] = static_cast<uint16_t>(x > 0 ? (x < kBuckets - 1 ? static_cast<int>(x) : kBuckets - 1) : 0);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<uint16_t>(bucket_of(scores[i]));
  }
  for (int64_t i = 0; i < n; ++i) ++hist[keys[i]];
  int64_t n_above = 0;
  int b = static_cast<int>(hist.size()) - 1;
  while (n_above + hist[b] < k) n_above += hist[b--];
  const int64_t need = k - n_above;  // taken from bucket b, 1 <= need <= hist[b]
  above.clear();
  bucket.clear();
  for (int64_t i = 0; i < n; ++i) {
    const int key = keys[i];
    if (key > b) above.push_back(static_cast<int32_t>(i));
    else if (key == b) bucket.push_back(static_cast<int32_t>(i));
  }
  if (need < static_cast<int64_t>(bucket.size())) {
    auto before = [&](int32_t x, int32_t y) {
      const uint32_t kx = OrderKey(scores[x]), ky = OrderKey(scores[y]);
      return kx > ky || (kx == ky && x < y);
    };
    std::nth_element(bucket.begin(), bucket.begin() + need, bucket.end(), before);
    bucket.resize(static_cast<size_t>(need));
    std::sort(bucket.begin(), bucket.end());
  }
  const size_t start = out->size();
  out->resize(start + above.size() + bucket.size());
  std::merge(above.begin(), above.end(), bucket.begin(), bucket.end(), out->begin() + static_cast<std::ptrdiff_t>(start));
  for (size_t i = start; i < out->size(); ++i) (*out)[i] += offset;
}

SelectorBase::SelectorBase(const SparseOptions& options, const attention::AttentionShape& shape, int n_layers,
                           backend::ThreadPool& pool)
    : options_(options), shape_(shape), n_layers_(n_layers), pool_(pool) {
  lists_.assign(n_layers, std::vector<std::vector<int32_t>>(shape.n_kv_heads));
  list_ptrs_.assign(n_layers, std::vector<const int32_t*>(shape.n_kv_heads, nullptr));
  list_lens_.assign(n_layers, std::vector<int32_t>(shape.n_kv_heads, 0));
  top_.resize(shape.n_kv_heads);
}

void SelectorBase::BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) {
  ATTIC_CHECK(layer >= 0 && layer < n_layers_);
  const int n = vis->n_slots;
  const bool decode = rows.n_rows == 1 && rows.slots[0] == n - 1;
  if (rows.n_rows > 1 && !first_multi_row_) first_multi_row_ = std::chrono::steady_clock::now();
  if (!decode || options_.method == SparseMethod::kFull || n < options_.min_slots) {
    if (decode && layer == 0) ++stats_.full_steps;
    OnFullStep(layer, rows, *vis);
    return;
  }
  if (layer == 0) {
    ++stats_.sparse_steps;
    if (!any_sparse_) {
      if (given_prefill_seconds_) {
        prefill_seconds_ = given_prefill_seconds_;
      } else if (first_multi_row_) {
        prefill_seconds_ = Since(*first_multi_row_);
      }
    }
    any_sparse_ = true;
  }
  const Budget b = SplitBudget(options_, n);
  for (auto& t : top_) t.clear();
  const auto t0 = std::chrono::steady_clock::now();
  SelectTop(layer, *vis, b, &top_);
  stats_.select_seconds += Since(t0);
  for (int h = 0; h < shape_.n_kv_heads; ++h) {
    std::vector<int32_t>& list = lists_[layer][h];
    list.clear();
    list.reserve(static_cast<size_t>(b.initial + b.local) + top_[h].size());
    for (int s = 0; s < b.initial; ++s) list.push_back(s);
    list.insert(list.end(), top_[h].begin(), top_[h].end());
    for (int s = n - b.local; s < n; ++s) list.push_back(s);
    list_ptrs_[layer][h] = list.data();
    list_lens_[layer][h] = static_cast<int32_t>(list.size());
    stats_.attended_slots += static_cast<int64_t>(list.size());
    stats_.context_slots += n;
  }
  vis->indices = nullptr;
  vis->n_indices = 0;
  vis->head_indices = list_ptrs_[layer].data();
  vis->n_head_indices = list_lens_[layer].data();
  AfterSelect(layer, *vis);
}

namespace {

// full: every slot (the hooks change nothing); streaming: initial + local only
// (SplitBudget gives streaming no top).
class WindowSelector : public SelectorBase {
 public:
  using SelectorBase::SelectorBase;

 protected:
  void SelectTop(int, const kv::Visibility&, const Budget&, std::vector<std::vector<int32_t>>*) override {}
};

// oracle: exact q . k of every middle slot, combined over the group's query heads.
class OracleSelector : public SelectorBase {
 public:
  OracleSelector(const SparseOptions& o, const attention::AttentionShape& shape, int n_layers, backend::ThreadPool& pool)
      : SelectorBase(o, shape, n_layers, pool),
        row_buf_(static_cast<size_t>(pool.n_threads()) * shape.head_dim) {}

 protected:
  void SelectTop(int layer, const kv::Visibility& vis, const Budget& b,
                 std::vector<std::vector<int32_t>>* top) override {
    const int first = b.initial, n_mid = vis.n_slots - b.local - b.initial;
    if (b.top <= 0 || n_mid <= 0) return;
    const int hd = shape_.head_dim, g = group(), n_kv = shape_.n_kv_heads;
    if (b.top >= n_mid) {
      for (int h = 0; h < n_kv; ++h)
        for (int s = 0; s < n_mid; ++s) (*top)[h].push_back(first + s);
      return;
    }
    scores_.resize(static_cast<size_t>(n_kv) * n_mid);
    const KeyReader keys(*vis.kv, hd);
    constexpr int kChunk = 2048;
    const int n_chunks = (n_mid + kChunk - 1) / kChunk;
    const bool sum = options_.combine == GqaCombine::kSum;
    pool_.ParallelFor(static_cast<int64_t>(n_kv) * n_chunks, [&](int64_t task, int thread) {
      const int h = static_cast<int>(task / n_chunks);
      const int c0 = static_cast<int>(task % n_chunks) * kChunk, c1 = std::min(n_mid, c0 + kChunk);
      float* buf = row_buf_.data() + static_cast<size_t>(thread) * hd;
      float* out = scores_.data() + static_cast<size_t>(h) * n_mid;
      const float* q = vis.q + static_cast<int64_t>(h) * g * hd;  // the group's query heads
      for (int i = c0; i < c1; ++i) {
        const float* k = keys.Row(h, first + i, buf);
        float s = Dot(q, k, hd);
        for (int j = 1; j < g; ++j) {
          const float d = Dot(q + static_cast<int64_t>(j) * hd, k, hd);
          s = sum ? s + d : std::max(s, d);
        }
        out[i] = s;
      }
    });
    pool_.ParallelFor(n_kv, [&](int64_t h, int) {
      TopKAppend(scores_.data() + h * n_mid, n_mid, b.top, first, &(*top)[h]);
    });
  }

 private:
  std::vector<float> scores_;   // [n_kv_heads, n_mid]
  std::vector<float> row_buf_;  // [n_threads, head_dim]: f16 rows widened
};

// h2o: per layer and KV head, every slot's attention probability summed over the
// group's query heads and every query so far; a decode step keeps the `top` heaviest
// middle slots still kept and drops the rest for good. The decode query's probabilities
// (over what it attended) are added after its selection.
class H2oSelector : public SelectorBase {
 public:
  H2oSelector(const SparseOptions& o, const attention::AttentionShape& shape, int n_layers, backend::ThreadPool& pool)
      : SelectorBase(o, shape, n_layers, pool),
        heads_(n_layers, std::vector<Head>(shape.n_kv_heads)),
        scratch_(pool.n_threads()) {}

 protected:
  void OnFullStep(int layer, const kv::EntryRows& rows, const kv::Visibility& vis) override {
    Grow(layer, vis.n_slots);
    const KeyReader keys(*vis.kv, shape_.head_dim);
    const int64_t q_stride = static_cast<int64_t>(shape_.n_heads) * shape_.head_dim;
    pool_.ParallelFor(shape_.n_kv_heads, [&](int64_t h, int thread) {
      for (int i = 0; i < rows.n_rows; ++i) {
        Accumulate(layer, static_cast<int>(h), vis.q + i * q_stride, keys, nullptr, vis.kv_end[i], thread);
      }
    });
  }

  void SelectTop(int layer, const kv::Visibility& vis, const Budget& b,
                 std::vector<std::vector<int32_t>>* top) override {
    Grow(layer, vis.n_slots);
    const int first = b.initial, end = vis.n_slots - b.local;
    pool_.ParallelFor(shape_.n_kv_heads, [&](int64_t h, int) {
      Head& head = heads_[layer][h];
      std::vector<int32_t>& kept = (*top)[h];
      for (int s = first; s < end; ++s)
        if (!head.dropped[s]) kept.push_back(s);
      if (static_cast<int>(kept.size()) <= b.top) return;
      auto before = [&](int32_t a, int32_t c) {
        return head.acc[a] > head.acc[c] || (head.acc[a] == head.acc[c] && a < c);
      };
      std::nth_element(kept.begin(), kept.begin() + b.top, kept.end(), before);
      for (size_t i = static_cast<size_t>(b.top); i < kept.size(); ++i) head.dropped[kept[i]] = 1;
      kept.resize(static_cast<size_t>(b.top));
      std::sort(kept.begin(), kept.end());
    });
  }

  void AfterSelect(int layer, const kv::Visibility& vis) override {
    const KeyReader keys(*vis.kv, shape_.head_dim);
    pool_.ParallelFor(shape_.n_kv_heads, [&](int64_t h, int thread) {
      const std::vector<int32_t>& list = last_selection(layer, static_cast<int>(h));
      Accumulate(layer, static_cast<int>(h), vis.q, keys, list.data(), static_cast<int>(list.size()), thread);
    });
  }

 private:
  struct Head {
    std::vector<double> acc;       // [n_slots] accumulated attention
    std::vector<uint8_t> dropped;  // [n_slots] 1: never attended again at a decode step
  };

  void Grow(int layer, int n_slots) {
    for (Head& h : heads_[layer]) {
      if (static_cast<int>(h.acc.size()) < n_slots) {
        h.acc.resize(static_cast<size_t>(n_slots), 0.0);
        h.dropped.resize(static_cast<size_t>(n_slots), 0);
      }
    }
  }

  // Adds one query row's softmax probabilities (each query head of KV head h's group)
  // over slots `list[0, n)` or, with list == nullptr, slots [0, n).
  void Accumulate(int layer, int h, const float* q_row, const KeyReader& keys, const int32_t* list, int n,
                  int thread) {
    if (n <= 0) return;
    const int hd = shape_.head_dim;
    std::vector<double>& logit = scratch_[thread].logit;
    std::vector<float>& buf = scratch_[thread].row;
    logit.resize(static_cast<size_t>(n));
    buf.resize(static_cast<size_t>(hd));
    std::vector<double>& acc = heads_[layer][h].acc;
    for (int j = 0; j < group(); ++j) {
      const float* q = q_row + (static_cast<int64_t>(h) * group() + j) * hd;
      double mx = -INFINITY;
      for (int i = 0; i < n; ++i) {
        const float* k = keys.Row(h, list ? list[i] : i, buf.data());
        double d = 0;
        for (int t = 0; t < hd; ++t) d += static_cast<double>(q[t]) * k[t];
        logit[i] = d * shape_.scale;
        mx = std::max(mx, logit[i]);
      }
      double z = 0;
      for (int i = 0; i < n; ++i) z += (logit[i] = std::exp(logit[i] - mx));
      for (int i = 0; i < n; ++i) acc[list ? list[i] : i] += logit[i] / z;
    }
  }

  struct Scratch {
    std::vector<double> logit;
    std::vector<float> row;
  };
  std::vector<std::vector<Head>> heads_;  // [layer][kv_head]
  std::vector<Scratch> scratch_;          // [thread]
};

}  // namespace

std::unique_ptr<SparseAttention> MakeWindowSelector(const SparseOptions& o, const attention::AttentionShape& shape,
                                                    int n_layers, backend::ThreadPool& pool) {
  return std::make_unique<WindowSelector>(o, shape, n_layers, pool);
}

std::unique_ptr<SparseAttention> MakeOracleSelector(const SparseOptions& o, const attention::AttentionShape& shape,
                                                    int n_layers, backend::ThreadPool& pool) {
  return std::make_unique<OracleSelector>(o, shape, n_layers, pool);
}

std::unique_ptr<SparseAttention> MakeH2oSelector(const SparseOptions& o, const attention::AttentionShape& shape,
                                                 int n_layers, backend::ThreadPool& pool) {
  return std::make_unique<H2oSelector>(o, shape, n_layers, pool);
}

}  // namespace attic::pq::internal
