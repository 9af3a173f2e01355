// The preload strategies (kv_loader.h): sync, layer-wise and inline entering of stored
// KV into the compute buffer.
#include "attic/store/kv_loader.h"

namespace attic::store {

void SyncPreload::Start(KvLoader& loader, const std::shared_ptr<LoadJob>& job, backend::ThreadPool& threads) const {
  loader.EnterAll(*job, &threads);
}

void LayerwisePreload::Start(KvLoader& loader, const std::shared_ptr<LoadJob>& job, backend::ThreadPool&) const {
  loader.Queue(job);
}

void InlinePreload::Start(KvLoader& loader, const std::shared_ptr<LoadJob>& job, backend::ThreadPool& threads) const {
  job->inline_loader = &loader;
  job->inline_threads = &threads;
}

const PreloadStrategy& PreloadFor(Preload mode) {
  static const SyncPreload sync;
  static const LayerwisePreload layerwise;
  static const InlinePreload in_line;
  switch (mode) {
    case Preload::kSync: return sync;
    case Preload::kInline: return in_line;
    case Preload::kLayerwise: break;
  }
  return layerwise;
}

}  // namespace attic::store
