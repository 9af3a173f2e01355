// ThreadPool: a persistent pool for data-parallel kernels. The calling thread takes
// part in every ParallelFor, so a pool of N threads starts N-1 workers. Workers spin
// briefly (~0.6 ms) before sleeping, so back-to-back kernels (one decode step is ~200 of
// them) don't pay a wake-up each; dispatch costs ~1-1.5 us with 2 threads.
//
// Tasks are claimed dynamically and the caller waits only for tasks actually claimed:
// if a worker is late (asleep, or descheduled on a busy machine) the caller runs the
// remaining tasks itself. So no task may wait for another task of the same call.
//
// Thread-safety: ParallelFor may be called from one thread at a time per pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace attic::backend {

class ThreadPool {
 public:
  // n_threads <= 0 picks the number of online CPUs.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Calls fn(task, thread) for task in [0, n_tasks), distributing tasks over the threads
  // (thread in [0, n_threads)). Returns when every task has finished.
  void ParallelFor(int64_t n_tasks, const std::function<void(int64_t task, int thread)>& fn);

  // Splits [0, n) into contiguous ranges, at most one per thread, each a multiple of
  // `align` (except the last), and calls fn(begin, end, thread).
  void ParallelRange(int64_t n, int64_t align, const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int n_threads_;
};

}  // namespace attic::backend
