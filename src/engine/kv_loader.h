// KvLoader (internal to the scheduler): the "read stream" of paper 001 section 3.2 on a
// CPU. One background thread that
//   - enters stored pre-RoPE KV into a sequence's compute-buffer blocks layer by layer
//     (RoPE at the slots' positions), publishing each finished layer, so that the step
//     loop's forward computes layer l while layer l+1 is still being entered
//     (layer-wise pre-loading); and
//   - fetches and verifies the stored entries of jobs still waiting in the queue (the
//     read buffer), so that a job's load does not start only when it is admitted.
// Entering jobs go before fetches. A job holds a copy of the block ids and positions it
// writes, so the step loop may grow the sequence meanwhile; the sequence must not be
// freed before WaitAll() (Running and Retire make sure of that).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "attic/attention/rope.h"
#include "attic/kv/block_pool.h"
#include "attic/store/kv_store.h"

namespace attic::engine {

// Stored KV entering the compute buffer: slot i of the sequence <- entry row rows[i].
struct LoadJob {
  store::KvStore::Fetched entry;
  std::vector<int> rows;             // entry rows, in slot order
  std::vector<int32_t> blocks;       // the sequence's first blocks (covering the rows)
  std::vector<int32_t> positions;    // the slots' positions (RoPE)
  // Optional host copy of the rows' pre-RoPE K and V per layer (for saving the turn),
  // when the rows are not a prefix of the entry (truncation); else the scheduler keeps
  // the entry's rows in place.
  std::vector<std::vector<float>>* host_k = nullptr;
  std::vector<std::vector<float>>* host_v = nullptr;

  int n_layers() const { return entry.header.meta.n_layers; }
  bool done() const { return layers_done.load(std::memory_order_acquire) >= n_layers(); }
  // Blocks until layer `l` (or every layer) is in the compute buffer; returns the
  // seconds spent waiting.
  double WaitLayer(int l);
  double WaitAll() { return WaitLayer(n_layers() - 1); }

  std::atomic<int> layers_done{0};
  double enter_seconds = 0;  // loader time, set when done
  std::mutex mu;
  std::condition_variable cv;
};

// One fetch for the read buffer.
struct StagedFetch {
  std::string key;
  uint64_t bytes = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  StatusOr<store::KvStore::Fetched> result = UnavailableError("not fetched yet");
  // Blocks until the fetch is done.
  StatusOr<store::KvStore::Fetched>& Wait();
};

class KvLoader {
 public:
  KvLoader(kv::BlockPool& pool, const attention::RopeTable& rope, int n_kv_heads);
  ~KvLoader();
  KvLoader(const KvLoader&) = delete;
  KvLoader& operator=(const KvLoader&) = delete;

  // Queues the job (entering goes before queued fetches).
  void Enter(std::shared_ptr<LoadJob> job);
  // Enters every layer on the calling thread (no pre-loading).
  void EnterNow(LoadJob& job);
  // Queues a read-buffer fetch.
  void Stage(std::shared_ptr<StagedFetch> fetch, store::KvStore* store);

 private:
  struct Scratch {
    std::vector<float> k, v;  // one block's rows
  };
  void Loop();
  // Enters every layer, publishing each as it is done.
  void Run(LoadJob& job, Scratch& scratch);
  void EnterLayer(LoadJob& job, int layer, Scratch& scratch);

  kv::BlockPool& pool_;
  const attention::RopeTable& rope_;
  const int n_kv_heads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<LoadJob>> enters_;
  std::deque<std::function<void()>> fetches_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace attic::engine
