// Scheduler: the waiting queue, admission against the KV budget (reusing resident KV,
// resident_set.h, and what the KV connector supplies), and retiring finished sequences.
// The step itself (batching, sampling, streaming) is in scheduler_step.cc.
#include <algorithm>
#include <cmath>

#include "attic/engine/kv_features.h"
#include "engine/scheduler_internal.h"

namespace attic::engine {

namespace {

double Seconds(SchedClock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& options)
    : engine_(engine),
      options_(options),
      pool_(engine.kv_pool()),
      block_size_(engine.kv_pool().shape().block_size),
      vocab_(engine.model().config().vocab_size),
      max_slots_(static_cast<int>(std::min<int64_t>(
          engine.context_length(), static_cast<int64_t>(engine.kv_pool().n_blocks()) * engine.kv_pool().shape().block_size))) {
  // Every decoding sequence needs one row of a step; keep at least one row for prefill.
  const int rows = engine_.transformer().max_batch_tokens();
  options_.max_running = std::clamp(options_.max_running, 1, std::max(1, rows - 1));
  options_.max_waiting = std::max(0, options_.max_waiting);
  options_.max_resident = std::max(0, options_.max_resident);
  options_.min_reuse_tokens = std::max(1, options_.min_reuse_tokens);
  options_.channel_capacity = std::max<size_t>(2, options_.channel_capacity);
  resident_ = std::make_unique<ResidentSet>(pool_, options_.max_resident, options_.min_reuse_tokens);
  if (!options_.kv_connector) options_.kv_connector = KvFeatures();
  connector_ = options_.kv_connector(engine_, options_, nullptr);
  PublishStats();
}

Scheduler::~Scheduler() = default;

int Scheduler::BlocksFor(int n_slots) const { return (n_slots + block_size_ - 1) / block_size_; }

int Scheduler::BlocksForChoices(int n_prompt, int max_slots, int n) const {
  // The prompt's full blocks are shared; a partly filled last one is copied by each
  // choice that writes into it (one copy is never needed: the last owner writes in
  // place, counted anyway so that the reservation never runs short mid-generation).
  const int shared = std::min(n_prompt, max_slots) / block_size_;
  return shared + n * (BlocksFor(max_slots) - shared);
}

std::vector<int32_t> Scheduler::StopIds(const GenerationRequest& req) const {
  std::vector<int32_t> stop_ids;
  if (!req.ignore_eos) stop_ids = engine_.stop_token_ids();
  stop_ids.insert(stop_ids.end(), req.sampling.stop_token_ids.begin(), req.sampling.stop_token_ids.end());
  return stop_ids;
}

StatusOr<std::shared_ptr<ResultChannel>> Scheduler::Submit(GenerationRequest request) {
  const int n_prompt = static_cast<int>(std::min<size_t>(request.prompt.size(), 1u << 30));
  if (n_prompt == 0) return InvalidArgumentError("prompt is empty");
  auto prompt = std::make_shared<const std::vector<int32_t>>(std::move(request.prompt));
  request.prompt.clear();
  // The features' checks and limits (kv/connector.h): e.g. a sequence whose KV a planner
  // keeps outside the compute buffer is bounded by the window, not the KV budget; a
  // prompt longer than the window may come back shorter (the store keeps what it drops).
  kv::KvSeq seq;
  seq.request.tenant = request.tenant;
  seq.request.session_id = request.session_id;
  seq.request.ttl_ms = request.session_ttl_ms;
  seq.request.prompt = prompt;
  seq.request.n_prompt = n_prompt;
  seq.request.max_new_tokens = request.sampling.max_tokens;
  seq.request.n_choices = request.n;
  seq.request.samples = !request.prefill_only;
  seq.request.prompt_logits = request.prompt_logprobs;
  seq.request.options = request.kv_options;
  seq.limits.max_slots = max_slots_;
  seq.limits.whole_prompt = request.prefill_only || request.prompt_logprobs;
  ATTIC_RETURN_IF_ERROR(connector_->Check(seq.request, &seq.limits));
  const int max_slots = seq.limits.max_slots;
  const int limit = std::min(engine_.context_length(), max_slots);
  const bool shortened = seq.request.prompt->size() < prompt->size();
  if (n_prompt > engine_.context_length() && !shortened) {
    return OutOfRangeError("prompt of " + std::to_string(n_prompt) + " tokens exceeds the context window of " +
                           std::to_string(engine_.context_length()) + " tokens");
  }
  if (n_prompt > max_slots && !shortened) {
    return OutOfRangeError("prompt of " + std::to_string(n_prompt) + " tokens exceeds the KV budget of " +
                           std::to_string(max_slots) + " tokens");
  }
  ATTIC_RETURN_IF_ERROR(request.sampling.Validate());
  if (request.sampling.max_tokens < (request.prompt_logprobs ? 0 : 1))
    return InvalidArgumentError("max_tokens must be >= 1");
  if (request.n < 1 || request.n > kMaxChoices)
    return InvalidArgumentError("n must be between 1 and " + std::to_string(kMaxChoices));
  if (request.n > 1) {
    if (request.n > options_.max_running)
      return InvalidArgumentError("n = " + std::to_string(request.n) + " choices exceed the " +
                                  std::to_string(options_.max_running) + " sequences this server runs at once");
    if (request.processor != nullptr) return InvalidArgumentError("n > 1 is not supported with constrained decoding");
    if (!seq.limits.no_choices.empty())
      return InvalidArgumentError("n > 1 is not supported with " + seq.limits.no_choices);
    if (request.prefill_only || request.sampling.max_tokens == 0)
      return InvalidArgumentError("n > 1 needs max_tokens >= 1");
    const int64_t want = static_cast<int64_t>(std::min(n_prompt, limit)) + request.sampling.max_tokens - 1;
    const int slots = static_cast<int>(std::min<int64_t>(want, max_slots));
    const int blocks = BlocksForChoices(std::min(n_prompt, limit), slots, request.n);
    if (blocks > pool_.n_blocks()) {
      return OutOfRangeError(std::to_string(request.n) + " choices of up to " + std::to_string(slots) +
                             " tokens each need " + std::to_string(blocks) + " KV blocks, more than the " +
                             std::to_string(pool_.n_blocks()) + " the KV cache holds; lower n or max_tokens");
    }
  }
  if (request.logprobs > 20) return InvalidArgumentError("logprobs must be <= 20");
  ATTIC_RETURN_IF_ERROR(CheckTokenIds(engine_.model().config(), *prompt));
  if (request.arrival == SchedClock::time_point{}) request.arrival = SchedClock::now();
  auto w = std::make_unique<Waiting>();
  w->prompt = seq.request.prompt;
  seq.request.n_prompt = static_cast<int>(w->prompt->size());
  w->seq = std::move(seq);
  w->req = std::move(request);
  w->channel = std::make_shared<ResultChannel>(options_.channel_capacity);
  std::shared_ptr<ResultChannel> channel = w->channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return UnavailableError("the server is shutting down");
    if (static_cast<int>(waiting_.size()) >= options_.max_waiting) {
      return ResourceExhaustedError("the waiting queue is full (" + std::to_string(options_.max_waiting) +
                                    " requests); retry later");
    }
    w->id = next_id_++;
    w->seq.request.id = w->id;
    waiting_.push_back(std::move(w));
    stats_.waiting = static_cast<int>(waiting_.size());
  }
  work_cv_.notify_one();
  return channel;
}

std::vector<WaitingRequestView> Scheduler::LookAhead(int n) const {
  std::vector<WaitingRequestView> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : waiting_) {
    if (static_cast<int>(out.size()) >= n) break;
    WaitingRequestView v;
    v.id = w->id;
    v.tenant = w->req.tenant;
    v.session_id = w->req.session_id;
    v.prompt = w->prompt;
    v.max_tokens = w->req.sampling.max_tokens;
    v.arrival = w->req.arrival;
    out.push_back(std::move(v));
  }
  return out;
}

