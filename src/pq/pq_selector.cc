// pq: PQCache's selector (paper 004, section 3). The first sparse step that meets a
// layer trains one codebook per KV head on the layer's keys of slots [0, n_slots - 1)
// (the prompt: what prefill produced) and codes slots [0, n_slots - local); later steps
// code each slot as it leaves the local window (nearest centroid). Every step ranks
// the coded middle slots by their PQ scores from q . centroid tables (codebook.h:
// TopKByCodes, which never scores key by key when the code tuples are few) and takes
// the top.
//
// K-means iterations (section 3.3): fixed (options.fixed_iterations) or adaptive: the
// prefill the hooks saw (first multi-row BeforeAttention to the first sparse step) times
// cluster_share is the clustering budget, split evenly over the layers; the first layer
// clustered runs kCalibrationIterations, and the wall time of its training (the KV heads
// in parallel on the pool, gathers and faiss's fixed costs included, so the estimate
// errs towards fewer iterations) over the work done gives the cost of one key, one
// sub-space and one iteration; AdaptiveIterations picks the count for the others. stats().iterations is the count of the last layer clustered. A
// sequence whose KV came from a store (no multi-row step through the hooks) has no
// prefill time to share: it uses kNoPrefillIterations.
//
// An imported index (ImportIndex; pq_index.h) replaces the clustering of every layer it
// built: at the layer's first sparse step its codebooks are taken as they are and the
// slots past its codes that have left the local window are coded (nearest centroid).
// Codes it holds for slots still inside the window stay (same keys: the index is only
// imported for slots reused as they were).
#include <algorithm>
#include <cmath>

#include "pq/sparse_internal.h"

namespace attic::pq::internal {

namespace {

constexpr int kCalibrationIterations = 2;
constexpr int kNoPrefillIterations = 6;
// Keys per KV head from which a layer's per-head work goes to the pool: below it the
// step's thread does it alone (waking the pool costs more than it saves, and far more
// when the cores are shared with other processes). At 8k slots (~6.5k middle keys per
// head) the pool already pays: sparse_bench tpot's selection column, 2 threads, AMD EPYC
// Zen 3, went from 2.4-3.5 to 1.7-2.7 ms a step with 4,096 instead of 16,384.
constexpr int64_t kParallelKeys = 4096;

class PqSelector : public SelectorBase {
 public:
  PqSelector(const SparseOptions& o, const attention::AttentionShape& shape, int n_layers, backend::ThreadPool& pool)
      : SelectorBase(o, shape, n_layers, pool),
        layers_(static_cast<size_t>(n_layers)),
        tables_(static_cast<size_t>(shape.n_heads)) {}

  const PqCodebook* codebook(int layer, int kv_head) const override {
    const Layer& l = layers_[layer];
    return l.books.empty() ? nullptr : &l.books[kv_head];
  }
  const std::vector<uint8_t>* codes(int layer, int kv_head) const override {
    const Layer& l = layers_[layer];
    return l.codes.empty() ? nullptr : &l.codes[kv_head];
  }

  std::optional<PqIndex> ExportIndex() const override {
    PqIndex index;
    index.m = options_.pq.m;
    index.bits = options_.pq.bits;
    index.head_dim = shape_.head_dim;
    index.n_kv_heads = shape_.n_kv_heads;
    index.layers.resize(layers_.size());
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      if (l.books.empty()) continue;
      PqIndex::Layer& out = index.layers[i];
      out.built = true;
      out.n_coded = l.n_coded;
      out.books = l.books;
      out.codes = l.codes;
      for (auto& c : out.codes) c.resize(static_cast<size_t>(l.n_coded) * index.m);
    }
    if (!index.any_built()) return std::nullopt;
    return index;
  }

