// Scheduler::Step: one forward over the decode tokens of every running sequence plus
// prefill chunks, then sampling, stop handling and UTF-8-safe streaming (the same rules
// as Session::Generate).
#include <algorithm>
#include <cmath>

#include "attic/core/log.h"
#include "engine/scheduler_internal.h"

namespace attic::engine {

namespace {

double Seconds(SchedClock::duration d) { return std::chrono::duration<double>(d).count(); }

// What one batch entry hooks into the step's forward (null / 0: nothing).
struct EntryHooks {
  kv::LayerHooks* link = nullptr;     // CacheBlend's selection (a linked prompt's prefill)
  const kv::KvSeq* seq = nullptr;     // the KV connector's states (their hooks, in planner order)
  bool decoding = false;              // ... at a decode step
  store::Turn* turn = nullptr;    // with a KV store: the turn that keeps the new K and V
  int first_new = 0;              // the entry's first appended slot (rows below recompute in place)
  bool any() const { return link != nullptr || (seq != nullptr && seq->has_hooks(decoding)) || turn != nullptr; }
};

// The step's layer hooks. Each entry's hooks are called in this fixed order:
//   1. CacheBlend (link): compares fresh and cached KV, narrows and drops the rows it
//      recomputes;
//   2. the KV connector's states, in planner order (kv/connector.h): e.g. a token
//      selector narrows what a decode row sees (at a prefill step it only observes),
//      after CacheBlend so that it sees what the entry's rows really attend;
//   3. the turn saver (OnKv only): every layer's new pre-RoPE K and V go to the entry's
//      turn -- saving to the store is a hook; it reads the K/V and changes nothing.
// (CacheBlend acts on a linked prompt's prefill and a selector narrows only one-row
// decode steps, so today they never narrow the same step; the order is fixed anyway.)
class StepHooks : public kv::LayerHooks {
 public:
  StepHooks(const std::vector<EntryHooks>& entries, int kv_dim) : entries_(entries), kv_dim_(kv_dim) {}
  void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kv) override {
    const EntryHooks& e = entries_[rows.entry];
    if (e.link != nullptr) e.link->OnKv(layer, rows, kv);
    if (e.seq != nullptr) e.seq->ForEachHooks(e.decoding, [&](kv::LayerHooks* h) { h->OnKv(layer, rows, kv); });
    store::Turn* t = e.turn;
    if (t == nullptr) return;
    const int first_new = e.first_new;
    if (rows.n_rows > 0 && rows.slots[0] >= first_new) {  // appended (the common case: every row)
      t->Append(layer, kv.k_pre_rope, kv.v, rows.n_rows);
      return;
    }
    const size_t kvd = kv_dim_;
    for (int i = 0; i < rows.n_rows; ++i) {
      const float* k = kv.k_pre_rope + i * kvd;
      const float* v = kv.v + i * kvd;
      if (rows.slots[i] < first_new) {
        t->Write(layer, rows.slots + i, k, v, 1);
      } else {
        t->Append(layer, k, v, 1);
      }
    }
  }
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    const EntryHooks& e = entries_[rows.entry];
    if (e.link != nullptr) e.link->BeforeAttention(layer, rows, vis);
    if (e.seq != nullptr) e.seq->ForEachHooks(e.decoding, [&](kv::LayerHooks* h) { h->BeforeAttention(layer, rows, vis); });
  }
  void AfterLayer(int layer, const kv::EntryRows& rows, uint8_t* keep) override {
    const EntryHooks& e = entries_[rows.entry];
    if (e.link != nullptr) e.link->AfterLayer(layer, rows, keep);
    if (e.seq != nullptr) e.seq->ForEachHooks(e.decoding, [&](kv::LayerHooks* h) { h->AfterLayer(layer, rows, keep); });
  }

 private:
  const std::vector<EntryHooks>& entries_;
  const size_t kv_dim_;
};

GenerationEvent TextEvent(int index, std::string text, std::vector<TokenLogprob>* logprobs) {
  GenerationEvent ev;
  ev.kind = GenerationEvent::Kind::kText;
  ev.index = index;
  ev.text = std::move(text);
  ev.logprobs = std::move(*logprobs);
  logprobs->clear();
  return ev;
}

}  // namespace

