#include "attic/store/kv_loader.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>

#include "attic/core/thread_name.h"
#include "attic/kv/enter_rows.h"

namespace attic::store {

namespace {
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int LoadJob::n_rows() const {
  int n = 0;
  for (const LoadSegment& s : segments) n += s.n;
  return n;
}

uint64_t LoadJob::stored_bytes() const {
  // Rows' bytes (kivi4: K's codes, not its groups' scales: 4 of 4.25 bits a value at
  // groups of 128 tokens).
  uint64_t n = 0;
  for (const LoadSegment& s : segments)
    n += static_cast<uint64_t>(s.n) * s.source->n_layers() * (s.source->meta().k_row_size() + s.source->meta().v_row_size());
  return n;
}

double LoadJob::WaitLayer(int l) {
  if (inline_loader != nullptr) {
    while (layers_done.load(std::memory_order_relaxed) <= l) inline_loader->EnterNextLayer(*this, *inline_threads);
    return 0;
  }
  if (layers_done.load(std::memory_order_acquire) > l) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return layers_done.load(std::memory_order_acquire) > l; });
  return Since(t0);
}

Status LoadJob::failure() const {
  std::lock_guard<std::mutex> lock(mu);
  return failure_;
}

void LoadJob::Fail(const Status& why) {
  std::lock_guard<std::mutex> lock(mu);
  if (failure_.ok()) failure_ = why;
  failed_.store(true, std::memory_order_release);
}

StatusOr<std::shared_ptr<const KvSource>>& StagedFetch::Wait() {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return ready; });
  return result;
}

KvLoader::KvLoader(kv::BlockPool& pool, const attention::RopeTable& rope)
    : pool_(pool), rope_(rope), thread_(StartNamedThread("attic-loader", [this] { Loop(); })) {}

KvLoader::~KvLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void KvLoader::Start(const std::shared_ptr<LoadJob>& job, Preload mode, backend::ThreadPool& threads) {
  PreloadFor(mode).Start(*this, job, threads);
}

void KvLoader::Queue(const std::shared_ptr<LoadJob>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    enters_.push_back(job);
  }
  cv_.notify_all();
}

void KvLoader::Stage(std::function<void()> fetch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    fetches_.push_back(std::move(fetch));
  }
  cv_.notify_all();
}

