#include "engine/kv_loader.h"

#include <algorithm>
#include <cstring>

namespace attic::engine {

namespace {
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

double LoadJob::WaitLayer(int l) {
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
    : pool_(pool), rope_(rope), n_kv_heads_(n_kv_heads), thread_([this] { Loop(); }) {}

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

void KvLoader::EnterLayer(LoadJob& job, int layer, Scratch& scratch) {
  const int kvd = pool_.shape().kv_dim(), bs = pool_.shape().block_size;
  const std::string_view bytes(*job.entry.bytes);
  const float* ek = store::EntryLayerK(bytes, job.entry.header, layer);
  const float* ev = store::EntryLayerV(bytes, job.entry.header, layer);
  const int n = static_cast<int>(job.rows.size());
  auto gather = [&](const float* src, int first, int m, float* dst) {
    for (int i = 0; i < m; ++i)
      std::memcpy(dst + static_cast<size_t>(i) * kvd, src + static_cast<size_t>(job.rows[first + i]) * kvd, kvd * 4);
  };
  if (job.host_k != nullptr) {  // pre-RoPE copy, for saving the turn
    auto& hk = (*job.host_k)[layer];
    auto& hv = (*job.host_v)[layer];
    hk.resize(static_cast<size_t>(n) * kvd);
    hv.resize(static_cast<size_t>(n) * kvd);
    gather(ek, 0, n, hk.data());
    gather(ev, 0, n, hv.data());
  }
  // A block's worth of rows at a time: gather, rotate K to the slots' positions, write.
  scratch.k.resize(static_cast<size_t>(bs) * kvd);
  scratch.v.resize(static_cast<size_t>(bs) * kvd);
  for (int first = 0; first < n; first += bs) {
    const int m = std::min(bs, n - first);
    gather(ek, first, m, scratch.k.data());
    gather(ev, first, m, scratch.v.data());
    rope_.Apply(scratch.k.data(), m, n_kv_heads_, job.positions.data() + first);
    pool_.WriteRows(layer, job.blocks.data(), first, m, scratch.k.data(), scratch.v.data());
  }
}

void KvLoader::Run(LoadJob& job, Scratch& scratch) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int l = 0; l < job.n_layers(); ++l) {
    EnterLayer(job, l, scratch);
    if (l + 1 == job.n_layers()) job.enter_seconds = Since(t0);
    {
      std::lock_guard<std::mutex> jl(job.mu);
      job.layers_done.store(l + 1, std::memory_order_release);
    }
    job.cv.notify_all();
  }
}

void KvLoader::EnterNow(LoadJob& job) {
  Scratch scratch;
  Run(job, scratch);
}

void KvLoader::Loop() {
  Scratch scratch;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !enters_.empty() || !fetches_.empty(); });
    if (!enters_.empty()) {  // entering goes first: a step may be waiting for it
      std::shared_ptr<LoadJob> job = std::move(enters_.front());
      enters_.pop_front();
      lock.unlock();
      Run(*job, scratch);
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
