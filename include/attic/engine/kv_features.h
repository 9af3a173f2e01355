// The engine's KV features: each paper's planner behind the scheduler's KV connector
// (kv/connector.h) and their configuration. KvFeatures composes them in the order their
// hooks run: linking's (pic::LinkPlanner), sparse decoding's (pq::SparsePlanner), the
// store's (store::StorePlanner, last: its Start makes the slots the others build on, its
// Finish saves what they keep). The one place in the engine that names the planners; the
// scheduler is given the connector (SchedulerOptions::kv_connector) and speaks only its
// calls.
#pragma once

#include <cstdint>
#include <memory>

#include "attic/engine/scheduler.h"
#include "attic/pq/sparse.h"
#include "attic/store/kv_loader.h"

namespace attic::engine {

struct KvFeatureOptions {
  int store_lookahead = 64;  // waiting requests shown to the KV store (prefetch/eviction)
  // Decoupled truncation (paper 3.4; needs a KV store): a prompt longer than the context
  // window is not rejected; tokens after the first `truncate_keep_first` are dropped --
  // at least the overflow, and at least this ratio of them so that the next turns do
  // not truncate again -- and the stored KV of what remains is reused with its
  // positions re-embedded, instead of being recomputed. The drop is sticky: a session's
  // later turns drop the same tokens first. 0 = off (overlong prompts are OutOfRange).
  double truncate_ratio = 0;
  int truncate_keep_first = 0;  // e.g. the system prompt or attention sinks
  // Truncate then recompute (the paper's TT baseline): the same tokens are dropped, but
  // the kept ones are prefilled again instead of reusing their stored KV.
  bool truncate_recompute = false;
  // Stored-KV loading (needs a KV store). Read buffer: bytes of stored entries of jobs
  // still waiting that the loader fetches and verifies ahead of their admission; -1 =
  // sized per job by the paper's S_buf = B * (T_load * L_hist - T_pref * L_new) from the
  // measured load and prefill rates; 0 = no read buffer. Stored prefixes shorter than
  // SchedulerOptions::min_reuse_tokens are not loaded.
  store::Preload kv_preload = store::Preload::kLayerwise;  // how stored KV enters (store/kv_loader.h)
  int64_t kv_read_buffer_bytes = -1;
  bool store_save = true;  // save each finished turn's KV (false: read-only store)
  // Sparse decoding (paper 004, PQCache; pq/sparse.h): what a request that names none
  // (no pq::SparseOptions in its kv_options) gets (the server's --sparse). null or method
  // full = full attention.
  std::shared_ptr<const pq::SparseOptions> sparse;
  // Offloaded sparse requests (pq/offload.h): their complete blocks live pre-RoPE, in
  // sparse_offload_dtype (the server's store type, --kv-store-dtype), in a host-memory
  // tier of this capacity (--sparse-offload-bytes); a request waits until its whole
  // context fits beside the running ones', and one that cannot fit at all is refused.
  int64_t sparse_offload_bytes = int64_t{4} << 30;
  store::KvDtype sparse_offload_dtype = store::KvDtype::kF32;
};

// The connector of the features with `options` (SchedulerOptions::kv_connector): over a
// KV store, every planner; without one, linking's and sparse decoding's (linking's then
// refuses what needs a store: linked chunks, a prefill-only request).
KvConnectorFactory KvFeatures(KvFeatureOptions options = {});

// Whether a prompt longer than the context window is shortened in the stored KV
// (decoupled truncation: truncate_ratio > 0 over a KV store) rather than refused; the
// one place this is decided (the server's prompt-size limit asks it; the store planner
// truncates exactly then).
inline bool ShortensOverlongPrompts(const KvFeatureOptions& options, bool has_store) {
  return options.truncate_ratio > 0 && has_store;
}

}  // namespace attic::engine
