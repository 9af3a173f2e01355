// ResidentSet (resident_set.h): finished sequences kept in the compute buffer.
#include "engine/resident_set.h"

#include <algorithm>

#include "attic/store/prefix_match.h"

namespace attic::engine {

struct ResidentSet::Resident {
  std::string tenant;
  std::string session_id;
  std::unique_ptr<kv::SequenceKv> kv;
  // What the connector's planners kept with its KV: their states (the store's turn, kept
  // for the next save; declared after kv: destroyed first), and its attachments (KvKeep):
  // a request reusing a prefix of the slots as they are finds them (KvReused).
  std::vector<std::unique_ptr<kv::KvSeqState>> states;
  std::vector<kv::KvAttachment> attachments;
  uint64_t last_used = 0;  // clock_ when kept or last reused
};

namespace {

// A resident sequence's first n slots reused as they are, with what it kept.
kv::KvReused ReusedAsIs(const std::vector<kv::KvAttachment>& attachments, int n) {
  kv::KvReused reused;
  reused.n_as_is = n;
  reused.attachment = [attachments](std::string_view kind) -> StatusOr<std::string_view> {
    for (const kv::KvAttachment& a : attachments)
      if (a.kind == kind && a.bytes != nullptr) return std::string_view(*a.bytes);
    return NotFoundError("no attachment " + std::string(kind));
  };
  return reused;
}

}  // namespace

ResidentSet::ResidentSet(kv::BlockPool& pool, int max_resident, int min_reuse_tokens)
    : pool_(pool), max_resident_(max_resident), min_reuse_tokens_(min_reuse_tokens) {}

ResidentSet::~ResidentSet() = default;

LocalReuse ResidentSet::Plan(const std::string& tenant, const std::string& session_id,
                             const std::vector<int32_t>& prompt) const {
  LocalReuse plan;
  // At least the last prompt token is computed, so that its logits exist.
  const size_t cap = prompt.size() - 1;
  store::BestPrefixMatch<kv::SequenceKv*> best;
  for (const auto& res : residents_) {
    if (res->tenant != tenant) continue;
    best.Offer(res->kv.get(), {store::CommonPrefix(res->kv->tokens(), prompt, cap),
                               !session_id.empty() && res->session_id == session_id, res->last_used});
  }
  plan.from_seq = best.found() ? best.item() : nullptr;
  const int n = best.common();
  if (plan.from_seq == nullptr || n < min_reuse_tokens_) return LocalReuse{};
  plan.n_cached = n;
  // Adopt the resident sequence when little of it would be lost (the usual next turn of
  // a conversation); otherwise copy the shared prefix and leave it resident for others.
  plan.adopt = plan.from_seq->n_slots() - n <= pool_.shape().block_size;
  return plan;
}

std::unique_ptr<kv::SequenceKv> ResidentSet::Take(const LocalReuse& local, kv::KvReused* reused,
                                                  std::vector<std::unique_ptr<kv::KvSeqState>>* adopted) {
  if (local.from_seq == nullptr) return std::make_unique<kv::SequenceKv>(&pool_);
  auto it = std::find_if(residents_.begin(), residents_.end(),
                         [&](const auto& p) { return p->kv.get() == local.from_seq; });
  ATTIC_CHECK(it != residents_.end());
  Resident& res = **it;
  *reused = ReusedAsIs(res.attachments, local.n_cached);
  if (local.adopt) {
    std::unique_ptr<kv::SequenceKv> kv = std::move(res.kv);
    *adopted = std::move(res.states);
    reused->from = adopted;
    reused->adopted = true;
    residents_.erase(it);
    kv->Truncate(local.n_cached);
    return kv;
  }
  const kv::SequenceKv& src = *res.kv;
  const int block_size = pool_.shape().block_size;
  EnsureFree((local.n_cached + block_size - 1) / block_size, &res);
  auto kv = std::make_unique<kv::SequenceKv>(&pool_);
  Status st = kv->Append(src.tokens().data(), src.positions().data(), local.n_cached);
  ATTIC_CHECK(st.ok());  // guaranteed by the caller's availability check
  const auto& sb = src.block_table();
  const auto& db = kv->block_table();
  for (size_t i = 0; i < db.size(); ++i) pool_.CopyBlock(db[i], sb[i]);
  reused->from = &res.states;  // the resident stays: its states are copied from
  res.last_used = ++clock_;
  residents_.splice(residents_.end(), residents_, it);  // most recently used
  return kv;
}

void ResidentSet::Keep(std::string tenant, std::string session_id, std::unique_ptr<kv::SequenceKv> kv,
                       std::vector<std::unique_ptr<kv::KvSeqState>> states,
                       std::vector<kv::KvAttachment> attachments) {
  auto res = std::make_unique<Resident>();
  res->tenant = std::move(tenant);
  res->session_id = std::move(session_id);
  res->kv = std::move(kv);
  res->states = std::move(states);
  res->attachments = std::move(attachments);
  res->last_used = ++clock_;
  residents_.push_back(std::move(res));
  while (size() > max_resident_) Evict(nullptr);
}

int ResidentSet::blocks() const {
  // Residents share no block with each other (only choice 0 of n choices stays
  // resident), so the blocks each alone holds add up to what evicting them all frees.
  int n = 0;
  for (const auto& res : residents_) n += res->kv->n_exclusive_blocks();
  return n;
}

void ResidentSet::Evict(const Resident* pinned) {
  std::vector<ResidentCandidate> candidates;
  std::vector<std::list<std::unique_ptr<Resident>>::iterator> at;
  for (auto it = residents_.begin(); it != residents_.end(); ++it) {
    if (it->get() == pinned) continue;
    candidates.push_back({(*it)->last_used, static_cast<int>((*it)->kv->block_table().size())});
    at.push_back(it);
  }
  if (candidates.empty()) return;
  auto it = at[policy_->PickVictim(candidates)];
  residents_.erase(it);  // ~SequenceKv frees the blocks
  ++evicted_;
}

void ResidentSet::EnsureFree(int n_blocks, const Resident* pinned) {
  while (pool_.n_free() < n_blocks) {
    const size_t before = residents_.size();
    Evict(pinned);
    if (residents_.size() == before) return;  // nothing evictable: the caller sees ResourceExhausted
  }
}

}  // namespace attic::engine