  Status ImportIndex(PqIndex index) override {
    if (stats_.sparse_steps + stats_.full_steps > 0 ||
        std::any_of(layers_.begin(), layers_.end(), [](const Layer& l) { return !l.books.empty(); }))
      return FailedPreconditionError("sparse: a PQ index is imported before the first step");
    if (index.m != options_.pq.m || index.bits != options_.pq.bits || index.head_dim != shape_.head_dim ||
        index.n_kv_heads != shape_.n_kv_heads || index.n_layers() != n_layers_)
      return InvalidArgumentError("sparse: the PQ index was built with other options or for another shape");
    for (const PqIndex::Layer& l : index.layers) {
      if (!l.built) continue;
      bool ok = l.n_coded >= 0 && static_cast<int>(l.books.size()) == shape_.n_kv_heads &&
                static_cast<int>(l.codes.size()) == shape_.n_kv_heads;
      for (int h = 0; ok && h < shape_.n_kv_heads; ++h)
        ok = l.books[h].m() == index.m && l.books[h].bits() == index.bits && l.books[h].head_dim() == index.head_dim &&
             l.codes[h].size() == static_cast<size_t>(l.n_coded) * index.m;
      if (!ok) return InvalidArgumentError("sparse: the PQ index's layers are inconsistent");
    }
    imported_ = std::move(index);
    return OkStatus();
  }

 protected:
  void SelectTop(int layer, const kv::Visibility& vis, const Budget& b,
                 std::vector<std::vector<int32_t>>* top) override {
    Layer& l = layers_[layer];
    const int n = vis.n_slots, end = n - b.local;
    if (l.books.empty() && layer < imported_.n_layers() && imported_.layers[layer].built) {
      TakeImported(layer, n);
      stats_.imported_keys += static_cast<int64_t>(l.n_coded) * shape_.n_kv_heads;
      ++stats_.imported_layers;
    }
    if (l.books.empty()) {
      Train(layer, vis);
      Encode(layer, vis, 0, std::max(0, end));
    } else if (l.n_coded < end) {
      stats_.encoded_keys += static_cast<int64_t>(end - l.n_coded) * shape_.n_kv_heads;
      Encode(layer, vis, l.n_coded, end);
    }
    const int first = b.initial, n_mid = std::min(end, l.n_coded) - first;
    if (b.top <= 0 || n_mid <= 0) return;
    const int n_kv = shape_.n_kv_heads;
    if (b.top >= n_mid) {
      for (int h = 0; h < n_kv; ++h)
        for (int s = 0; s < n_mid; ++s) (*top)[h].push_back(first + s);
      return;
    }
    const int g = group(), hd = shape_.head_dim, m = options_.pq.m;
    const bool sum = options_.combine == GqaCombine::kSum;
    const size_t table_size = static_cast<size_t>(m) << options_.pq.bits;
    // Per KV head (on the pool from kParallelKeys keys): its q . centroid table(s) -- sum: one, the group's query
    // heads added; max: one per query head -- then its top from the codes alone
    // (TopKByCodes: the code tuples' scores tabulated and counted, no per-key scores).
    ForEachHead(n_mid, [&](int64_t h) {
      const PqCodebook& book = l.books[h];
      const int n_t = sum ? 1 : g;
      std::vector<const float*> tables(n_t);
      for (int j = 0; j < n_t; ++j) {
        std::vector<float>& table = tables_[sum ? h : h * g + j];
        table.assign(table_size, 0.f);
        if (sum) {
          for (int q = 0; q < g; ++q) book.AddQueryTable(vis.q + (h * g + q) * hd, 1.f, table.data());
        } else {
          book.AddQueryTable(vis.q + (h * g + j) * hd, 1.f, table.data());
        }
        tables[j] = table.data();
      }
      const uint8_t* codes = l.codes[h].data() + static_cast<int64_t>(first) * m;
      book.TopKByCodes(tables.data(), n_t, codes, n_mid, b.top, first, &(*top)[h], MidCounts(l, h, first, n_mid));
    });
  }

