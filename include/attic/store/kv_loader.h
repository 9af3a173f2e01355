// KvLoader: the store's "read stream" (paper 001 section 3.2) on a CPU. One background
// thread that
//   - enters stored pre-RoPE KV into a sequence's compute-buffer blocks layer by layer
//     (RoPE at the slots' positions: kv/enter_rows.h), publishing each finished layer,
//     so that the forward computes layer l while layer l+1 is still being entered
//     (layer-wise pre-loading); and
//   - fetches and verifies the stored entries of jobs still waiting in the queue (the
//     read buffer), so that a job's load does not start only when it is admitted.
// Entering jobs go before fetches. A job holds a copy of the block ids and positions it
// writes, so the caller may grow the sequence meanwhile; the blocks must not be freed
// before WaitAll(). A layer of a streamed source is entered once it has arrived
// (KvSource::AwaitLayer); when its read fails the job fails (failed()): that layer and
// the later ones are published without being entered, so no wait hangs, and the
// caller must not use the job's slots (it recomputes them). When and where a job's layers are entered is its PreloadStrategy's
// choice (sync, layer-wise on the loader thread, or inline on the compute threads).
//
// Thread-safety: Enter/Stage from any thread; a LoadJob's WaitLayer from one thread
// (the step loop).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "attic/attention/rope.h"
#include "attic/backend/thread_pool.h"
#include "attic/core/status.h"
#include "attic/kv/block_pool.h"
#include "attic/store/kv_source.h"

namespace attic::store {

class KvLoader;

// Source rows [src_row, src_row + n) enter slots [dst_slot, dst_slot + n).
struct LoadSegment {
  std::shared_ptr<const KvSource> source;
  int src_row = 0;
  int n = 0;
  int dst_slot = 0;
};

// How stored KV enters the compute buffer (paper 001 section 3.2).
enum class Preload {
  kSync,       // every layer is entered before the job's first forward step
  kLayerwise,  // layer l+1 is entered by the loader thread while layer l computes
  kInline,     // layer l is entered by the compute threads just before layer l computes
               // (no loader thread: for machines without a core to spare for it)
};

// Stored KV entering the compute buffer.
struct LoadJob {
  std::vector<LoadSegment> segments;  // ascending, disjoint dst_slot ranges (gaps allowed)
  std::vector<int32_t> blocks;        // the sequence's blocks covering the slots
  std::vector<int32_t> positions;     // every slot's position (RoPE), up to the last entered slot
  // Optional pre-RoPE copy of the entered rows, per layer (the rows a turn saves, when
  // they are not shared in place: TurnRows): the rows of segments[copy_from_segment..]
  // are copied by slot, slot s to copy row s - copy_first_slot (a layer's vector grows
  // to hold them; rows of slots no segment enters are left as they are).
  // (f16 sources: copy_k16 / copy_v16; quantized ones: copy_kq / copy_vq, by bytes;
  // kivi4: copy_k, K as f32, and copy_vq.)
  std::vector<std::vector<float>>* copy_k = nullptr;
  std::vector<std::vector<float>>* copy_v = nullptr;
  std::vector<std::vector<uint16_t>>* copy_k16 = nullptr;
  std::vector<std::vector<uint16_t>>* copy_v16 = nullptr;
  std::vector<std::vector<uint8_t>>* copy_kq = nullptr;
  std::vector<std::vector<uint8_t>>* copy_vq = nullptr;
  int copy_first_slot = 0;
  size_t copy_from_segment = 0;
  // Sets the copy's K and V targets: the store type's own-row vectors (WithOwnRows).
  void CopyInto(std::vector<std::vector<float>>* k, std::vector<std::vector<float>>* v) { copy_k = k, copy_v = v; }
  void CopyInto(std::vector<std::vector<uint16_t>>* k, std::vector<std::vector<uint16_t>>* v) {
    copy_k16 = k, copy_v16 = v;
  }
  void CopyInto(std::vector<std::vector<uint8_t>>* k, std::vector<std::vector<uint8_t>>* v) { copy_kq = k, copy_vq = v; }
  void CopyInto(std::vector<std::vector<float>>* k, std::vector<std::vector<uint8_t>>* v) { copy_k = k, copy_vq = v; }

  // Inline entering (InlinePreload): no loader thread; WaitLayer(l) itself enters the
  // layers up to l, on the calling thread and `inline_threads`, just before the forward
  // computes them (so they are still in cache when attention reads them).
  KvLoader* inline_loader = nullptr;
  backend::ThreadPool* inline_threads = nullptr;

