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
#include "attic/backend/thread_pool.h"
#include "attic/kv/block_pool.h"
#include "attic/store/kv_store.h"

namespace attic::engine {

class KvLoader;

// Stored KV entering the compute buffer: slot i of the sequence <- entry row rows[i].
struct LoadJob {
  // The source: a stored entry's bytes, or (read-through of the write buffer) the entry
  // of a save still queued, shared with the store's writer.
  store::KvStore::Fetched entry;
  std::shared_ptr<const store::KvEntry> queued;
  std::vector<int> rows;             // entry rows, in slot order
  std::vector<int32_t> blocks;       // the sequence's first blocks (covering the rows)
  std::vector<int32_t> positions;    // the slots' positions (RoPE)
  // Optional host copy of the rows' pre-RoPE K and V per layer (for saving the turn),
  // when the rows are not a prefix of the entry (truncation); else the scheduler keeps
  // the entry's rows in place.
  std::vector<std::vector<float>>* host_k = nullptr;
  std::vector<std::vector<float>>* host_v = nullptr;

  // Inline entering (KvPreload::kInline): no loader thread; WaitLayer(l) itself enters
  // the layers up to l, on the calling thread and `inline_threads`, just before the
  // forward computes them (so they are still in cache when attention reads them).
  KvLoader* inline_loader = nullptr;
  backend::ThreadPool* inline_threads = nullptr;
  int n_layers() const { return queued ? queued->n_layers : entry.header.meta.n_layers; }
  // The source's layer `layer`: K(row) / V(row) are the pre-RoPE K and V of entry row
  // `row` ([kv_dim] f32 each). A serialized entry's layer is resolved once (its rows are
  // contiguous); a queued save's rows are looked up through its bases.
  struct SourceLayer {
    const store::KvEntry* queued;
    int layer;
    const float* k;  // a serialized entry's layer, or null (queued)
    const float* v;
    size_t kv_dim;
    const float* K(int row) const { return k ? k + row * kv_dim : queued->k_row(layer, row); }
    const float* V(int row) const { return v ? v + row * kv_dim : queued->v_row(layer, row); }
  };
  SourceLayer Layer(int layer) const;
  bool done() const { return layers_done.load(std::memory_order_acquire) >= n_layers(); }
  // Blocks until layer `l` (or every layer) is in the compute buffer; returns the
  // seconds spent waiting (0 for inline entering, whose time is enter_seconds).
  double WaitLayer(int l);
  double WaitAll() { return WaitLayer(n_layers() - 1); }

  std::atomic<int> layers_done{0};
  double enter_seconds = 0;  // time spent entering, complete when done()
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
  // Enters every layer now, on the calling thread and `threads` (no pre-loading).
  void EnterNow(LoadJob& job, backend::ThreadPool& threads);
  // Enters the job's next layer now, on the calling thread and `threads` (inline mode).
  void EnterNextLayer(LoadJob& job, backend::ThreadPool& threads);
  // Queues a read-buffer fetch.
  void Stage(std::shared_ptr<StagedFetch> fetch, store::KvStore* store);

 private:
  void Loop();
  // Enters every layer (over `threads` when given, else on this thread), publishing
  // each as it is done.
  void Run(LoadJob& job, backend::ThreadPool* threads);
  void EnterLayer(LoadJob& job, int layer, backend::ThreadPool* threads);
  // Slots [first, first + m) of one layer: K rotated to the slots' positions straight
  // into the blocks, V copied.
  void EnterRows(const LoadJob& job, int layer, int first, int m);

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
