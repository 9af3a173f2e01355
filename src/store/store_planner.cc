// StorePlanner (store_planner.h): stored KV and the turn of a sequence behind the KV
// connector. How the store finds, fetches, shares and enters KV is the store's business
// (kv_store.h, turn.h); this file plans slots and drives the turn.
#include "attic/store/store_planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "attic/core/log.h"

namespace attic::store {

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What the store looks a request's KV up with: a truncated prompt's store view, or the prompt.
const std::shared_ptr<const std::vector<int32_t>>& StoreTokens(const kv::KvRequest& r,
                                                               const std::shared_ptr<const Truncation>& t) {
  return t != nullptr ? t->store_view : r.prompt;
}

}  // namespace

// The turn of one sequence and its saver hooks.
struct StorePlanner::Seq final : kv::KvSeqState, kv::LayerHooks {
  kv::LayerHooks* hooks(bool decoding) override {
    if (turn == nullptr) return nullptr;
    first_new = kv->n_slots();  // asked before the step's forward: its rows go after these
    return this;
  }
  // Every layer's new pre-RoPE K and V go to the turn -- saving to the store is a hook;
  // it reads the K/V and changes nothing.
  void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kv) override {
    if (rows.n_rows > 0 && rows.slots[0] >= first_new) {  // appended (the common case: every row)
      turn->Append(layer, kv.k_pre_rope, kv.v, rows.n_rows);
      return;
    }
    for (int i = 0; i < rows.n_rows; ++i) {
      const float* k = kv.k_pre_rope + i * kv_dim;
      const float* v = kv.v + i * kv_dim;
      if (rows.slots[i] < first_new) {
        turn->Write(layer, rows.slots + i, k, v, 1);
      } else {
        turn->Append(layer, k, v, 1);
      }
    }
  }

  // Declared after nothing that owns blocks: destroying it waits for a load still
  // writing into the sequence's blocks (Turn's destructor).
  std::unique_ptr<Turn> turn;
  const kv::SequenceKv* kv = nullptr;
  size_t kv_dim = 0;
  int first_new = 0;       // the step's first appended slot (rows below recompute in place)
  int reuse_pending = 0;   // reused tokens of a load, recorded once it entered
  bool extended = false;   // its slots took stored KV an extension entered (linked chunks)
  bool save = true;        // its turn is saved (an extension may say not; kept on restart)
};

StoredPlan PlanStoredPrefix(std::shared_ptr<const KvSource> source, int n) {
  StoredPlan p;
  if (n <= 0) return p;
  const KvEntry& meta = source->meta();
  p.tokens.assign(meta.tokens.begin(), meta.tokens.begin() + n);
  p.positions.assign(meta.positions.begin(), meta.positions.begin() + n);
  p.segments.push_back({std::move(source), 0, n, 0});
  p.n_cached = n;
  return p;
}

StoredPlan PlanTruncated(const Truncation& t, std::shared_ptr<const KvSource> source, int common, int cap,
                         const std::vector<int32_t>& prompt) {
  StoredPlan p;
  // Entry rows in slot order: the kept head, then the tail after the dropped tokens.
  const int head = std::min({common, t.keep, cap});
  const int tail_from = t.keep + t.skip;
  const int tail = std::max(0, std::min(common - tail_from, cap - head));
  if (common < t.keep) {  // the entry ends inside the kept head: only that
    if (head > 0) p.segments.push_back({source, 0, head, 0});
  } else {
    if (head > 0) p.segments.push_back({source, 0, head, 0});
    if (tail > 0) p.segments.push_back({source, tail_from, tail, head});
  }
  p.n_cached = head + (common < t.keep ? 0 : tail);
  if (p.n_cached == 0) return StoredPlan{};
  p.tokens.assign(prompt.begin(), prompt.begin() + p.n_cached);
  p.positions.resize(p.n_cached);
  for (int i = 0; i < p.n_cached; ++i) p.positions[i] = i;
  return p;
}

