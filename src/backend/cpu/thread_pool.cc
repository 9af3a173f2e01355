#include "attic/backend/thread_pool.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "attic/core/status.h"

namespace attic::backend {

// A generation counter announces each job; workers spin on it for a while, then sleep on
// a condition variable. Tasks are claimed with an atomic counter.
struct ThreadPool::Impl {
  std::vector<std::thread> workers;
  std::atomic<uint64_t> generation{0};
  std::atomic<int64_t> next_task{0};
  std::atomic<int> active{0};
  int64_t n_tasks = 0;
  const std::function<void(int64_t, int)>* fn = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> stop{false};
  std::atomic<int> sleepers{0};

  void RunTasks(int thread) {
    for (;;) {
      int64_t t = next_task.fetch_add(1, std::memory_order_relaxed);
      if (t >= n_tasks) break;
      (*fn)(t, thread);
    }
  }

  void WorkerLoop(int thread) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t g;
      int spins = 0;
      while ((g = generation.load(std::memory_order_acquire)) == seen && !stop.load(std::memory_order_relaxed)) {
        if (++spins < 20000) {
          __builtin_ia32_pause();
          continue;
        }
        std::unique_lock<std::mutex> lock(mu);
        sleepers.fetch_add(1);
        cv.wait(lock, [&] { return generation.load() != seen || stop.load(); });
        sleepers.fetch_sub(1);
      }
      if (stop.load()) return;
      seen = g;
      RunTasks(thread);
      active.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
};

ThreadPool::ThreadPool(int n_threads) : impl_(new Impl) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads; ++i) impl_->workers.emplace_back([this, i] { impl_->WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop.store(true);
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->workers) t.join();
}

void ThreadPool::ParallelFor(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  Impl& s = *impl_;
  s.fn = &fn;
  s.n_tasks = n_tasks;
  s.next_task.store(0, std::memory_order_relaxed);
  s.active.store(static_cast<int>(s.workers.size()), std::memory_order_relaxed);
  s.generation.fetch_add(1);  // seq_cst: pairs with the sleepers check below
  if (s.sleepers.load() > 0) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.cv.notify_all();
  }
  s.RunTasks(0);
  while (s.active.load(std::memory_order_acquire) != 0) __builtin_ia32_pause();
  s.fn = nullptr;
}

void ThreadPool::ParallelRange(int64_t n, int64_t align, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (align < 1) align = 1;
  int64_t units = (n + align - 1) / align;
  int64_t parts = std::min<int64_t>(n_threads_, units);
  ParallelFor(parts, [&](int64_t p, int thread) {
    int64_t ub = units * p / parts, ue = units * (p + 1) / parts;
    int64_t b = ub * align, e = std::min(n, ue * align);
    if (b < e) fn(b, e, thread);
  });
}

}  // namespace attic::backend
