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

// The step's layer hooks: each entry's are its KV connector states' (kv/connector.h),
// asked once before the forward begins and called in planner order at each hook point
// (e.g. a prefill's selective recompute narrows the rows before a token selector sees
// what they attend; the store's saver records every layer's new K and V).
class StepHooks : public kv::LayerHooks {
 public:
  // Entry i's hooks are hooks[first[i], first[i + 1]).
  StepHooks(const std::vector<kv::LayerHooks*>& hooks, const std::vector<size_t>& first)
      : hooks_(hooks), first_(first) {}
  void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kv) override {
    for (size_t i = first_[rows.entry]; i < first_[rows.entry + 1]; ++i) hooks_[i]->OnKv(layer, rows, kv);
  }
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    for (size_t i = first_[rows.entry]; i < first_[rows.entry + 1]; ++i) hooks_[i]->BeforeAttention(layer, rows, vis);
  }
  void AfterLayer(int layer, const kv::EntryRows& rows, uint8_t* keep) override {
    for (size_t i = first_[rows.entry]; i < first_[rows.entry + 1]; ++i) hooks_[i]->AfterLayer(layer, rows, keep);
  }

 private:
  const std::vector<kv::LayerHooks*>& hooks_;
  const std::vector<size_t>& first_;
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
    const std::vector<int32_t>* compute = r->seq.compute_slots();
    if (compute != nullptr && r->compute_next < compute->size()) {
      // Slots a planner has computed in place over the KV it entered, in slot order.
      n = std::min(static_cast<int>(compute->size() - r->compute_next), budget);
      const int32_t* slots = compute->data() + r->compute_next;
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
    const int appended = e.slots.empty() ? static_cast<int>(e.tokens.size()) : 0;  // computed in place
    grow += e.seq->BlocksToAppend(appended);  // with the copy of a shared last block
  }
  resident_->EnsureFree(grow);
  // Each entry's layer hooks (StepHooks): its states' (the store's turn saver, a
  // selective recompute, a token selector). The forward runs with hooks when any entry
  // has one.
  std::vector<kv::LayerHooks*>& entry_hooks = step_hooks_;
  std::vector<size_t>& hooks_from = step_hooks_from_;
  std::vector<int>& first_new = first_new_;  // each entry's first appended slot
  entry_hooks.clear();
  hooks_from.assign(1, 0);
  first_new.resize(owners.size());
  int prefill_rows = 0;
  for (size_t i = 0; i < owners.size(); ++i) {
    first_new[i] = batch[i].seq->n_slots();
    owners[i]->seq.ForEachHooks(owners[i]->decoding, [&](kv::LayerHooks* h) { entry_hooks.push_back(h); });
    hooks_from.push_back(entry_hooks.size());
    if (!owners[i]->decoding) prefill_rows += static_cast<int>(batch[i].tokens.size());
  }
  StepHooks step_hooks(entry_hooks, hooks_from);
  kv::LayerHooks* hooks = entry_hooks.empty() ? nullptr : &step_hooks;
  const SchedClock::time_point t_step = SchedClock::now();
  Status st = tf.Begin(batch);
  if (!st.ok()) {
    for (Running* r : owners) Fail(*r, InternalError("forward step failed: " + st.message()));
    cleanup();
    return 0;
  }
  // Layer-wise pre-loading: a sequence whose stored KV is still entering the compute
  // buffer holds layer l back until it is in (KvConnector::WaitLayer).
  const int n_layers = pool_.shape().n_layers;
  double held = 0;  // seconds the step spent waiting for (or entering) KV
  for (int l = 0; l < n_layers; ++l) {
    for (Running* r : owners) held += connector_->WaitLayer(r->seq, l);
    tf.Layer(l, hooks);
  }
  tf.Finish(&logits_);
  ++steps_;
  prompt_tokens_computed_ += static_cast<uint64_t>(prefill_rows);
  // Where each entry's logits rows start (Transformer::Finish's layout), before a lost
  // sequence below clears want_logits.
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
  // The measured prefill rate (steps that are mostly prefill, own compute only), handed
  // to the connector with the queue (a read buffer sizes itself by it).
  if (prefill_rows >= 32 && prefill_rows * 2 >= rows) prefill_rates_.push_back((Seconds(now - t_step) - held) / rows);
  // After the last layer: what the step waited for arrived, or a sequence's slots lost
  // their KV (a load broke off): what the step computed for it is discarded (nothing
  // sampled) and it starts over.
  for (size_t i = 0; i < owners.size(); ++i) {
    Running& r = *owners[i];
    connector_->WaitLayer(r.seq, n_layers);
    if (r.seq.lost) {
      StartOver(r);
      batch[i].want_logits = false;
    }
  }
  if (LogEnabled(LogLevel::kDebug)) {
    int64_t visible = 0;  // slots the step's rows attend over, summed over sequences
    for (const auto& e : batch) visible += e.seq->n_slots();
    Log(LogLevel::kDebug, "step %llu: %d decode rows, %d prefill rows, %lld slots seen, %.1f ms (%.1f ms waiting for KV)",
        static_cast<unsigned long long>(steps_), rows - prefill_rows, prefill_rows, static_cast<long long>(visible),
        Seconds(now - t_step) * 1e3, held * 1e3);
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
      const int first = first_new[i];
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

void Scheduler::StartOver(Running& r) {
  r.seq.lost = false;
  r.seq.limits.whole_prompt = true;
  r.compute_next = 0;
  r.n_cached = 0;
  kv::KvSlots slots;
  slots.kv = std::make_unique<kv::SequenceKv>(&pool_);
  Status st = connector_->Start(r.seq, &slots);
  ATTIC_CHECK(st.ok());  // a sequence that loaded stored KV reserved nothing a restart could lack
  r.kv = std::move(slots.kv);
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
  // makes next (the next turn, a context chunk just prefilled) then finds or waits for it.
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