StorePlanner::StorePlanner(StorePlannerOptions options) : options_(std::move(options)), store_(*options_.store) {
  if (!store_.has_compute_buffer()) store_.AttachComputeBuffer(options_.pool, options_.rope);
  store_.SetReadBuffer(options_.read_buffer_bytes, options_.min_reuse_tokens);
}

StorePlanner::~StorePlanner() = default;

// --- Check: decoupled truncation -------------------------------------------------------

Status StorePlanner::Check(kv::KvRequest& request, kv::KvLimits* limits) {
  if (options_.truncate_ratio <= 0) return OkStatus();
  const int limit = std::min(options_.context_length, limits->max_slots);
  const int n = static_cast<int>(request.prompt->size());
  if (n <= limit || limit < 2) return OkStatus();
  if (request.prompt_logits) {
    return OutOfRangeError("prompt of " + std::to_string(n) + " tokens exceeds the context window of " +
                           std::to_string(options_.context_length) + " tokens (prompt logprobs do not truncate)");
  }
  TruncatePrompt(request, limit - 1);
  return OkStatus();
}

void StorePlanner::TruncatePrompt(kv::KvRequest& request, int limit) const {
  const std::vector<int32_t>& p = *request.prompt;
  const int n = static_cast<int>(p.size());
  const int keep = std::clamp(options_.truncate_keep_first, 0, limit / 2);
  // Sticky: where the session's stored entry resumes after its kept head, the same
  // tokens were dropped before; start from there.
  int o = keep;
  if (!request.session_id.empty()) {
    auto stored = store_.SessionTokens(request.tenant, request.session_id);
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
  auto t = std::make_shared<Truncation>();
  t->keep = keep;
  t->skip = skip;
  auto view = std::make_shared<std::vector<int32_t>>(p.begin(), p.begin() + keep);
  view->insert(view->end(), p.begin() + o, p.end());
  t->store_view = std::move(view);
  auto kept = std::make_shared<std::vector<int32_t>>(p.begin(), p.begin() + keep);
  kept->insert(kept->end(), p.begin() + o + skip, p.end());
  t->dropped = n - static_cast<int>(kept->size());
  request.prompt = std::move(kept);
  request.options.Set(std::shared_ptr<const Truncation>(std::move(t)));
}

// --- Match: saves the head waits for; the look-ahead ------------------------------------

void StorePlanner::Match(const kv::KvQueue& queue, kv::KvAdmission* head) {
  if (head != nullptr) {
    // A conversation's next turn whose previous turn is still being saved reads that
    // turn's KV from the write buffer. A lookup that cannot (no session id: a prefix
    // search; truncation) and would wait for a queued save waits in the queue (first
    // come, first served) rather than blocking the step loop in the store's lookup while
    // other sequences could decode; with nothing running, the lookup's wait blocks
    // nobody (and the loop does not spin).
    const kv::KvRequest& r = queue.waiting.front()->request;
    const auto t = r.options.Get<Truncation>();
    if (!queue.idle && store_.MustWaitForSave(r.tenant, r.session_id, *StoreTokens(r, t), /*read_queued=*/t == nullptr)) {
      if (r.id != last_deferred_) ++stats_.deferred_for_save;
      last_deferred_ = r.id;
      head->ready = false;
    }
    return;
  }
  for (double s : queue.prefill_seconds_per_token) store_.ReportPrefillRate(s);
  std::vector<QueuedJob> jobs;
  for (const kv::KvSeq* w : queue.waiting) {
    if (static_cast<int>(jobs.size()) >= options_.lookahead) break;
    const kv::KvRequest& r = w->request;
    jobs.push_back({r.tenant, r.session_id, StoreTokens(r, r.options.Get<Truncation>()),
                    static_cast<int>(r.prompt->size())});
    // What else it reads by key (linked chunks), right after it.
    if (options_.extension != nullptr) options_.extension->AppendJobs(*w, &jobs);
  }
  const bool any = !jobs.empty();
  store_.SetLookAhead(std::move(jobs));
  if (any) store_.RequestPrefetch();
}

// --- Start: stored KV, or the resident's turn -------------------------------------------

StoredPlan StorePlanner::PlanStored(const kv::KvSeq& seq, int min_tokens) const {
  const kv::KvRequest& r = seq.request;
  const std::vector<int32_t>& prompt = *r.prompt;
  const auto t = r.options.Get<Truncation>();
  if (t != nullptr && options_.truncate_recompute) return StoredPlan{};  // TT: recompute what is kept
  // The session's newest state may still be in the write buffer: read through (waiting
  // for the save would block the step loop for nothing), except for a truncated prompt.
  auto hit = store_.FindForTurn(r.tenant, r.session_id, *StoreTokens(r, t), /*read_queued=*/t == nullptr);
  if (!hit) return StoredPlan{};
  // At least the last prompt token is computed, so that its logits exist.
  const int cap = static_cast<int>(prompt.size()) - 1;
  const int usable = t != nullptr ? std::min(cap, std::min(hit->n_tokens, t->keep) +
                                                      std::max(0, hit->n_tokens - t->keep - t->skip))
                                  : std::min(hit->n_tokens, cap);
  if (usable < min_tokens) return StoredPlan{};
  // The KV: fetched ahead by the read buffer, else now (a bad entry is a miss; the store
  // dropped it).
  auto src = store_.OpenForTurn(*hit);
  if (!src.ok()) return StoredPlan{};
  const kv::KvShape& shape = options_.pool->shape();
  const KvSource& s = **src;
  if (s.n_layers() != shape.n_layers || s.kv_dim() != shape.kv_dim() || s.n_rows() < hit->n_tokens ||
      s.dtype() != store_.kv_dtype())
    return StoredPlan{};
  StoredPlan plan = t != nullptr ? PlanTruncated(*t, *src, hit->n_tokens, cap, prompt) : PlanStoredPrefix(*src, usable);
  if (plan.n_cached < min_tokens) return StoredPlan{};
  return plan;
}

Status StorePlanner::Start(kv::KvSeq& seq, kv::KvSlots* slots) {
  std::unique_ptr<kv::KvSeqState>& slot = state(seq);
  // A sequence started over keeps its turn's fate (an extension's "not saved").
  const bool save = slot == nullptr || static_cast<Seq*>(slot.get())->save;
  auto s = std::make_unique<Seq>();
  s->kv_dim = options_.pool->shape().kv_dim();
  s->save = save;
  StoredPlan plan;
  std::unique_ptr<kv::SequenceKv> made;  // the slots stored KV enters, when there is some
  if (!seq.limits.whole_prompt && slots->kv == nullptr) {
    made = std::make_unique<kv::SequenceKv>(options_.pool);
    // Stored KV beats what is resident only when it covers more; the resident sequence
    // then stays for others.
    plan = PlanStored(seq, std::max(options_.min_reuse_tokens, slots->n_local + 1));
    // What an extension enters after the stored prefix (a linked prompt's chunks), unless
    // a resident sequence's slots cover what it needs (a conversation's later turn).
    StoredKvExtension* ext = options_.extension;
    if (ext != nullptr && slots->n_local == 0 && plan.n_cached < ext->Needs(seq)) ext->Extend(seq, made.get(), &plan);
  }
  if (!plan.empty()) {
    slots->kv = std::move(made);
    if (!LoadPlan(seq, *s, std::move(plan), slots)) {
      // The load broke off at once: the slots hold no valid KV, so the sequence starts as
      // a fresh prefill of its prompt, reusing nothing.
      slots->kv = std::make_unique<kv::SequenceKv>(options_.pool);
      slots->reused = kv::KvReused{};
      slots->n_cached = -1;
    }
  }
  const kv::SequenceKv* kv = slots->get();
  s->kv = kv;
  if (s->turn == nullptr) {
    // The slots the compute buffer reused come with the turn the resident kept.
    const kv::KvReused& reused = slots->reused;
    Seq* from = nullptr;
    if (reused.from != nullptr && static_cast<int>(reused.from->size()) > index())
      from = static_cast<Seq*>((*reused.from)[index()].get());
    const kv::KvRequest& r = seq.request;
    if (from != nullptr && from->turn != nullptr && reused.adopted) {
      s->turn = std::move(from->turn);
      s->turn->Truncate(reused.n_as_is);
      s->turn->Renew(r.session_id, r.ttl_ms);
    } else if (from != nullptr && from->turn != nullptr) {
      s->turn = from->turn->Branch(reused.n_as_is, r.session_id, r.ttl_ms);
    } else {
      s->turn = NewTurn(seq, s->save);
      if (kv->n_slots() > 0) s->turn->Invalidate();  // slots whose KV it never saw
    }
  }
  // Room for every slot the sequence can reach (a loading turn reserved it already).
  if (s->turn->loading() == nullptr) s->turn->Reserve(seq.limits.max_slots);
  slot = std::move(s);
  return OkStatus();
}

std::unique_ptr<Turn> StorePlanner::NewTurn(const kv::KvSeq& seq, bool save) const {
  auto turn = store_.NewTurn(seq.request.tenant, seq.request.session_id, seq.request.ttl_ms);
  if (!save) turn->Invalidate();
  return turn;
}

bool StorePlanner::LoadPlan(kv::KvSeq& seq, Seq& s, StoredPlan plan, kv::KvSlots* slots) {
  // A stored prefix reused as it is (entry rows [0, n) in slots [0, n) at the entry's
  // positions) keeps what was saved with it (its attachments, for the other planners'
  // Start); truncation's re-embedded rows and an extension's do not.
  if (!plan.extended && seq.request.options.Get<Truncation>() == nullptr && plan.segments.size() == 1) {
    const LoadSegment& seg = plan.segments.front();
    const KvEntry& meta = seg.source->meta();
    if (seg.src_row == 0 && seg.dst_slot == 0 && seg.n == plan.n_cached && meta.n_tokens() >= plan.n_cached &&
        std::equal(plan.positions.begin(), plan.positions.begin() + plan.n_cached, meta.positions.begin()) &&
        std::equal(plan.tokens.begin(), plan.tokens.begin() + plan.n_cached, meta.tokens.begin())) {
      slots->reused.n_as_is = plan.n_cached;
      slots->reused.attachment = [source = seg.source](std::string_view kind) { return source->attachment(kind); };
    }
  }
  kv::SequenceKv* kv = slots->kv.get();
  slots->make_room((plan.n_cached + options_.pool->shape().block_size - 1) / options_.pool->shape().block_size);
  Status st = kv->Append(plan.tokens.data(), plan.positions.data(), plan.n_cached);
  ATTIC_CHECK(st.ok());  // guaranteed by the admission's availability check
  const bool queued = plan.segments.front().source->queued();
  const int n_stored = plan.n_stored >= 0 ? plan.n_stored : plan.n_cached;
  slots->n_cached = n_stored;
  s.extended = plan.extended;
  s.save = plan.save;
  s.turn = NewTurn(seq, s.save);
  const Preload mode = options_.preload;
  s.turn->Load(std::move(plan.segments), kv->block_table(), kv->positions(),
               std::max(seq.limits.max_slots, plan.n_cached), mode, *options_.threads);
  ++stats_.loads;
  if (queued) ++stats_.write_buffer_loads;
  if (mode != Preload::kSync) {
    ++stats_.layerwise_loads;
  } else {
    CountFinishedLoad(*s.turn);
  }
  if (s.turn->load_failed()) {  // a sync load whose streamed read broke off
    NoteFailedLoad(seq, s);
    return false;
  }
  // Counted as reused by the request's first step, once every layer entered (a layer-wise
  // load's streamed read may still break off there).
  s.reuse_pending = n_stored - plan.n_recomputed;
  return true;
}

void StorePlanner::NoteFailedLoad(const kv::KvSeq& seq, Seq& s) {
  ++stats_.failed_loads;
  s.reuse_pending = 0;  // nothing of it was reused
  s.turn->WaitLoad();   // a failed load publishes every layer: this returns at once
  Log(LogLevel::kWarn, "request %llu: stored KV could not be read (%s); recomputing its prompt",
      static_cast<unsigned long long>(seq.request.id), s.turn->load_failure().ToString().c_str());
  s.turn.reset();  // before the blocks it entered into go
  s.extended = false;
}

void StorePlanner::CountFinishedLoad(Turn& turn) {
  double secs = 0;
  int rows = 0;
  uint64_t bytes = 0;
  if (turn.CollectLoad(&secs, &rows, &bytes)) {
    stats_.enter_seconds += secs;
    stats_.entered_bytes += bytes;
  }
}

// --- WaitLayer: the layer-wise load --------------------------------------------------------

double StorePlanner::WaitLayer(kv::KvSeq& seq, int layer) {
  auto* s = static_cast<Seq*>(state(seq).get());
  if (s == nullptr || s->turn == nullptr) return 0;
  if (layer < options_.pool->shape().n_layers) {
    LoadJob* job = s->turn->loading();
    if (job == nullptr) return 0;
    if (job->inline_loader != nullptr) {  // entered now, by the step's own threads
      const auto t0 = std::chrono::steady_clock::now();
      s->turn->WaitLayer(layer);
      return Since(t0);
    }
    const double waited = s->turn->WaitLayer(layer);
    stats_.wait_seconds += waited;
    return waited;
  }
  // After the step: a load that entered every layer counts its tokens as reused now; one
  // whose streamed read broke off left the slots without their KV, so what the step
  // computed for the sequence is discarded and it starts over.
  if (s->turn->loading() != nullptr) CountFinishedLoad(*s->turn);
  if (s->turn->load_failed()) {
    NoteFailedLoad(seq, *s);
    seq.lost = true;
  } else if (s->reuse_pending > 0 && s->turn->loading() == nullptr) {
    store_.RecordReuse(s->reuse_pending);
    s->reuse_pending = 0;
  }
  return 0;
}

// --- Finish: the save ---------------------------------------------------------------------

void StorePlanner::Finish(kv::KvSeq& seq, const kv::SequenceKv* kv, kv::KvKeep* keep) {
  std::unique_ptr<kv::KvSeqState>& slot = state(seq);
  auto* s = static_cast<Seq*>(slot.get());
  if (s == nullptr) return;
  if (s->turn != nullptr) stats_.wait_seconds += s->turn->WaitLoad();  // stored KV still entering (cancelled early)
  // A sequence with an extension's KV whose turn is not saved (a linked prompt outside a
  // conversation) does not stay resident either: a sequence adopting or copying it could
  // not be saved.
  if (s->extended && s->turn != nullptr && !s->turn->valid()) keep->resident = false;
  // The turn's save is queued before the requester hears of the finish: a lookup it
  // makes next (the next turn, a linked chunk just prefilled) then finds or waits for it.
  // A resident sequence's turn keeps its rows (else they move into the save).
  if (options_.save && kv != nullptr && kv->n_slots() > 0 && s->turn != nullptr) {
    std::vector<EntryAttachment> attachments;
    for (const kv::KvAttachment& a : keep->attachments) attachments.push_back({a.kind, a.bytes});
    s->turn->Commit(kv->tokens(), kv->positions(), keep->resident, std::move(attachments));
  }
  if (!keep->resident) slot.reset();  // else the turn stays with the resident sequence
}

void StorePlanner::PublishStats(kv::KvStats* stats) const { stats->Set(std::make_shared<const KvLoadStats>(this->stats())); }

KvLoadStats StorePlanner::stats() const {
  KvLoadStats s = stats_;
  // The read buffer and the measured rates are the store's.
  const KvStore::ReadBufferStats rb = store_.ReadBuffer();
  s.staged = rb.staged;
  s.staged_used = rb.staged_used;
  s.fetch_seconds = rb.fetch_seconds;
  s.t_load_per_token = rb.t_load_per_token;
  s.t_prefill_per_token = rb.t_prefill_per_token;
  return s;
}

}  // namespace attic::store