int Scheduler::Step() {
  auto remove_done = [this] {
    running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& r) { return r->done; }),
                   running_.end());
    n_running_.store(static_cast<int>(running_.size()));
  };
  auto cleanup = [this, &remove_done] {
    remove_done();
    PublishStats();
    FlushReports();
  };
  SchedClock::time_point now = SchedClock::now();
  ReapRunning(now);
  remove_done();
  Admit(now);
  if (running_.empty()) {
    cleanup();
    return 0;
  }

  // Decode rows first: every decoding sequence advances by one token each step.
  Transformer& tf = engine_.transformer();
  std::vector<BatchEntry> batch;
  std::vector<Running*> owners;
  int rows = 0;
  for (auto& r : running_) {
    if (!r->decoding) continue;
    BatchEntry e;
    e.seq = r->kv.get();
    e.tokens = {r->next_token};
    batch.push_back(std::move(e));
    owners.push_back(r.get());
    ++rows;
  }
  peak_decode_batch_ = std::max(peak_decode_batch_, rows);
  // Then prefill chunks, first come first served, within what the step has left.
  int budget = tf.max_batch_tokens() - rows;
  if (options_.max_prefill_tokens_per_step > 0) budget = std::min(budget, options_.max_prefill_tokens_per_step);
  for (auto& r : running_) {
    if (r->decoding || budget <= 0 || r->prefilled()) continue;
    BatchEntry e;
    e.seq = r->kv.get();
    int n = 0;
    if (r->link != nullptr && r->compute_next < r->link->compute_slots().size()) {
      // Linking: slots computed in place over the linked KV, in slot order.
      const std::vector<int32_t>& compute = r->link->compute_slots();
      n = std::min(static_cast<int>(compute.size() - r->compute_next), budget);
      const int32_t* slots = compute.data() + r->compute_next;
      e.slots.assign(slots, slots + n);
      for (int32_t slot : e.slots) {
        e.tokens.push_back((*r->prompt)[slot]);
        e.positions.push_back(r->kv->positions()[slot]);
      }
      r->compute_next += n;
      e.want_logits = r->prefilled();
    } else {
      const int done = r->kv->n_slots();
      const int left = static_cast<int>(r->prompt->size()) - done;
      n = std::min(left, budget);
      e.tokens.assign(r->prompt->begin() + done, r->prompt->begin() + done + n);
      e.want_logits = n == left;
      e.all_logits = r->req.prompt_logprobs;  // every row's: the next prompt token's logprob
    }
    if (r->req.prefill_only || r->req.sampling.max_tokens == 0) e.want_logits = false;
    if (r->link != nullptr) r->link->set_entry(static_cast<int>(batch.size()));
    batch.push_back(std::move(e));
    owners.push_back(r.get());
    budget -= n;
    rows += n;
  }
  if (batch.empty()) {
    cleanup();
    return 0;
  }

  // Room for the new slots: reservations guarantee that evicting resident KV suffices.
  int grow = 0;
  for (const auto& e : batch) {
    const int appended = e.slots.empty() ? static_cast<int>(e.tokens.size()) : 0;  // linking: in place
    grow += e.seq->BlocksToAppend(appended);  // with the copy of a shared last block
  }
  EnsureFree(grow, nullptr);
  // Each entry's layer hooks (StepHooks): with a KV store its new slots' pre-RoPE K and
  // V go to its turn; a linked prompt's CacheBlend and the connector's states (a token
  // selector) plug in. The forward runs with hooks when any entry has one.
  std::vector<EntryHooks> entry_hooks(owners.size());
  bool any_hooks = false;
  for (size_t i = 0; i < owners.size(); ++i) {
    EntryHooks& h = entry_hooks[i];
    if (store_ != nullptr) h.turn = owners[i]->turn.get();
    h.first_new = batch[i].seq->n_slots();
    if (!owners[i]->decoding && owners[i]->link != nullptr) h.link = owners[i]->link->hooks();
    h.seq = &owners[i]->seq;
    h.decoding = owners[i]->decoding;
    any_hooks = any_hooks || h.any();
  }
  StepHooks step_hooks(entry_hooks, pool_.shape().kv_dim());
  kv::LayerHooks* hooks = any_hooks ? &step_hooks : nullptr;
  // Layer-wise pre-loading: a sequence whose stored KV is still entering the compute
  // buffer holds layer l back until the loader has entered it (inline entering: enters
  // it now).
  std::vector<store::Turn*> loading;
  int prefill_rows = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Running* r = owners[i];
    if (r->turn && r->turn->loading() != nullptr) loading.push_back(r->turn.get());
    if (!r->decoding) prefill_rows += static_cast<int>(batch[i].tokens.size());
  }
  const SchedClock::time_point t_step = SchedClock::now();
  Status st = tf.Begin(batch);
  if (!st.ok()) {
    for (Running* r : owners) Fail(*r, InternalError("forward step failed: " + st.message()));
    cleanup();
    return 0;
  }
  double waited = 0;
  for (int l = 0; l < pool_.shape().n_layers; ++l) {
    for (store::Turn* t : loading) waited += t->WaitLayer(l);
    tf.Layer(l, hooks);
  }
  tf.Finish(&logits_);
  ++steps_;
  prompt_tokens_computed_ += static_cast<uint64_t>(prefill_rows);
  // Where each entry's logits rows start (Transformer::Finish's layout), before a failed
  // load below clears want_logits.
  std::vector<size_t>& first_row = first_row_;
  first_row.assign(batch.size() + 1, 0);
  bool any_prompt_logprobs = false;
  for (size_t i = 0; i < batch.size(); ++i) {
    const size_t kept = tf.kept_rows(static_cast<int>(i)).size();
    const size_t rows_out = batch[i].all_logits ? kept : batch[i].want_logits ? std::min<size_t>(1, kept) : 0;
    first_row[i + 1] = first_row[i] + rows_out;
    any_prompt_logprobs = any_prompt_logprobs || batch[i].all_logits;
  }
  now = SchedClock::now();
  double entered_inline = 0;  // entering done by this step's own threads
  for (store::Turn* t : loading)
    if (t->loading()->inline_loader != nullptr) entered_inline += t->loading()->enter_seconds;
  load_stats_.wait_seconds += waited;
  // The measured prefill rate (steps that are mostly prefill, own compute only), for
  // the store's read buffer (S_buf); finished loads report their entering rate.
  if (store_ != nullptr && prefill_rows >= 32 && prefill_rows * 2 >= rows)
    store_->ReportPrefillRate((Seconds(now - t_step) - waited - entered_inline) / rows);
  for (store::Turn* t : loading) CountFinishedLoad(*t);
  // A load whose streamed read broke off: the entry's rows never entered, so what the
  // step computed for that request is discarded (nothing sampled) and it starts again.
  // A load that entered every layer: its tokens count as reused now. (`loading` still
  // points at replaced turns: only its size is used below.)
  for (size_t i = 0; i < owners.size(); ++i) {
    Running& r = *owners[i];
    if (!r.turn) continue;
    if (r.turn->load_failed()) {
      RecomputeFailedLoad(r);
      batch[i].want_logits = false;
    } else if (r.reuse_pending > 0 && r.turn->loading() == nullptr) {
      store_->RecordReuse(r.reuse_pending);
      r.reuse_pending = 0;
    }
  }
  if (LogEnabled(LogLevel::kDebug)) {
    int64_t visible = 0;  // slots the step's rows attend over, summed over sequences
    for (const auto& e : batch) visible += e.seq->n_slots();
    Log(LogLevel::kDebug, "step %llu: %d decode rows, %d prefill rows, %d loading, %lld slots seen, %.1f ms (%.1f ms waiting for loads)",
        static_cast<unsigned long long>(steps_), rows - prefill_rows, prefill_rows, static_cast<int>(loading.size()),
        static_cast<long long>(visible), Seconds(now - t_step) * 1e3, waited * 1e3);
  }
  // Sampling (softmax, top-k/top-p over the vocabulary: ~0.5 ms a row at temperature >
  // 0) runs for the rows in parallel; each row has its own sampler (RNG, scratch).
  // A request reporting its prompt's logprobs: each computed prompt row gives the next
  // prompt token's (logits_processor.h).
  if (any_prompt_logprobs) {
    struct PromptRow {
      Running* r;
      const float* logits;
      int32_t token;
    };
    std::vector<PromptRow> prompt_rows;
    for (size_t i = 0; i < batch.size(); ++i) {
      Running* r = owners[i];
      if (!batch[i].all_logits || !r->req.prompt_logprobs) continue;
      const int first = entry_hooks[i].first_new;
      if (first == 0) r->prompt_logprobs.push_back({(*r->prompt)[0], std::nan(""), {}});
      const size_t n = first_row[i + 1] - first_row[i];
      for (size_t j = 0; j < n; ++j) {
        const size_t next = first + j + 1;
        if (next >= r->prompt->size()) break;
        const float* row = logits_.data() + (first_row[i] + j) * static_cast<size_t>(vocab_);
        prompt_rows.push_back({r, row, (*r->prompt)[next]});
      }
    }
    std::vector<TokenLogprob> prompt_lp(prompt_rows.size());
    engine_.threads().ParallelFor(static_cast<int64_t>(prompt_rows.size()), [&](int64_t t, int) {
      const PromptRow& p = prompt_rows[t];
      prompt_lp[t] = ComputeLogprob(p.logits, vocab_, p.token, std::max(0, p.r->req.logprobs));
    });
    for (size_t t = 0; t < prompt_rows.size(); ++t)
      prompt_rows[t].r->prompt_logprobs.push_back(std::move(prompt_lp[t]));
    for (Running* r : owners) {
      if (r->req.prompt_logprobs && !r->prompt_logprobs.empty() && r->prefilled() && !r->done) {
        GenerationEvent ev;
        ev.prompt_logprobs = std::move(r->prompt_logprobs);
        r->prompt_logprobs.clear();
        r->channel->Push(std::move(ev));
      }
    }
  }
  std::vector<Running*>& pickers = sample_rows_;
  std::vector<const float*>& rows_of = sample_logits_;
  rows_of.clear();
  pickers.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].want_logits) continue;
    pickers.push_back(owners[i]);
    rows_of.push_back(logits_.data() + (first_row[i + 1] - 1) * static_cast<size_t>(vocab_));
  }
  // A request of n choices whose prompt is now in forks: its choices sample their first
  // tokens from the same row.
  ForkChoices(&pickers, &rows_of);
  sampled_.resize(pickers.size());
  engine_.threads().ParallelFor(static_cast<int64_t>(pickers.size()), [&](int64_t t, int) {
    Running& r = *pickers[t];
    float* row = const_cast<float*>(rows_of[t]);
    if (r.req.logprobs >= 0) r.step_logprob = PrepareLogprob(row, vocab_, r.req.logprobs);
    if (r.req.processor) r.req.processor->Apply(row, vocab_);
    sampled_[t] = r.sampler.Sample(row, vocab_);
    // The sampled token is never masked: its logit is still the model's.
    if (r.req.logprobs >= 0) r.pending_logprobs.push_back(FinishLogprob(r.step_logprob, sampled_[t], row[sampled_[t]]));
  });
  for (size_t t = 0; t < pickers.size(); ++t) OnToken(*pickers[t], sampled_[t], now);
  // A prefill-only request (KVGen) is done once its prompt is in.
  for (Running* r : owners)
    if (r->req.prefill_only && !r->done && r->prefilled()) Finish(*r, "stop");
  // So is one that asked for no tokens (its prompt's logprobs only).
  for (Running* r : owners)
    if (r->req.sampling.max_tokens == 0 && !r->done && r->prefilled()) Finish(*r, "length");
  cleanup();
  return rows;
}

