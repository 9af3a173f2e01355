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
      const auto t0 = std::chrono::steady_clock::now();
      auto r = store->Fetch(fetch->key);
      std::lock_guard<std::mutex> l(fetch->mu);
      fetch->result = std::move(r);
      fetch->seconds = Since(t0);
      fetch->ready = true;
      fetch->cv.notify_all();
    });
  }
  cv_.notify_all();
}

void KvLoader::EnterLayer(LoadJob& job, int layer, std::vector<float>& scratch) {
  const kv::KvShape& s = pool_.shape();
  const int hd = s.head_dim, kvd = s.kv_dim(), bs = s.block_size;
  const std::string_view bytes(*job.entry.bytes);
  const float* ek = store::EntryLayerK(bytes, job.entry.header, layer);
  const float* ev = store::EntryLayerV(bytes, job.entry.header, layer);
  const int n = static_cast<int>(job.rows.size());
  if (job.host_k != nullptr) {
    auto& hk = (*job.host_k)[layer];
    auto& hv = (*job.host_v)[layer];
    hk.reserve(std::max(job.host_reserve, static_cast<size_t>(n) * kvd));
    hv.reserve(std::max(job.host_reserve, static_cast<size_t>(n) * kvd));
    hk.resize(static_cast<size_t>(n) * kvd);
    hv.resize(static_cast<size_t>(n) * kvd);
    for (int i = 0; i < n; ++i) {
      std::memcpy(hk.data() + static_cast<size_t>(i) * kvd, ek + static_cast<size_t>(job.rows[i]) * kvd, kvd * 4);
      std::memcpy(hv.data() + static_cast<size_t>(i) * kvd, ev + static_cast<size_t>(job.rows[i]) * kvd, kvd * 4);
    }
  }
  // RoPE a block's worth of rows at a time, then scatter into the block layout
  // [kv_head][row][head_dim].
  scratch.resize(static_cast<size_t>(bs) * kvd);
  for (int first = 0; first < n; first += bs) {
    const int m = std::min(bs, n - first);
    for (int i = 0; i < m; ++i)
      std::memcpy(scratch.data() + static_cast<size_t>(i) * kvd, ek + static_cast<size_t>(job.rows[first + i]) * kvd,
                  kvd * 4);
    rope_.Apply(scratch.data(), m, n_kv_heads_, job.positions.data() + first);
    for (int i = 0; i < m; ++i) {
      const int slot = first + i;
      const int32_t b = job.blocks[slot / bs];
      const int row = slot % bs;
      float* kb = pool_.k_block(layer, b);
      float* vb = pool_.v_block(layer, b);
      const float* vrow = ev + static_cast<size_t>(job.rows[slot]) * kvd;
      for (int h = 0; h < s.n_kv_heads; ++h) {
        std::memcpy(kb + (static_cast<int64_t>(h) * bs + row) * hd, scratch.data() + static_cast<size_t>(i) * kvd + h * hd,
                    hd * 4);
        std::memcpy(vb + (static_cast<int64_t>(h) * bs + row) * hd, vrow + h * hd, hd * 4);
      }
    }
  }
}

void KvLoader::EnterNow(LoadJob& job) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> scratch;
  for (int l = 0; l < job.n_layers(); ++l) EnterLayer(job, l, scratch);
  job.enter_seconds = Since(t0);
  job.layers_done.store(job.n_layers(), std::memory_order_release);
}

void KvLoader::Loop() {
  std::vector<float> scratch;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !enters_.empty() || !fetches_.empty(); });
    if (!enters_.empty()) {
      std::shared_ptr<LoadJob> job = std::move(enters_.front());
      enters_.pop_front();
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      for (int l = 0; l < job->n_layers(); ++l) {
        EnterLayer(*job, l, scratch);
        if (l + 1 == job->n_layers()) job->enter_seconds = Since(t0);
        {
          std::lock_guard<std::mutex> jl(job->mu);
          job->layers_done.store(l + 1, std::memory_order_release);
        }
        job->cv.notify_all();
      }
      lock.lock();
      continue;
    }
    if (!fetches_.empty()) {
      auto f = std::move(fetches_.front());
      fetches_.pop_front();
      lock.unlock();
      f();
      lock.lock();
      continue;
    }
    if (stop_) return;
  }
}

}  // namespace attic::engine
