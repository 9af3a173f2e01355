// ComposedConnector: the planners behind one KvConnector (connector.h).
#include "attic/kv/connector.h"

#include <algorithm>

namespace attic::kv {

std::unique_ptr<KvSeqState>& KvPlanner::state(KvSeq& seq) const {
  if (static_cast<int>(seq.states.size()) <= index_) seq.states.resize(index_ + 1);
  return seq.states[index_];
}

const KvSeqState* KvPlanner::state(const KvSeq& seq) const {
  return static_cast<int>(seq.states.size()) > index_ ? seq.states[index_].get() : nullptr;
}

void ComposedConnector::Add(std::unique_ptr<KvPlanner> planner) {
  planner->index_ = static_cast<int>(planners_.size());
  planners_.push_back(std::move(planner));
}

Status ComposedConnector::Check(KvRequest& request, KvLimits* limits) {
  for (auto& p : planners_) ATTIC_RETURN_IF_ERROR(p->Check(request, limits));
  return OkStatus();
}

void ComposedConnector::Match(const KvQueue& queue, KvAdmission* head) {
  if (head == nullptr) {
    for (auto& p : planners_) p->Match(queue, nullptr);
    return;
  }
  KvAdmission out = *head;
  for (auto& p : planners_) {
    KvAdmission a;
    a.max_slots = head->max_slots;
    p->Match(queue, &a);
    out.blocks = std::max(out.blocks, a.blocks);
    out.free_first += a.free_first;
    out.ready = out.ready && a.ready;
    out.min_local = std::max(out.min_local, a.min_local);
  }
  *head = out;
}

Status ComposedConnector::Start(KvSeq& seq, KvSlots* slots) {
  seq.states.resize(planners_.size());
  for (auto p = planners_.rbegin(); p != planners_.rend(); ++p) ATTIC_RETURN_IF_ERROR((*p)->Start(seq, slots));
  return OkStatus();
}

double ComposedConnector::WaitLayer(KvSeq& seq, int layer) {
  double waited = 0;
  for (auto& p : planners_) waited += p->WaitLayer(seq, layer);
  return waited;
}

void ComposedConnector::Finish(KvSeq& seq, const SequenceKv* kv, KvKeep* keep) {
  for (auto& p : planners_) p->Finish(seq, kv, keep);
}

void ComposedConnector::PublishStats(KvStats* stats) const {
  for (const auto& p : planners_) p->PublishStats(stats);
}

}  // namespace attic::kv