void Scheduler::ReapRunning(SchedClock::time_point now) {
  for (auto& r : running_) {
    if (r->done) continue;
    if (r->channel->cancelled()) {
      Report(r->TakeRecord(StatusCode::kCancelled));
      Retire(*r);
    } else if (now >= r->req.deadline) {
      Fail(*r, Status(StatusCode::kDeadlineExceeded, "request timed out after " + std::to_string(r->n_generated) +
                                                         " generated tokens"));
    }
  }
}

void Scheduler::OnToken(Running& r, int32_t token, SchedClock::time_point now) {
  if (r.n_generated == 0) {
    r.ttft_seconds = Seconds(now - r.req.arrival);
  } else {
    r.gaps.push_back(Seconds(now - r.last_token));
  }
  r.last_token = now;
  ++r.n_generated;
  if (r.req.processor) r.req.processor->Accept(token);
  const GenerationStream::Step step = r.stream.Push(token);
  if (step == GenerationStream::Step::kStopToken && !r.pending_logprobs.empty()) r.pending_logprobs.pop_back();
  if (step != GenerationStream::Step::kContinue || (r.req.processor && r.req.processor->Complete())) {
    Finish(r, "stop");
    return;
  }
  if (std::string piece = r.stream.TakeReady(); !piece.empty())
    r.channel->Push(TextEvent(r.choice, std::move(piece), &r.pending_logprobs));
  if (r.n_generated >= r.req.sampling.max_tokens || r.kv->n_slots() >= r.max_slots) {
    Finish(r, "length");
    return;
  }
  r.next_token = token;
  r.decoding = true;
}

void Scheduler::Finish(Running& r, const std::string& reason) {
  if (std::string rest = r.stream.TakeRest(/*flush=*/reason == "length"); !rest.empty() || !r.pending_logprobs.empty())
    r.channel->Push(TextEvent(r.choice, std::move(rest), &r.pending_logprobs));
  GenerationEvent ev;
  ev.kind = GenerationEvent::Kind::kFinish;
  ev.index = r.choice;
  ev.finish_reason = reason;
  ev.stop_string = r.stream.matched_stop();
  ev.usage = r.usage();
  Report(r.TakeRecord(StatusCode::kOk, reason));
  // The turn's save is queued before the requester hears of the finish: a lookup it
  // makes next (the next turn, a linked chunk just prefilled) then finds or waits for it.
  std::shared_ptr<ResultChannel> channel = r.channel;
  Retire(r);
  channel->Push(std::move(ev));
}

void Scheduler::Fail(Running& r, const Status& status) {
  GenerationEvent ev;
  ev.kind = GenerationEvent::Kind::kError;
  ev.index = r.choice;
  ev.status = status;
  ev.usage = r.usage();
  r.channel->Push(std::move(ev));
  Report(r.TakeRecord(status.code()));
  Retire(r);
}

}  // namespace attic::engine
