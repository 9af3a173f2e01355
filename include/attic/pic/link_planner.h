// LinkPlanner: linking's part of the KV connector (kv/connector.h; paper 002, Epic). A
// request whose options carry a LinkSpec (KvRequestOptions) has chunks of its prompt whose
// KV is stored on its own (context caches); the planner
//   Check      validates the spec against the prompt and the model; it refuses a linked
//              prompt whose every token's logits are wanted (KvRequest::prompt_logits), and
//              without a store both linking and a prefill-only request (KVGen of a
//              context cache's chunk, saved to the store) -- with the messages the engine
//              gave before these checks moved here
//   Match      asks that a resident sequence be reused only when it covers every linked
//              chunk (a conversation's later turn); else the chunks are linked
//   Start      finishes the link the store's Start planned through it (below): the slots
//              the forward computes in place before decoding (LinkRun: the uncached tokens
//              between chunks, the boundary slots AttnLink recomputes, every slot for
//              CacheBlend), CacheBlend's hooks on those steps, what was recomputed
//   Finish     releases it
// and, as the store planner's extension (store::StoredKvExtension), enters the chunks'
// stored KV after the stored prefix (link_plan.h: the chunks the request's tenant may
// read, of the model's shape, with the prompt's tokens), says whether the turn is saved
// (not outside a conversation), and adds the chunks to the look-ahead. A prompt the
// store truncated (store::Truncation) has its chunks follow the tokens they cover.
//
// Thread-safety: the step loop's, like the connector.
#pragma once

#include <memory>
#include <vector>

#include "attic/kv/block_pool.h"
#include "attic/kv/connector.h"
#include "attic/pic/link.h"
#include "attic/store/kv_store.h"
#include "attic/store/store_planner.h"

namespace attic::pic {

class LinkPlanner final : public kv::KvPlanner, public store::StoredKvExtension {
 public:
  // `store` must outlive the planner (null: none, Check refuses what needs one);
  // `shape`: the compute buffer's.
  LinkPlanner(store::KvStore* store, const kv::KvShape& shape);
  ~LinkPlanner() override;

  Status Check(kv::KvRequest& request, kv::KvLimits* limits) override;
  void Match(const kv::KvQueue& queue, kv::KvAdmission* head) override;
  Status Start(kv::KvSeq& seq, kv::KvSlots* slots) override;
  void Finish(kv::KvSeq& seq, const kv::SequenceKv* kv, kv::KvKeep* keep) override;

  int Needs(const kv::KvSeq& seq) const override;
  void Extend(kv::KvSeq& seq, const kv::SequenceKv* slots, store::StoredPlan* plan) override;
  void AppendJobs(const kv::KvSeq& seq, std::vector<store::QueuedJob>* jobs) const override;

 private:
  struct Seq;
  // The request's spec over its prompt as the engine computes it (after the store's
  // truncation), or null.
  static std::shared_ptr<const LinkSpec> SpecOf(const kv::KvRequest& request);

  store::KvStore* store_;
  kv::KvShape shape_;
};

}  // namespace attic::pic
