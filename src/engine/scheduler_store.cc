// Scheduler <-> KV store (paper 001): planning a request's stored KV at admission,
// starting its turn (store::Turn), saving each finished turn, and handing the store
// look-ahead hints from the waiting queue for prefetch, eviction and the read buffer
// (DESIGN.md decision 6). How the store finds, fetches, shares and enters KV is the
// store's business (turn.h): the scheduler plans slots and calls the turn.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "attic/core/log.h"
#include "attic/pic/link_plan.h"
#include "engine/scheduler_internal.h"

namespace attic::engine {

void Scheduler::TruncatePrompt(GenerationRequest& req, int limit, Truncation* t) const {
  const std::vector<int32_t>& p = req.prompt;
  const int n = static_cast<int>(p.size());
  const int keep = std::clamp(options_.truncate_keep_first, 0, limit / 2);
  // Sticky: where the session's stored entry resumes after its kept head, the same
  // tokens were dropped before; start from there.
  int o = keep;
  if (!req.session_id.empty()) {
    auto stored = store_->SessionTokens(req.tenant, req.session_id);
    if (stored.ok() && static_cast<int>(stored->size()) > keep &&
        std::equal(stored->begin(), stored->begin() + keep, p.begin())) {
      // The offset where the most of the stored tail reappears (text may repeat, so the
      // first short match is not enough).
      const int m = static_cast<int>(stored->size()) - keep;
      int best = 0;
      for (int at = keep; at < n; ++at) {
        if (p[at] != (*stored)[keep]) continue;
        int len = 0;
        while (len < m && at + len < n && p[at + len] == (*stored)[keep + len]) ++len;
        if (len > best) {
          best = len;
          o = at;
        }
      }
      if (best < std::min(m, 8)) o = keep;  // no convincing match: truncate afresh
    }
  }
  const int tail = n - o;
  int skip = 0;
  if (keep + tail > limit) {
    skip = std::max(keep + tail - limit, static_cast<int>(std::ceil(options_.truncate_ratio * tail)));
    skip = std::min(skip, tail - 1);
  }
  t->active = true;
  t->keep = keep;
  t->skip = skip;
  auto view = std::make_shared<std::vector<int32_t>>(p.begin(), p.begin() + keep);
  view->insert(view->end(), p.begin() + o, p.end());
  t->store_view = std::move(view);
  std::vector<int32_t> kept(p.begin(), p.begin() + keep);
  kept.insert(kept.end(), p.begin() + o + skip, p.end());
  req.prompt = std::move(kept);
}

void Scheduler::set_store(store::KvStore* store) {
  store_ = store;
  if (store_ == nullptr) return;
  if (!store_->has_compute_buffer()) store_->AttachComputeBuffer(&pool_, &engine_.transformer().rope());
  store_->SetReadBuffer(options_.kv_read_buffer_bytes, options_.min_reuse_tokens);
}

SeqPlan Scheduler::PlanStored(const Running& r, int min_tokens) const {
  const std::vector<int32_t>& prompt = *r.prompt;
  const bool trunc = r.truncation.active;
  if (trunc && options_.truncate_recompute) return SeqPlan{};  // TT: recompute what is kept
  // The session's newest state may still be in the write buffer: read through (waiting
  // for the save would block the step loop for nothing), except for a truncated prompt.
  const std::vector<int32_t>& view = trunc ? *r.truncation.store_view : prompt;
  auto hit = store_->FindForTurn(r.req.tenant, r.req.session_id, view, /*read_queued=*/!trunc);
  if (!hit) return SeqPlan{};
  // At least the last prompt token is computed, so that its logits exist.
  const int cap = static_cast<int>(prompt.size()) - 1;
  const int usable = trunc ? std::min(cap, std::min(hit->n_tokens, r.truncation.keep) +
                                               std::max(0, hit->n_tokens - r.truncation.keep - r.truncation.skip))
                           : std::min(hit->n_tokens, cap);
  if (usable < min_tokens) return SeqPlan{};
  // The KV: fetched ahead by the read buffer, else now (a bad entry is a miss; the store
  // dropped it).
  auto src = store_->OpenForTurn(*hit);
  if (!src.ok()) return SeqPlan{};
  const kv::KvShape& shape = pool_.shape();
  const store::KvSource& s = **src;
  if (s.n_layers() != shape.n_layers || s.kv_dim() != shape.kv_dim() || s.n_rows() < hit->n_tokens) return SeqPlan{};
  SeqPlan plan = trunc ? PlanTruncated(r.truncation, *src, hit->n_tokens, cap, prompt)
                       : PlanStoredPrefix(*src, usable);
  if (plan.n_cached < min_tokens) return SeqPlan{};
  return plan;
}

SeqPlan Scheduler::PlanLinked(const Running& r, SeqPlan prefix) {
  const pic::LinkSpec& spec = *r.req.link;
  if (spec.options.method == pic::LinkMethod::kFull) return prefix;  // nothing cached is used
  const std::vector<int32_t>& prompt = *r.prompt;
  const int n = static_cast<int>(prompt.size());
  const int p = prefix.n_cached;
  // The chunks whose stored KV this request may read (pic/link_plan.h: tenant, shape and
  // tokens checked there).
  pic::LinkedLoad load = pic::OpenLinkedChunks(*store_, spec, r.req.tenant, prompt, p, pool_.shape());
  if (load.present.empty()) return prefix;
  SeqPlan plan = prefix;
  for (store::LoadSegment& seg : load.segments) plan.segments.push_back(std::move(seg));
  std::vector<pic::LinkedChunk> present = std::move(load.present);
  // Every prompt slot exists from the start; the linked part continues the prefix's
  // positions.
  const int first_pos = p > 0 ? plan.positions[p - 1] + 1 : 0;
  plan.tokens = prompt;
  plan.positions.resize(n);
  for (int s = p; s < n; ++s) plan.positions[s] = first_pos + (s - p);
  plan.n_cached = n;
  plan.link_from = p;
  for (const pic::LinkedChunk& c : present) plan.n_linked += c.n;
  plan.linked = std::move(present);
  return plan;
}

void Scheduler::StartFromStore(Running& r, SeqPlan plan) {
  // A stored prefix reused as it is (entry rows [0, n) in slots [0, n) at the entry's
  // positions) keeps what was saved with it (its attachments, for the connector's Start);
  // truncation's re-embedded rows and linked chunks do not.
  if (plan.n_linked == 0 && !r.truncation.active && plan.segments.size() == 1) {
    const store::LoadSegment& seg = plan.segments.front();
    const store::KvEntry& meta = seg.source->meta();
    if (seg.src_row == 0 && seg.dst_slot == 0 && seg.n == plan.n_cached && meta.n_tokens() >= plan.n_cached &&
        std::equal(plan.positions.begin(), plan.positions.begin() + plan.n_cached, meta.positions.begin()) &&
        std::equal(plan.tokens.begin(), plan.tokens.begin() + plan.n_cached, meta.tokens.begin())) {
      r.reused.n_as_is = plan.n_cached;
      r.reused.attachment = [source = seg.source](std::string_view kind) { return source->attachment(kind); };
    }
  }
  EnsureFree(BlocksFor(plan.n_cached), nullptr);
  auto seq = std::make_unique<kv::SequenceKv>(&pool_);
  Status st = seq->Append(plan.tokens.data(), plan.positions.data(), plan.n_cached);
  ATTIC_CHECK(st.ok());  // guaranteed by the admission's availability check
  const bool queued = plan.segments.front().source->queued();
  if (plan.n_linked > 0) {
    // Linked chunks: the slots the forward computes in place, their hooks, and how many
    // of them held cached KV (recomputed to link it).
    r.link = std::make_unique<pic::LinkRun>(r.req.link->options, plan.linked, plan.link_from, plan.n_cached, seq.get());
    r.n_cached = plan.link_from + plan.n_linked;  // before what is recomputed (Running::usage)
  } else {
    r.n_cached = plan.n_cached;
  }
  auto turn = store_->NewTurn(r.req.tenant, r.req.session_id, r.req.session_ttl_ms);
  if (r.unsaved_link()) turn->Invalidate();
  const store::Preload mode = options_.kv_preload;
  turn->Load(std::move(plan.segments), seq->block_table(), seq->positions(), std::max(r.max_slots, plan.n_cached),
             mode, engine_.threads());
  ++load_stats_.loads;
  if (queued) ++load_stats_.write_buffer_loads;
  if (mode != store::Preload::kSync) {
    ++load_stats_.layerwise_loads;
  } else {
    CountFinishedLoad(*turn);
  }
  r.kv = std::move(seq);
  r.turn = std::move(turn);
  if (r.turn->load_failed()) {  // a sync load whose streamed read broke off
    RecomputeFailedLoad(r);
    return;
  }
  // Counted as reused by the request's first step, once every layer entered (a layer-wise
  // load's streamed read may still break off there).
  r.reuse_pending = r.n_cached - (r.link != nullptr ? r.link->recomputed() : 0);
}

void Scheduler::RecomputeFailedLoad(Running& r) {
  ++load_stats_.failed_loads;
  r.reuse_pending = 0;  // nothing of it was reused
  r.turn->WaitLoad();  // a failed load publishes every layer: this returns at once
  Log(LogLevel::kWarn, "request %llu: stored KV could not be read (%s); recomputing its prompt",
      static_cast<unsigned long long>(r.id), r.turn->load_failure().ToString().c_str());
  r.turn.reset();  // before the blocks it entered into go
  const bool unsaved = r.unsaved_link();  // the decision StartFromStore made
  r.kv = std::make_unique<kv::SequenceKv>(&pool_);
  r.link.reset();
  r.compute_next = 0;
  r.n_cached = 0;
  // The features' states saw the broken rows (and may hold what was stored with them):
  // they start anew (once started; else as they start, TryAdmit).
  if (r.started) {
    RestartStates(r);
  } else {
    r.restart = true;
  }
  r.turn = store_->NewTurn(r.req.tenant, r.req.session_id, r.req.session_ttl_ms);
  if (unsaved) r.turn->Invalidate();
  r.turn->Reserve(r.max_slots);
}

void Scheduler::RestartStates(Running& r) {
  Status st = connector_->Start(r.seq, r.kv.get(), kv::KvReused{});
  ATTIC_CHECK(st.ok());  // a sequence that loaded stored KV reserved nothing a restart could lack
}

void Scheduler::CountFinishedLoad(store::Turn& turn) {
  double secs = 0;
  int rows = 0;
  uint64_t bytes = 0;
  if (turn.CollectLoad(&secs, &rows, &bytes)) {
    load_stats_.enter_seconds += secs;
    load_stats_.entered_bytes += bytes;
  }
}

void Scheduler::SaveToStore(Running& r, bool keep_rows, const std::vector<kv::KvAttachment>& kept) {
  if (store_ == nullptr || !options_.store_save || !r.kv || !r.turn) return;
  std::vector<store::EntryAttachment> attachments;
  for (const kv::KvAttachment& a : kept) attachments.push_back({a.kind, a.bytes});
  r.turn->Commit(r.kv->tokens(), r.kv->positions(), keep_rows, std::move(attachments));
}

// REQUIRES: mu_ held (called from Admit).
void Scheduler::HintStore() {
  std::vector<store::QueuedJob> jobs;
  for (const auto& w : waiting_) {
    if (static_cast<int>(jobs.size()) >= options_.store_lookahead) break;
    jobs.push_back({w->req.tenant, w->req.session_id, w->store_tokens(), static_cast<int>(w->prompt->size())});
    // The context-cache chunks it links, by key, right after it.
    if (w->req.link != nullptr) pic::AppendLinkedJobs(*w->req.link, w->req.tenant, &jobs);
  }
  const bool any = !jobs.empty();
  store_->SetLookAhead(std::move(jobs));
  if (any) store_->RequestPrefetch();
}

}  // namespace attic::engine