 private:
  struct Layer {
    std::vector<PqCodebook> books;            // [kv_head]
    std::vector<std::vector<uint8_t>> codes;  // [kv_head][slot * m + s], slots [0, n_coded)
    int n_coded = 0;
    // [kv_head][tuple]: slots [0, n_coded) per code tuple, kept as slots are coded so
    // that a step does not count them again (TopKByCodes' counts); empty when the
    // tuples are more than kMaxCountedTuples.
    std::vector<std::vector<int32_t>> counts;
  };
  // 4,096 tuples (m = 2, 6 bits) cost 16 KB per layer and KV head; 16 bits' 65,536 would
  // cost 256 KB each for little gain (TopKByCodes then counts in its own pass).
  static constexpr int64_t kMaxCountedTuples = 4096;

  // l.counts from l.codes (after the codebooks or the coded slots were replaced).
  void RecountTuples(Layer& l) {
    l.counts.assign(l.codes.size(), {});
    for (size_t h = 0; h < l.codes.size(); ++h) {
      const int64_t n_tuples = l.books[h].n_tuples();
      if (n_tuples == 0 || n_tuples > kMaxCountedTuples) continue;
      l.counts[h].assign(static_cast<size_t>(n_tuples), 0);
      const int64_t n = static_cast<int64_t>(l.codes[h].size()) / l.books[h].m();
      l.books[h].CountTuples(l.codes[h].data(), n, 1, l.counts[h].data());
    }
  }

  // The tuple counts of KV head h's slots [first, first + n_mid): the kept counts less
  // the few slots outside that range (the initial ones; coded slots still inside the
  // local window). nullptr when the layer keeps none.
  const int32_t* MidCounts(const Layer& l, int h, int first, int n_mid) {
    if (l.counts.empty() || l.counts[h].empty()) return nullptr;
    thread_local std::vector<int32_t> mid;
    mid = l.counts[h];
    const PqCodebook& book = l.books[h];
    const int m = book.m(), end = first + n_mid;
    book.CountTuples(l.codes[h].data(), first, -1, mid.data());
    book.CountTuples(l.codes[h].data() + static_cast<int64_t>(end) * m, l.n_coded - end, -1, mid.data());
    return mid.data();
  }

  // The imported index's layer `layer` becomes the layer's index; codes past the n
  // slots the sequence has now (none when the caller truncated it) are dropped.
  void TakeImported(int layer, int n) {
    PqIndex::Layer& in = imported_.layers[layer];
    Layer& l = layers_[layer];
    l.n_coded = std::min(in.n_coded, n);
    l.books = std::move(in.books);
    l.codes = std::move(in.codes);
    for (auto& c : l.codes) c.resize(static_cast<size_t>(l.n_coded) * options_.pq.m);
    in = PqIndex::Layer{};
    RecountTuples(l);
    UpdateBytes();
  }

  int Iterations(int64_t n_keys) {
    if (options_.fixed_iterations) return options_.pq.iterations;
    if (!prefill_seconds()) return kNoPrefillIterations;
    if (seconds_per_point_iteration_ <= 0) return kCalibrationIterations;
    const double budget = options_.cluster_share * *prefill_seconds() / n_layers_;
    return AdaptiveIterations(budget, seconds_per_point_iteration_, n_keys, shape_.n_kv_heads, options_.pq);
  }