void KvLoader::EnterLayer(LoadJob& job, int layer, backend::ThreadPool* threads) {
  // Streamed sources: the layer must have arrived (after a failure nothing is entered).
  for (const LoadSegment& seg : job.segments) {
    if (job.failed()) return;
    if (Status st = seg.source->AwaitLayer(layer); !st.ok()) job.Fail(st);
  }
  if (job.failed()) return;
  const int kvd = pool_.shape().kv_dim(), bs = pool_.shape().block_size;
  // Pre-RoPE copy of the rows, by slot (copy row i = slot copy_first_slot + i), for
  // saving the turn (elements of the sources' dtype: the store's). Rows of slots no
  // segment enters (computed later) are left as they are.
  // K's and V's rows by bytes, each in its own element type; kivi4's K as f32 (a row is
  // not whole without its group's scales), read through them.
  auto copy_rows = [&](auto* copy_k, auto* copy_v) {
    if (copy_k == nullptr || copy_v == nullptr) return;
    auto& hk = (*copy_k)[layer];
    auto& hv = (*copy_v)[layer];
    using KElem = typename std::remove_reference_t<decltype(hk)>::value_type;
    using VElem = typename std::remove_reference_t<decltype(hv)>::value_type;
    for (size_t si = job.copy_from_segment; si < job.segments.size(); ++si) {
      const LoadSegment& seg = job.segments[si];
      const KvSource::Layer src = seg.source->layer(layer);
      std::optional<GroupedKRows> grouped;
      if (KvDtypeGroupedK(seg.source->dtype())) grouped.emplace(src);
      ATTIC_CHECK((grouped ? std::is_same_v<KElem, float> : src.k_row_size % sizeof(KElem) == 0) &&
                  src.v_row_size % sizeof(VElem) == 0);
      // Elements of a K / V row.
      const size_t krow = grouped ? static_cast<size_t>(kvd) : src.k_row_size / sizeof(KElem);
      const size_t vrow = src.v_row_size / sizeof(VElem);
      const size_t slots = static_cast<size_t>(seg.dst_slot + seg.n - job.copy_first_slot);
      if (hk.size() < slots * krow) hk.resize(slots * krow);
      if (hv.size() < slots * vrow) hv.resize(slots * vrow);
      const size_t at = static_cast<size_t>(seg.dst_slot - job.copy_first_slot);
      for (int i = 0; i < seg.n; ++i) {
        KElem* k_out = hk.data() + (at + i) * krow;
        if constexpr (std::is_same_v<KElem, float>) {
          if (grouped) grouped->Row(seg.src_row + i, k_out);
        }
        if (!grouped) std::memcpy(k_out, src.KBytes(seg.src_row + i), src.k_row_size);
        std::memcpy(hv.data() + (at + i) * vrow, src.VBytes(seg.src_row + i), src.v_row_size);
      }
    }
  };
  copy_rows(job.copy_k, job.copy_v);
  copy_rows(job.copy_k16, job.copy_v16);
  copy_rows(job.copy_kq, job.copy_vq);
  copy_rows(job.copy_k, job.copy_vq);  // kivi4
  // One block of slots per task (each slot's K rotated, then K and V stored).
  for (const LoadSegment& seg : job.segments) {
    const KvSource::Layer src = seg.source->layer(layer);
    const int delta = seg.src_row - seg.dst_slot;  // source row of slot s: s + delta
    auto enter = [&](auto k_row, auto v_row) {
      const int first_block = seg.dst_slot / bs, end_block = (seg.dst_slot + seg.n + bs - 1) / bs;
      auto enter_block = [&](int64_t c, int) {
        const int b = first_block + static_cast<int>(c);
        const int lo = std::max(seg.dst_slot, b * bs), hi = std::min(seg.dst_slot + seg.n, (b + 1) * bs);
        kv::EnterRotatedRows(pool_, rope_, layer, job.blocks.data(), lo, hi - lo, job.positions.data(), k_row, v_row);
      };
      if (threads != nullptr) {
        threads->ParallelFor(end_block - first_block, enter_block);
      } else {
        for (int64_t c = 0; c < end_block - first_block; ++c) enter_block(c, 0);
      }
    };
    const KvEntry& meta = seg.source->meta();
    if (KvDtypeQuantized(meta.dtype)) {
      // Each row dequantized (exact) into a row buffer of the entering thread, in the same
      // pass that rotates K and writes the buffer's type (EnterRotatedRows reads K's row,
      // then V's, of one slot at a time): a quantized buffer requantizes them with its own
      // grouping (the same as the entry's when the model is the same; requantizing a
      // dequantized row in its own type gives it back).
      ATTIC_CHECK(meta.kv_dim == kvd && meta.group > 0);
      const int group = meta.group;
      const KvDtype k_type = KvTensorDtype(meta.dtype, false), v_type = KvTensorDtype(meta.dtype, true);
      // kivi4's K: each row through its group's scales, widened once for the layer.
      const bool grouped = KvDtypeGroupedK(meta.dtype);
      std::optional<GroupedKRows> k_rows;
      if (grouped) k_rows.emplace(src);
      enter(
          [&, group, k_type, grouped](int s) {
            thread_local std::vector<float> krow;
            krow.resize(static_cast<size_t>(kvd));
            if (grouped) {
              k_rows->Row(s + delta, krow.data());
            } else {
              DequantizeRow(k_type, src.KQ(s + delta), kvd, group, krow.data());
            }
            return static_cast<const float*>(krow.data());
          },
          [&, group, v_type](int s) {
            thread_local std::vector<float> vrow;
            vrow.resize(static_cast<size_t>(kvd));
            DequantizeRow(v_type, src.VQ(s + delta), kvd, group, vrow.data());
            return static_cast<const float*>(vrow.data());
          });
    } else if (seg.source->dtype() == KvDtype::kF16) {
      enter([&](int s) { return src.K16(s + delta); }, [&](int s) { return src.V16(s + delta); });
    } else {
      enter([&](int s) { return src.K(s + delta); }, [&](int s) { return src.V(s + delta); });
    }
  }
}

void KvLoader::EnterAll(LoadJob& job, backend::ThreadPool* threads) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int l = 0; l < job.n_layers(); ++l) {
    EnterLayer(job, l, threads);
    if (l + 1 == job.n_layers()) job.enter_seconds = Since(t0);
    {
      std::lock_guard<std::mutex> jl(job.mu);
      job.layers_done.store(l + 1, std::memory_order_release);
    }
    job.cv.notify_all();
  }
}

void KvLoader::EnterNextLayer(LoadJob& job, backend::ThreadPool& threads) {
  const auto t0 = std::chrono::steady_clock::now();
  const int l = job.layers_done.load(std::memory_order_relaxed);
  EnterLayer(job, l, &threads);
  job.enter_seconds += Since(t0);
  job.layers_done.store(l + 1, std::memory_order_release);
}

void KvLoader::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !enters_.empty() || !fetches_.empty(); });
    if (!enters_.empty()) {  // entering goes first: a step may be waiting for it
      std::shared_ptr<LoadJob> job = std::move(enters_.front());
      enters_.pop_front();
      lock.unlock();
      EnterAll(*job, nullptr);
      lock.lock();
    } else if (!fetches_.empty()) {
      auto fetch = std::move(fetches_.front());
      fetches_.pop_front();
      lock.unlock();
      fetch();
      lock.lock();
    } else {
      return;  // stopping, and nothing is queued
    }
  }
}

}  // namespace attic::store