SchedulerStats Scheduler::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  s.waiting = static_cast<int>(waiting_.size());
  return s;
}

bool Scheduler::WaitForWork(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto has_work = [this] { return shutdown_ || !waiting_.empty() || n_running_.load() > 0; };
  work_cv_.wait_for(lock, timeout, has_work);
  return !shutdown_ && (!waiting_.empty() || n_running_.load() > 0);
}

void Scheduler::Shutdown() {
  std::deque<std::unique_ptr<Waiting>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    dropped.swap(waiting_);
  }
  work_cv_.notify_all();
  const Status st = UnavailableError("the server is shutting down");
  for (auto& w : dropped) {
    GenerationEvent ev;
    ev.kind = GenerationEvent::Kind::kError;
    ev.status = st;
    w->channel->Push(std::move(ev));
  }
  for (auto& r : running_) {
    if (!r->done) Fail(*r, st);
  }
  running_.clear();
  n_running_.store(0);
  PublishStats();
  FlushReports();
}

// --- KV accounting -------------------------------------------------------------------

int Scheduler::OutstandingReservation() const {
  int n = 0;
  for (const auto& r : running_) {
    if (r->done || !r->kv) continue;
    n += std::max(0, r->reserved_blocks - r->seq.blocks_held(*r->kv));
  }
  return n;
}

