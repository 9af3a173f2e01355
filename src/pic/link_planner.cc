// LinkPlanner (link_planner.h): a linked prompt's plan against the store and its run.
#include "attic/pic/link_planner.h"

#include "attic/pic/link_plan.h"

namespace attic::pic {

// One linked sequence: its run, made when the store planned its chunks (Extend) and kept
// by Start when the sequence's slots are the ones planned (pending until then).
struct LinkPlanner::Seq final : kv::KvSeqState {
  // CacheBlend's hooks see the rows of the entry they are called for (EntryRows::entry):
  // the step dispatches each entry's rows to its own hooks.
  struct Bound final : kv::LayerHooks {
    void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kv) override {
      run->set_entry(rows.entry);
      run->hooks()->OnKv(layer, rows, kv);
    }
    void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
      run->set_entry(rows.entry);
      run->hooks()->BeforeAttention(layer, rows, vis);
    }
    void AfterLayer(int layer, const kv::EntryRows& rows, uint8_t* keep) override {
      run->set_entry(rows.entry);
      run->hooks()->AfterLayer(layer, rows, keep);
    }
    LinkRun* run = nullptr;
  };

  kv::LayerHooks* hooks(bool decoding) override {
    return !decoding && run->hooks() != nullptr ? &bound : nullptr;  // a linked prompt's prefill
  }
  const std::vector<int32_t>* compute_slots() const override { return &run->compute_slots(); }
  int recomputed() const override { return run->recomputed(); }

  std::unique_ptr<LinkRun> run;
  Bound bound;
  const kv::SequenceKv* kv = nullptr;  // the slots it was planned into
  int n_slots = 0;                     // ... and how many they were to hold
  bool pending = true;                 // planned, not started yet
};

LinkPlanner::LinkPlanner(store::KvStore* store, const kv::KvShape& shape) : store_(store), shape_(shape) {}

LinkPlanner::~LinkPlanner() = default;

std::shared_ptr<const LinkSpec> LinkPlanner::SpecOf(const kv::KvRequest& request) {
  std::shared_ptr<const LinkSpec> spec = request.options.Get<LinkSpec>();
  if (spec == nullptr) return nullptr;
  // Linked chunks follow the tokens they cover: the truncation dropped prompt tokens
  // [keep, keep + dropped).
  if (const auto t = request.options.Get<store::Truncation>()) return TruncateLinkSpec(*spec, t->keep, t->dropped);
  return spec;
}

Status LinkPlanner::Check(kv::KvRequest& request, kv::KvLimits* limits) {
  const std::shared_ptr<const LinkSpec> spec = request.options.Get<LinkSpec>();
  if (spec == nullptr && request.samples) return OkStatus();  // neither linked nor prefill-only
  if (request.prompt_logits)
    return InvalidArgumentError("prompt logprobs need the whole prompt computed: not with linked chunks");
  if (store_ == nullptr) return FailedPreconditionError("linking cached chunks and saving a prompt's KV need a KV store");
  return spec != nullptr ? spec->Validate(request.n_prompt, shape_.n_layers) : OkStatus();
}

void LinkPlanner::Match(const kv::KvQueue& queue, kv::KvAdmission* head) {
  if (head != nullptr) head->min_local = Needs(*queue.waiting.front());
}

int LinkPlanner::Needs(const kv::KvSeq& seq) const {
  const std::shared_ptr<const LinkSpec> spec = SpecOf(seq.request);
  return spec != nullptr ? LinkedEnd(*spec) : 0;
}

void LinkPlanner::Extend(kv::KvSeq& seq, const kv::SequenceKv* slots, store::StoredPlan* plan) {
  const std::shared_ptr<const LinkSpec> spec = SpecOf(seq.request);
  if (spec == nullptr || spec->options.method == LinkMethod::kFull) return;  // nothing cached is used
  const std::vector<int32_t>& prompt = *seq.request.prompt;
  const int n = static_cast<int>(prompt.size());
  const int p = plan->n_cached;
  // The chunks whose stored KV this request may read (link_plan.h: tenant, shape and
  // tokens checked there).
  LinkedLoad load = OpenLinkedChunks(*store_, *spec, seq.request.tenant, prompt, p, shape_);
  if (load.present.empty()) return;
  for (store::LoadSegment& seg : load.segments) plan->segments.push_back(std::move(seg));
  // Every prompt slot exists from the start; the linked part continues the prefix's
  // positions.
  const int first_pos = p > 0 ? plan->positions[p - 1] + 1 : 0;
  plan->tokens = prompt;
  plan->positions.resize(n);
  for (int s = p; s < n; ++s) plan->positions[s] = first_pos + (s - p);
  plan->n_cached = n;
  int n_linked = 0;
  for (const LinkedChunk& c : load.present) n_linked += c.n;
  // Linked chunks: the slots the forward computes in place, their hooks, and how many of
  // them held cached KV (recomputed to link them).
  auto s = std::make_unique<Seq>();
  s->run = std::make_unique<LinkRun>(spec->options, load.present, p, n, slots);
  s->bound.run = s->run.get();
  s->kv = slots;
  s->n_slots = n;
  plan->extended = true;
  plan->n_stored = p + n_linked;  // before what is recomputed (usage)
  plan->n_recomputed = s->run->recomputed();
  // Whether the turn is saved: outside a conversation the chunks are stored already, and
  // this arrangement of them is unlikely to come back (RAG), so the turn holds no copy of
  // the chunks' rows either. A conversation's linked turn is saved: its next turn reuses
  // it as history.
  plan->save = !seq.request.session_id.empty();
  state(seq) = std::move(s);
}

Status LinkPlanner::Start(kv::KvSeq& seq, kv::KvSlots* slots) {
  std::unique_ptr<kv::KvSeqState>& slot = state(seq);
  auto* s = static_cast<Seq*>(slot.get());
  // The run planned with the store stands when the slots hold what it planned (a load
  // that broke off at once left the sequence to compute its prompt instead).
  const kv::SequenceKv* kv = slots->get();
  if (s != nullptr && s->pending && s->kv == kv && kv->n_slots() >= s->n_slots) {
    s->pending = false;
  } else {
    slot.reset();
  }
  return OkStatus();
}

void LinkPlanner::Finish(kv::KvSeq& seq, const kv::SequenceKv* kv, kv::KvKeep* keep) { state(seq).reset(); }

void LinkPlanner::AppendJobs(const kv::KvSeq& seq, std::vector<store::QueuedJob>* jobs) const {
  // The context-cache chunks it links, by key (kept from eviction, promoted and fetched
  // ahead like a session's history).
  if (const std::shared_ptr<const LinkSpec> spec = SpecOf(seq.request))
    AppendLinkedJobs(*spec, seq.request.tenant, jobs);
}

}  // namespace attic::pic