  int n_layers() const { return segments.empty() ? 0 : segments.front().source->n_layers(); }
  int n_rows() const;
  // Bytes of stored KV the job enters (every layer's K and V rows, as the sources hold them).
  uint64_t stored_bytes() const;
  bool done() const { return layers_done.load(std::memory_order_acquire) >= n_layers(); }
  // A source's read failed: the slots hold no valid KV (the first error in failure()).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status failure() const;
  void Fail(const Status& why);
  // Blocks until layer `l` (or every layer) is in the compute buffer; returns the
  // seconds spent waiting (0 for inline entering, whose time is enter_seconds).
  double WaitLayer(int l);
  double WaitAll() { return WaitLayer(n_layers() - 1); }

  std::atomic<int> layers_done{0};
  double enter_seconds = 0;  // time spent entering, complete when done()
  mutable std::mutex mu;
  std::condition_variable cv;

 private:
  std::atomic<bool> failed_{false};
  Status failure_;  // guarded by mu
};

// One fetch for the read buffer.
struct StagedFetch {
  std::string key;
  uint64_t bytes = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  StatusOr<std::shared_ptr<const KvSource>> result = UnavailableError("not fetched yet");
  // Blocks until the fetch is done.
  StatusOr<std::shared_ptr<const KvSource>>& Wait();
};

class KvLoader {
 public:
  KvLoader(kv::BlockPool& pool, const attention::RopeTable& rope);
  ~KvLoader();
  KvLoader(const KvLoader&) = delete;
  KvLoader& operator=(const KvLoader&) = delete;

  kv::BlockPool& pool() { return pool_; }
  // Starts entering `job` as `mode`'s PreloadStrategy does.
  void Start(const std::shared_ptr<LoadJob>& job, Preload mode, backend::ThreadPool& threads);
  // Queues `job` for the loader thread, which enters its layers in order, publishing
  // each (before any queued fetch).
  void Queue(const std::shared_ptr<LoadJob>& job);
  // Enters every layer of `job` now, on the calling thread (and `threads` when given),
  // publishing each as it is done.
  void EnterAll(LoadJob& job, backend::ThreadPool* threads);
  // Queues a read-buffer fetch: fetch() runs on the loader thread after any entering.
  void Stage(std::function<void()> fetch);

 private:
  friend struct LoadJob;
  void Loop();
  void EnterLayer(LoadJob& job, int layer, backend::ThreadPool* threads);
  // Enters the job's next layer now, on the calling thread and `threads` (inline mode).
  void EnterNextLayer(LoadJob& job, backend::ThreadPool& threads);

  kv::BlockPool& pool_;
  const attention::RopeTable& rope_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<LoadJob>> enters_;
  std::deque<std::function<void()>> fetches_;
  bool stop_ = false;
  std::thread thread_;
};

// How a job's stored KV enters the compute buffer (paper 001 section 3.2): one strategy
// per Preload mode. Each enters the same bytes; they differ in which thread enters a
// layer and when the forward may compute it.
class PreloadStrategy {
 public:
  virtual ~PreloadStrategy() = default;
  virtual Preload mode() const = 0;
  // Starts entering `job` with `loader`. Afterwards job->WaitLayer(l) returns once layer
  // l (and every layer before it) is in the compute buffer.
  virtual void Start(KvLoader& loader, const std::shared_ptr<LoadJob>& job, backend::ThreadPool& threads) const = 0;
};

// Every layer entered before Start returns, on the calling thread and `threads`.
class SyncPreload final : public PreloadStrategy {
 public:
  Preload mode() const override { return Preload::kSync; }
  void Start(KvLoader& loader, const std::shared_ptr<LoadJob>& job, backend::ThreadPool& threads) const override;
};

// Entered by the loader thread, layer after layer, while the forward computes the
// layers already entered.
class LayerwisePreload final : public PreloadStrategy {
 public:
  Preload mode() const override { return Preload::kLayerwise; }
  void Start(KvLoader& loader, const std::shared_ptr<LoadJob>& job, backend::ThreadPool& threads) const override;
};

// Nothing entered at Start: WaitLayer(l) enters the layers up to l on the calling
// thread and `threads` (the compute threads), just before the forward computes layer l.
class InlinePreload final : public PreloadStrategy {
 public:
  Preload mode() const override { return Preload::kInline; }
  void Start(KvLoader& loader, const std::shared_ptr<LoadJob>& job, backend::ThreadPool& threads) const override;
};

// The strategy of `mode` (a static instance).
const PreloadStrategy& PreloadFor(Preload mode);

}  // namespace attic::store