int Scheduler::AvailableBlocks() const { return pool_.n_free() + resident_->blocks() - OutstandingReservation(); }

int Scheduler::RunningSequences() const {
  int n = 0;
  for (const auto& r : running_) n += r->forked ? 1 : r->req.n;  // a request's choices to come count
  return n;
}

// --- Reuse and admission ---------------------------------------------------------------

bool Scheduler::TryAdmit(Waiting& w, const kv::KvQueue& queue, SchedClock::time_point now) {
  const int n_prompt = static_cast<int>(w.prompt->size());
  const int64_t want = static_cast<int64_t>(n_prompt) + std::max(1, w.req.sampling.max_tokens) - 1;
  const int max_slots = static_cast<int>(std::min<int64_t>(want, w.seq.limits.max_slots));
  kv::KvAdmission admission;
  admission.max_slots = max_slots;
  connector_->Match(queue, &admission);
  const int need = admission.blocks >= 0 ? admission.blocks
                   : w.req.n > 1         ? BlocksForChoices(n_prompt, max_slots, w.req.n)
                                         : BlocksFor(max_slots);
  // A prefill-only request (KVGen) computes its prompt from position 0, reusing nothing;
  // so does one that reports its prompt's logprobs (every prompt token's logits), and
  // one a planner says must (KvLimits::whole_prompt).
  LocalReuse local =
      w.seq.limits.whole_prompt ? LocalReuse{} : resident_->Plan(w.req.tenant, w.req.session_id, *w.prompt);
  if (local.n_cached < admission.min_local) local = LocalReuse{};
  const int avail = AvailableBlocks();
  if (local.from_seq != nullptr && !local.adopt) {
    // The source stays resident (and unevictable) while its prefix is copied.
    if (need > avail - static_cast<int>(local.from_seq->block_table().size())) local = LocalReuse{};
  }
  if (need > avail || !admission.ready) return false;

  // Its slots and the features' states (kv/connector.h): stored KV a planner enters when
  // it covers more than `local`, else `local`'s (the resident sequence stays for others
  // unless adopted). A planner that cannot start it now (its own capacity) leaves it
  // waiting.
  w.seq.limits.max_slots = max_slots;
  std::vector<std::unique_ptr<kv::KvSeqState>> adopted;
  kv::KvSlots slots;
  slots.n_local = local.n_cached;
  slots.make_room = [this](int n_blocks) { resident_->EnsureFree(n_blocks); };
  slots.local = [&](kv::KvReused* reused) { return resident_->Take(local, reused, &adopted); };
  resident_->EnsureFree(admission.free_first);
  if (!connector_->Start(w.seq, &slots).ok()) {
    w.seq.states.clear();
    return false;
  }
  auto r = std::make_unique<Running>(engine_.tokenizer(), w.req.sampling, StopIds(w.req));
  r->prompt = w.prompt;
  slots.get();
  r->kv = std::move(slots.kv);
  r->n_cached = slots.n_cached >= 0 ? slots.n_cached : r->kv->n_slots();
  r->seq = std::move(w.seq);
  r->max_slots = max_slots;
  r->id = w.id;
  r->channel = w.channel;
  r->req = std::move(w.req);
  r->reserved_blocks = need;
  r->queue_seconds = Seconds(now - r->req.arrival);
  running_.push_back(std::move(r));
  n_running_.store(static_cast<int>(running_.size()));
  return true;
}

void Scheduler::ForkChoices(std::vector<Running*>* rows, std::vector<const float*>* logits) {
  const size_t n_rows = rows->size();
  size_t n_new = 0;
  for (size_t t = 0; t < n_rows; ++t) {
    const Running& r = *(*rows)[t];
    if (r.req.n > 1 && !r.forked) n_new += static_cast<size_t>(r.req.n - 1);
  }
  if (n_new == 0) return;
  // Sampling uses a row as scratch: each new choice samples from its own copy.
  fork_logits_.resize(n_new * static_cast<size_t>(vocab_));
  float* copy = fork_logits_.data();
  for (size_t t = 0; t < n_rows; ++t) {
    Running& parent = *(*rows)[t];
    if (parent.req.n <= 1 || parent.forked) continue;
    parent.forked = true;
    parent.reserved_blocks = BlocksFor(parent.max_slots);  // each choice's own share now
    for (int i = 1; i < parent.req.n; ++i) {
      GenerationRequest req = parent.req;
      req.sampling.seed = ChoiceSeed(parent.req.sampling.seed, i);
      auto c = std::make_unique<Running>(engine_.tokenizer(), req.sampling, StopIds(req));
      c->id = parent.id;
      c->choice = i;
      c->forked = true;
      c->req = std::move(req);
      c->prompt = parent.prompt;
      c->channel = parent.channel;
      c->kv = parent.kv->Fork();
      // No planner state: only choice 0's turn is saved (one copy of the prompt's KV in
      // the store), and the features that make another refuse n > 1 (KvLimits).
      c->seq.request = parent.seq.request;
      c->seq.limits = parent.seq.limits;
      c->max_slots = parent.max_slots;
      c->reserved_blocks = BlocksFor(parent.max_slots);
      c->n_cached = parent.n_cached;
      c->queue_seconds = parent.queue_seconds;
      std::copy_n((*logits)[t], vocab_, copy);
      rows->push_back(c.get());
      logits->push_back(copy);
      copy += vocab_;
      running_.push_back(std::move(c));
    }
  }
  n_running_.store(static_cast<int>(running_.size()));
}

