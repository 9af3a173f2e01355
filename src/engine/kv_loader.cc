#include "engine/kv_loader.h"

#include <algorithm>
#include <cstring>

#include "attic/core/thread_name.h"

namespace attic::engine {

namespace {
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

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

StatusOr<store::KvStore::Fetched>& StagedFetch::Wait() {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return ready; });
  return result;
}

KvLoader::KvLoader(kv::BlockPool& pool, const attention::RopeTable& rope, int n_kv_heads)
    : pool_(pool), rope_(rope), n_kv_heads_(n_kv_heads), thread_(StartNamedThread("attic-loader", [this] { Loop(); })) {}

KvLoader::~KvLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void KvLoader::Enter(std::shared_ptr<LoadJob> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    enters_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void KvLoader::Stage(std::shared_ptr<StagedFetch> fetch, store::KvStore* store) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    fetches_.push_back([fetch, store] {
      auto r = store->Fetch(fetch->key);
      std::lock_guard<std::mutex> l(fetch->mu);
      fetch->result = std::move(r);
      fetch->ready = true;
      fetch->cv.notify_all();
    });
  }
  cv_.notify_all();
}

LoadJob::SourceLayer LoadJob::Layer(int layer) const {
  if (queued) return {queued.get(), layer, nullptr, nullptr, static_cast<size_t>(queued->kv_dim)};
  return {nullptr, layer, store::EntryLayerK(*entry.bytes, entry.header, layer),
          store::EntryLayerV(*entry.bytes, entry.header, layer), static_cast<size_t>(entry.header.meta.kv_dim)};
}

void KvLoader::EnterRows(const LoadJob& job, int layer, int first, int m) {
  const kv::KvShape& shape = pool_.shape();
  const int kvd = shape.kv_dim(), hd = shape.head_dim;
  const LoadJob::SourceLayer src = job.Layer(layer);
  if (shape.dtype == DType::kF32) {
    // K rotated straight into its slot (heads head_stride apart), V copied head by head.
    const int64_t hs = shape.head_stride();
    const int32_t* blocks = job.blocks.data();
    for (int i = first; i < first + m; ++i) {
      const int row = job.rows[i];
      rope_.ApplyToken(src.K(row), pool_.k_slot_f32(layer, blocks, i), n_kv_heads_, hs, job.positions[i]);
      const float* v = src.V(row);
      float* vd = pool_.v_slot_f32(layer, blocks, i);
      for (int h = 0; h < n_kv_heads_; ++h) std::memcpy(vd + h * hs, v + h * hd, static_cast<size_t>(hd) * sizeof(float));
    }
    return;
  }
  // Other element types: K rotated into a row buffer (one token: stays in L1), then
  // converted and stored with V.
  thread_local std::vector<float> krow;
  krow.resize(static_cast<size_t>(kvd));
  for (int i = first; i < first + m; ++i) {
    rope_.ApplyToken(src.K(job.rows[i]), krow.data(), n_kv_heads_, hd, job.positions[i]);
    pool_.WriteRows(layer, job.blocks.data(), i, 1, krow.data(), src.V(job.rows[i]));
  }
}

void KvLoader::EnterLayer(LoadJob& job, int layer, backend::ThreadPool* threads) {
  const int kvd = pool_.shape().kv_dim(), bs = pool_.shape().block_size;
  const int n = static_cast<int>(job.rows.size());
  if (job.host_k != nullptr) {  // pre-RoPE copy of the (non-prefix) rows, for saving the turn
    auto& hk = (*job.host_k)[layer];
    auto& hv = (*job.host_v)[layer];
    hk.resize(static_cast<size_t>(n) * kvd);
    hv.resize(static_cast<size_t>(n) * kvd);
    const LoadJob::SourceLayer src = job.Layer(layer);
    for (int i = 0; i < n; ++i) {
      const size_t dst = static_cast<size_t>(i) * kvd;
      std::memcpy(hk.data() + dst, src.K(job.rows[i]), kvd * sizeof(float));
      std::memcpy(hv.data() + dst, src.V(job.rows[i]), kvd * sizeof(float));
    }
  }
  // One block of slots per task (EnterRows: each row's K rotated, then K and V stored).
  const int64_t n_blocks = (n + bs - 1) / bs;
  auto enter_block = [&](int64_t c, int) { EnterRows(job, layer, static_cast<int>(c) * bs, std::min(bs, n - static_cast<int>(c) * bs)); };
  if (threads != nullptr) {
    threads->ParallelFor(n_blocks, enter_block);
  } else {
    for (int64_t c = 0; c < n_blocks; ++c) enter_block(c, 0);
  }
}

void KvLoader::Run(LoadJob& job, backend::ThreadPool* threads) {
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

void KvLoader::EnterNow(LoadJob& job, backend::ThreadPool& threads) { Run(job, &threads); }

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
      Run(*job, nullptr);
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

}  // namespace attic::engine
