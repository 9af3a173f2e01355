#include "attic/backend/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attic/core/status.h"
#include "attic/core/thread_name.h"

namespace attic::backend {

// One job at a time is published in a single atomic `ticket` word:
//   bits 63..44 job id | bits 43..22 task count | bits 21..0 next unclaimed task.
// Threads claim a task by CAS on the ticket, so a claim names its job: a worker that wakes
// late (or was descheduled) can never run a task of a job that has finished, and the
// caller waits only for tasks actually claimed — not for every worker to check in. That
// matters on a small shared VM, where a worker may sit in the run queue for a timeslice:
// the caller then simply runs the remaining tasks itself.
//
// Idle workers spin on the ticket for kSpinIters pauses (~0.6 ms on Zen 5), then sleep on
// a condition variable; back-to-back kernels (a decode step is a few hundred) find them spinning.
namespace {

constexpr int kJobShift = 44;
constexpr int kCountShift = 22;
constexpr uint64_t kFieldMask = (uint64_t{1} << 22) - 1;  // task count / next index
constexpr int64_t kMaxTasksPerJob = static_cast<int64_t>(kFieldMask);
constexpr int kSpinIters = 1 << 15;

inline uint64_t JobOf(uint64_t t) { return t >> kJobShift; }
inline int64_t CountOf(uint64_t t) { return static_cast<int64_t>((t >> kCountShift) & kFieldMask); }
inline int64_t NextOf(uint64_t t) { return static_cast<int64_t>(t & kFieldMask); }

}  // namespace

struct ThreadPool::Impl {
  std::vector<std::thread> workers;
  std::atomic<uint64_t> ticket{0};
  std::atomic<int64_t> done{0};        // tasks of the current job finished
  const std::function<void(int64_t, int)>* fn = nullptr;
  int64_t task_offset = 0;             // jobs over kMaxTasksPerJob tasks run in slices
  uint64_t job = 0;                    // id of the last published job (caller only)
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> stop{false};
  std::atomic<int> sleepers{0};

  // Claims and runs tasks of job `job_id` until none are left. Returns tasks run.
  void RunTasks(uint64_t job_id, int thread) {
    uint64_t t = ticket.load(std::memory_order_acquire);
    for (;;) {
      if (JobOf(t) != job_id || NextOf(t) >= CountOf(t)) return;
      if (!ticket.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      // The claimed task keeps the job open, so fn and task_offset are this job's.
      (*fn)(task_offset + NextOf(t), thread);
      done.fetch_add(1, std::memory_order_release);
      t = ticket.load(std::memory_order_acquire);
    }
  }

  void WorkerLoop(int thread) {
    uint64_t seen_job = 0;
    for (;;) {
      int spins = 0;
      uint64_t t;
      while (JobOf(t = ticket.load(std::memory_order_acquire)) == seen_job) {
        if (stop.load(std::memory_order_relaxed)) return;
        if (++spins < kSpinIters) {
          __builtin_ia32_pause();
          continue;
        }
        std::unique_lock<std::mutex> lock(mu);
        sleepers.fetch_add(1);  // seq_cst: pairs with the caller's publish + sleepers check
        cv.wait(lock, [&] { return JobOf(ticket.load()) != seen_job || stop.load(); });
        sleepers.fetch_sub(1);
        spins = 0;
      }
      if (stop.load()) return;
      seen_job = JobOf(t);
      RunTasks(seen_job, thread);
    }
  }
};

ThreadPool::ThreadPool(int n_threads) : impl_(new Impl) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads; ++i)
    impl_->workers.push_back(StartNamedThread("attic-pool-" + std::to_string(i), [this, i] { impl_->WorkerLoop(i); }));
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
  for (int64_t offset = 0; offset < n_tasks; offset += kMaxTasksPerJob) {
    const int64_t count = std::min(kMaxTasksPerJob, n_tasks - offset);
    s.fn = &fn;
    s.task_offset = offset;
    s.done.store(0, std::memory_order_relaxed);
    s.job = (s.job + 1) & ((uint64_t{1} << (64 - kJobShift)) - 1);
    if (s.job == 0) s.job = 1;  // 0 is "no job yet" for workers
    s.ticket.store((s.job << kJobShift) | (static_cast<uint64_t>(count) << kCountShift));  // seq_cst
    if (s.sleepers.load() > 0) {
      std::lock_guard<std::mutex> lock(s.mu);
      s.cv.notify_all();
    }
    s.RunTasks(s.job, 0);
    // Wait for tasks other threads claimed. Yield now and then: on an oversubscribed
    // machine the thread we wait for may need our core.
    for (int spins = 0; s.done.load(std::memory_order_acquire) != count; ++spins) {
      if ((spins & 1023) == 1023) sched_yield();
      else __builtin_ia32_pause();
    }
  }
  s.fn = nullptr;
}

void ThreadPool::ParallelRange(int64_t n, int64_t align, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (align < 1) align = 1;
  int64_t units = (n + align - 1) / align;
  int64_t parts = std::min<int64_t>(n_threads_, units);
  if (parts == 1) {
    fn(0, n, 0);
    return;
  }
  ParallelFor(parts, [&](int64_t p, int thread) {
    int64_t ub = units * p / parts, ue = units * (p + 1) / parts;
    int64_t b = ub * align, e = std::min(n, ue * align);
    if (b < e) fn(b, e, thread);
  });
}

}  // namespace attic::backend
