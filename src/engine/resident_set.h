// ResidentSet (internal to the scheduler): the compute buffer's finished sequences whose
// KV stays resident (SchedulerOptions::max_resident), with what the KV connector's
// planners kept with them (KvKeep: the store's turn, the attachments). A waiting request
// of the same tenant whose prompt shares a prefix with one reuses it (LocalReuse): adopts
// it with its blocks when little of it would be lost (a conversation's next turn), else
// copies the prefix and leaves it for others. Evicted by a ResidentPolicy when blocks are
// needed or beyond max_resident.
//
// Thread-safety: the step loop's.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "attic/engine/resident_policy.h"
#include "attic/kv/block_pool.h"
#include "attic/kv/connector.h"

namespace attic::engine {

// Compute-buffer reuse: slots [0, n_cached) of a waiting request are those of `from_seq`
// (a finished sequence kept resident), adopted with its blocks (`adopt`) or copied.
struct LocalReuse {
  const kv::SequenceKv* from_seq = nullptr;
  bool adopt = false;
  int n_cached = 0;
};

class ResidentSet {
 public:
  // `pool` must outlive the set.
  ResidentSet(kv::BlockPool& pool, int max_resident, int min_reuse_tokens);
  ~ResidentSet();

  // The resident sequence of `tenant` a prompt reuses, and how (none: below
  // min_reuse_tokens); the session's own wins ties. At least the prompt's last token is
  // left to compute.
  LocalReuse Plan(const std::string& tenant, const std::string& session_id, const std::vector<int32_t>& prompt) const;
  // The slots of `local` (a resident sequence's, adopted or copied; else empty ones),
  // with what they hold and the states the resident kept (`adopted` takes an adopted
  // one's). REQUIRES: the blocks a copy needs are available (evicting others).
  std::unique_ptr<kv::SequenceKv> Take(const LocalReuse& local, kv::KvReused* reused,
                                       std::vector<std::unique_ptr<kv::KvSeqState>>* adopted);
  // Keeps a finished sequence resident, with its planners' states and attachments;
  // evicts beyond max_resident.
  void Keep(std::string tenant, std::string session_id, std::unique_ptr<kv::SequenceKv> kv,
            std::vector<std::unique_ptr<kv::KvSeqState>> states, std::vector<kv::KvAttachment> attachments);
  // Evicts resident sequences (the policy's pick first) until n blocks are free or none
  // is left to evict.
  void EnsureFree(int n_blocks) { EnsureFree(n_blocks, nullptr); }

  // What evicting every resident sequence would free (blocks it shares with running
  // sequences stay).
  int blocks() const;
  int size() const { return static_cast<int>(residents_.size()); }
  uint64_t evicted() const { return evicted_; }

 private:
  struct Resident;
  void EnsureFree(int n_blocks, const Resident* pinned);
  // Evicts the resident sequence policy_ picks (not `pinned`), if any.
  void Evict(const Resident* pinned);

  kv::BlockPool& pool_;
  const int max_resident_;
  const int min_reuse_tokens_;
  std::list<std::unique_ptr<Resident>> residents_;  // front = least recently used
  std::unique_ptr<ResidentPolicy> policy_ = std::make_unique<LruResidentPolicy>();
  uint64_t clock_ = 0;  // stamps Resident::last_used
  uint64_t evicted_ = 0;
};

}  // namespace attic::engine