  void Train(int layer, const kv::Visibility& vis) {
    Layer& l = layers_[layer];
    const int hd = shape_.head_dim, n_kv = shape_.n_kv_heads;
    const int n_train = std::max(1, vis.n_slots - 1);  // the decoding token's key is not the prompt's
    PqOptions po = options_.pq;
    po.iterations = Iterations(n_train);
    const bool calibrating = !options_.fixed_iterations && prefill_seconds() && seconds_per_point_iteration_ <= 0;
    const KeyReader keys(*vis.kv, hd);
    keys_.resize(static_cast<size_t>(n_kv) * n_train * hd);
    const auto t0 = std::chrono::steady_clock::now();
    // The KV heads' codebooks in parallel on the pool (k-means itself runs on one thread
    // each: PqCodebook::kTrainThreads).
    l.books.assign(static_cast<size_t>(n_kv), PqCodebook());
    std::vector<TrainStats> ts(static_cast<size_t>(n_kv));
    pool_.ParallelFor(n_kv, [&](int64_t h, int) {
      float* buf = keys_.data() + static_cast<size_t>(h) * n_train * hd;
      keys.Gather(static_cast<int>(h), 0, n_train, buf);
      auto book = PqCodebook::Train(buf, n_train, hd, hd, po, &ts[h]);
      ATTIC_CHECK(book.ok());  // options were validated against head_dim; n_train >= 1
      l.books[h] = std::move(*book);
    });
    const double wall = Since(t0);
    double point_iterations = 0;
    int used_iterations = 0;
    for (const TrainStats& t : ts) {
      if (t.points_used == 0) continue;  // no k-means ran (no more keys than centroids)
      point_iterations += static_cast<double>(t.points_used) * t.m * t.iterations;
      used_iterations = t.iterations;
    }
    // Calibrated on the first layer whose k-means ran, as the wall time of the whole
    // (parallel) training over the work done: the rate the next layers will see, gathers
    // included (so the estimate errs towards fewer iterations).
    if (calibrating && point_iterations > 0) seconds_per_point_iteration_ = wall / point_iterations;
    stats_.cluster_seconds += Since(t0);
    stats_.clustered_keys += static_cast<int64_t>(n_train) * n_kv;
    stats_.iterations = used_iterations;
    l.codes.assign(static_cast<size_t>(n_kv), {});
    RecountTuples(l);
    UpdateBytes();
  }

  // Codes slots [begin, end) of every KV head (nearest centroid).
  void Encode(int layer, const kv::Visibility& vis, int begin, int end) {
    Layer& l = layers_[layer];
    if (end <= begin) return;
    const int hd = shape_.head_dim, m = options_.pq.m;
    const KeyReader keys(*vis.kv, hd);
    for (auto& c : l.codes) {
      stats_.index_bytes += static_cast<int64_t>(end) * m - static_cast<int64_t>(c.size());
      c.resize(static_cast<size_t>(end) * m);
    }
    encode_buf_.resize(static_cast<size_t>(shape_.n_kv_heads) * (end - begin) * hd);
    ForEachHead(end - begin, [&](int64_t h) {
      float* buf = encode_buf_.data() + static_cast<size_t>(h) * (end - begin) * hd;
      keys.Gather(static_cast<int>(h), begin, end, buf);
      l.books[h].Encode(buf, end - begin, hd, l.codes[h].data() + static_cast<int64_t>(begin) * m);
      if (!l.counts[h].empty())
        l.books[h].CountTuples(l.codes[h].data() + static_cast<int64_t>(begin) * m, end - begin, 1, l.counts[h].data());
    });
    l.n_coded = end;
  }

  // fn(h) for every KV head: on the pool when each head has at least kParallelKeys keys
  // to go through, else on this thread.
  template <typename Fn>
  void ForEachHead(int64_t keys_per_head, const Fn& fn) {
    if (keys_per_head >= kParallelKeys) {
      pool_.ParallelFor(shape_.n_kv_heads, [&](int64_t h, int) { fn(h); });
    } else {
      for (int h = 0; h < shape_.n_kv_heads; ++h) fn(h);
    }
  }

  // index_bytes recounted over every layer (after a layer's codebooks change); coding
  // slots adds to it as it goes.
  void UpdateBytes() {
    int64_t bytes = 0;
    for (const Layer& l : layers_) {
      for (const PqCodebook& b : l.books) bytes += b.bytes();
      for (const auto& c : l.codes) bytes += static_cast<int64_t>(c.size());
    }
    stats_.index_bytes = bytes;
  }

  std::vector<Layer> layers_;
  PqIndex imported_;  // ImportIndex's, until each layer takes its part
  double seconds_per_point_iteration_ = 0;  // calibrated on the first layer clustered
  std::vector<std::vector<float>> tables_;  // [table][m * 2^bits]
  std::vector<float> keys_, encode_buf_;
};

}  // namespace

std::unique_ptr<SparseAttention> MakePqSelector(const SparseOptions& o, const attention::AttentionShape& shape,
                                                int n_layers, backend::ThreadPool& pool) {
  return std::make_unique<PqSelector>(o, shape, n_layers, pool);
}

}  // namespace attic::pq::internal