void Scheduler::Admit(SchedClock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Waiting& w = **it;
    if (w.channel->cancelled() || now >= w.req.deadline) {
      RequestRecord rec;
      rec.id = w.id;
      rec.usage.prompt_tokens = static_cast<int>(w.prompt->size());
      if (w.channel->cancelled()) {
        rec.code = StatusCode::kCancelled;
      } else {
        rec.code = StatusCode::kDeadlineExceeded;
        GenerationEvent ev;
        ev.kind = GenerationEvent::Kind::kError;
        ev.status = Status(StatusCode::kDeadlineExceeded, "request timed out while waiting in the queue");
        ev.usage = rec.usage;
        w.channel->Push(std::move(ev));
      }
      Report(std::move(rec));
      it = waiting_.erase(it);
      continue;
    }
    ++it;
  }
  // The connector sees the queue (kv/connector.h: Match): what its head needs, then the
  // look-ahead (DESIGN.md decision 6).
  kv::KvQueue queue;
  for (const auto& w : waiting_) queue.waiting.push_back(&w->seq);
  size_t head = 0;
  while (head < waiting_.size() && RunningSequences() + waiting_[head]->req.n <= options_.max_running) {
    queue.idle = running_.empty();
    if (!TryAdmit(*waiting_[head], queue, now)) break;
    queue.waiting.erase(queue.waiting.begin());
    ++head;
  }
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(head));
  queue.prefill_seconds_per_token = std::move(prefill_rates_);
  prefill_rates_.clear();
  connector_->Match(queue, nullptr);
  stats_.waiting = static_cast<int>(waiting_.size());
}

void Scheduler::Retire(Running& r) {
  r.done = true;
  // What to keep (kv/connector.h): the engine keeps a sequence resident (only choice 0
  // of n choices: residents never share blocks) unless a planner cannot (its blocks
  // released, its KV not saved); the planners save it, with what they attach.
  kv::KvKeep keep;
  keep.resident = r.kv && r.kv->n_slots() > 0 && options_.max_resident > 0 && r.choice == 0;
  connector_->Finish(r.seq, r.kv.get(), &keep);
  if (!keep.resident) {
    r.seq.states.clear();  // before the blocks go
    r.kv.reset();
    return;
  }
  resident_->Keep(r.req.tenant, r.req.session_id, std::move(r.kv), std::move(r.seq.states),
                  std::move(keep.attachments));
}

void Scheduler::set_store(store::KvStore* store) {
  connector_ = options_.kv_connector(engine_, options_, store);
}

void Scheduler::Report(RequestRecord record) { reports_.push_back(std::move(record)); }

void Scheduler::FlushReports() {
  if (observer_) {
    for (const auto& r : reports_) observer_(r);
  }
  reports_.clear();
}

void Scheduler::PublishStats() {
  int prefilling = 0;
  for (const auto& r : running_) prefilling += r->decoding ? 0 : 1;
  kv::KvStats planners;  // made before the lock: Submit and Stats() wait on it
  connector_->PublishStats(&planners);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.running = static_cast<int>(running_.size());
  stats_.prefilling = prefilling;
  stats_.kv_blocks_total = pool_.n_blocks();
  stats_.kv_blocks_free = pool_.n_free();
  stats_.kv_blocks_used = pool_.n_used();
  stats_.kv_blocks_resident = resident_->blocks();
  stats_.prompt_tokens_computed = prompt_tokens_computed_;
  stats_.resident_sequences = resident_->size();
  stats_.steps = steps_;
  stats_.evicted_sequences = resident_->evicted();
  stats_.peak_decode_batch = peak_decode_batch_;
  stats_.kv = std::move(planners);
  stats_.waiting = static_cast<int>(waiting_.size());
}

}  // namespace attic::engine
