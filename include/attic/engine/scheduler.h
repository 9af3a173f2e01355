// Scheduler: iteration-level continuous batching over one Engine.
//
// Requests wait in a bounded FCFS queue. Each Step() admits what fits (running-sequence
// cap and KV budget), then runs ONE Transformer::Forward over a batch holding the next
// token of every decoding sequence plus prefill chunks of admitted prompts, at most
// max_batch_tokens rows. A long prompt is therefore prefilled over several steps and
// never stalls decoding streams for more than one chunk.
//
// KV budget (kv::BlockPool): a request is admitted only when the blocks it can ever need
// (prompt + max_tokens, capped by the context window) fit beside what running sequences
// have reserved, so a running sequence never runs out of KV mid-generation and nothing
// is preempted. Finished sequences' KV stays resident (per tenant, LRU-evicted when
// blocks are needed); a new request of the same tenant whose prompt shares a prefix
// with a resident sequence reuses that prefix and prefills only the rest.
//
// Choices (GenerationRequest::n): a request of n choices is admitted with the KV blocks
// all n can reach, prefilled once as one sequence, and forked when its prompt is in:
// the n sequences share the prompt's blocks (kv::SequenceKv::Fork, copy-on-write) and
// decode in the same steps like any other sequences.
//
// The KV connector (kv/connector.h; SchedulerOptions::kv_connector): at Submit it checks
// a request's options for the planners and the limits they set; at admission it supplies
// slots (stored KV) and per-sequence states whose layer hooks join that sequence's batch
// entry at every step (the other entries of the step are untouched); when a sequence ends
// it decides what is kept. The scheduler names no planner.
//
// The waiting queue is visible read-only through LookAhead(): the next N waiting
// requests with their token ids and session ids, for the KV store's prefetch/eviction
// (paper 001 section 3.3, DESIGN.md decision 6).
//
// Thread-safety: Submit, LookAhead, Stats, WaitForWork and Shutdown may be called from
// any thread. Step runs on one thread (the step loop), which owns the Engine's
// Transformer and BlockPool for the scheduler's lifetime. Results travel through a
// ResultChannel per request: the step loop pushes (never blocks), the requester pops.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "attic/engine/engine.h"
#include "attic/engine/logits_processor.h"
#include "attic/engine/sampler.h"
#include "attic/kv/connector.h"

namespace attic::store {
class KvStore;
}  // namespace attic::store

namespace attic::engine {

using SchedClock = std::chrono::steady_clock;
class ResidentSet;
struct SchedulerOptions;

// Makes a scheduler's KV connector (kv/connector.h) over `store` (null: none), with the
// scheduler's options as it uses them: at construction, and again when a store is
// attached (Scheduler::set_store).
using KvConnectorFactory = std::function<std::unique_ptr<kv::KvConnector>(
    Engine& engine, const SchedulerOptions& options, store::KvStore* store)>;

struct SchedulerOptions {
  int max_running = 16;            // sequences admitted at once (prefilling or decoding; n choices count n)
  int max_waiting = 64;            // bounded FCFS queue; Submit beyond it is ResourceExhausted
  // Prefill tokens per step (0 = whatever the step's max_batch_tokens leaves after the
  // decode rows). Smaller values bound decode latency tighter at some prefill speed.
  int max_prefill_tokens_per_step = 0;
  int max_resident = 4096;         // finished sequences kept resident (LRU beyond)
  int min_reuse_tokens = 8;        // shortest common prefix worth reusing (resident or stored)
  size_t channel_capacity = 256;   // events buffered per request; text coalesces beyond
  // The planners and their options (engine/kv_features.h: KvFeatures); null = KvFeatures()
  // (every planner with its defaults).
  KvConnectorFactory kv_connector;
};

// A request of n choices reports one usage per choice (its kFinish): the prompt (prompt,
// cached and recomputed tokens) is counted in choice 0's only, each choice counts its
// own completion tokens, so the sum over the choices is the request's usage.
struct TokenUsage {
  int prompt_tokens = 0;
  int completion_tokens = 0;  // sampled tokens, including a stop token
  int cached_tokens = 0;      // prompt tokens whose KV was reused instead of recomputed
  int recomputed_tokens = 0;  // cached tokens a planner had computed again (KvSeqState::recomputed); not in cached_tokens
};

struct GenerationEvent {
  enum class Kind { kText, kFinish, kError };
  Kind kind = Kind::kText;
  int index = 0;              // the choice (GenerationRequest::n) the event belongs to
  std::string text;           // kText: a piece of valid UTF-8 (never splits a code point)
  std::string finish_reason;  // kFinish: "stop" or "length"
  std::string stop_string;    // kFinish "stop" at a stop string: which one ("" otherwise)
  TokenUsage usage;           // kFinish (kError: what was done before the error)
  Status status;              // kError
  // kText, with GenerationRequest::logprobs >= 0: the sampled tokens whose text this
  // event completes (or that add none), in order; a stop token is not listed. With
  // prompt_logprobs, the first event (text "") lists every prompt token (the first's
  // logprob NaN).
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> prompt_logprobs;
};

// One request's results. The last event of each choice (GenerationEvent::index) is
// exactly one kFinish or kError, unless the request was cancelled (then nothing more
// arrives); an error before the prompt is in (before the choices fork) is the request's
// only event.
class ResultChannel {
 public:
  explicit ResultChannel(size_t capacity) : capacity_(capacity) {}

  // Step-loop side; never blocks. When `capacity` events are pending, a text event is
  // appended to the last pending text event of its choice instead (bounded count, no
  // text lost).
  void Push(GenerationEvent event);
  // Requester side: waits up to `timeout` for the next event; false on timeout.
  bool Pop(GenerationEvent* event, std::chrono::milliseconds timeout);
  // Asks the scheduler to stop this request (client gone). Idempotent.
  void Cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

 private:
  size_t capacity_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
};

struct GenerationRequest {
  std::string tenant = "default";   // resident KV is never shared across tenants
  std::string session_id;           // optional; a look-ahead hint and a reuse tie-breaker
  int64_t session_ttl_ms = -1;      // lifetime of this turn's stored KV (-1 = store default, 0 = forever)
  std::vector<int32_t> prompt;      // token ids (must not be empty)
  SamplingParams sampling;          // max_tokens >= 1; stop_token_ids add to the engine's
  bool ignore_eos = false;          // don't stop at the engine's stop tokens (benchmarks)
  // The planners' options (kv/connector.h), at most one value per type, each read by
  // the planner it is for (the connector's Check validates it at Submit); none = every
  // planner's defaults.
  kv::KvRequestOptions kv_options;
  // Compute and save the prompt's KV (session_id names the entry), sample nothing: the
  // request finishes ("stop", no completion tokens) once its prompt is prefilled. Its
  // prompt is computed from scratch (no reuse), so the entry holds KV computed from
  // position 0 exactly (KVGen of a context cache's chunk). Needs a KV store.
  bool prefill_only = false;
  // Logprobs (logits_processor.h): >= 0 reports each sampled token's logprob and its
  // `logprobs` most likely alternatives (GenerationEvent::logprobs); -1 = none.
  int logprobs = -1;
  // Also every prompt token's logprob (echo): the prompt is computed whole, as it came
  // (no reuse; kv::KvRequest::prompt_logits: a planner refuses what would change it),
  // and sampling.max_tokens may be 0 (finish "length" once prefilled).
  bool prompt_logprobs = false;
  // Narrows what may be sampled (a grammar); null = anything. Its Complete() ends the
  // generation ("stop").
  std::shared_ptr<LogitsProcessor> processor;
  // Choices: n sequences sampled from the prompt, prefilled once (see the header
  // comment). Choice i samples with ChoiceSeed(sampling.seed, i). 1..kMaxChoices; n > 1
  // not with a processor, options a planner refuses them for (kv::KvLimits::no_choices),
  // prefill_only or max_tokens 0. Only choice
  // 0's turn is saved to the KV store and only choice 0 stays resident; the other
  // choices release their KV when they end.
  int n = 1;
  SchedClock::time_point arrival{};                         // {} = when submitted
  SchedClock::time_point deadline = SchedClock::time_point::max();  // per-request timeout
};

// Read-only view of a waiting request, for the KV store.
struct WaitingRequestView {
  uint64_t id = 0;
  std::string tenant;
  std::string session_id;
  std::shared_ptr<const std::vector<int32_t>> prompt;
  int max_tokens = 0;
  SchedClock::time_point arrival;
};

// The most choices one request may ask for (GenerationRequest::n).
inline constexpr int kMaxChoices = 16;

struct SchedulerStats {
  int waiting = 0;
  int running = 0;        // admitted (prefilling + decoding)
  int prefilling = 0;
  int kv_blocks_total = 0;
  int kv_blocks_used = 0;  // held by running and resident sequences
  int kv_blocks_free = 0;
  int kv_blocks_resident = 0;  // what evicting every resident sequence would free
  int resident_sequences = 0;
  uint64_t steps = 0;
  // Prompt tokens computed by forward steps (prefill rows, and the cached slots a planner
  // has computed again; reused KV is not computed): a prompt shared by n choices counts once.
  uint64_t prompt_tokens_computed = 0;
  uint64_t evicted_sequences = 0;
  int peak_decode_batch = 0;  // most sequences decoded together in one step, since start
  // The planners' counters since start, by type (kv::KvConnector::PublishStats): e.g.
  // kv.Value<store::KvLoadStats>().
  kv::KvStats kv;
};

// What happened to one request; reported on the step loop when it ends.
struct RequestRecord {
  uint64_t id = 0;
  int index = 0;              // the choice (one record per choice; usage as TokenUsage says)
  TokenUsage usage;
  std::string finish_reason;  // "" unless it finished normally
  StatusCode code = StatusCode::kOk;
  double queue_seconds = 0;   // arrival -> admission (0 if never admitted)
  double ttft_seconds = -1;   // arrival -> first sampled token (-1 if none)
  std::vector<double> inter_token_seconds;  // gaps between consecutive sampled tokens
};
using RequestObserver = std::function<void(const RequestRecord&)>;

class Scheduler {
 public:
  // `engine` must outlive the scheduler; its pool must hold at least one block.
  Scheduler(Engine& engine, const SchedulerOptions& options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request and returns its channel. InvalidArgument (empty prompt, bad
  // sampling parameters or token ids), OutOfRange (prompt beyond the context window or
  // the whole KV budget), ResourceExhausted (waiting queue full), Unavailable (shut down),
  // or the connector's Check's error (kv_options a planner refuses, or what it needs
  // missing: kv/connector.h).
  StatusOr<std::shared_ptr<ResultChannel>> Submit(GenerationRequest request);

  // The next `n` waiting requests, in the order they will be admitted.
  std::vector<WaitingRequestView> LookAhead(int n) const;
  SchedulerStats Stats() const;

  // Blocks until a request waits or runs, Shutdown, or `timeout`; returns whether
  // there is work.
  bool WaitForWork(std::chrono::milliseconds timeout);
  // One iteration: reap cancelled/expired requests, admit, one forward, sample, emit.
  // Step loop only. Returns the number of batch rows computed (0 = idle).
  int Step();
  // Fails every waiting and running request with Unavailable; later Submits fail too.
  // Step loop only (or after the step loop has stopped).
  void Shutdown();
  // Called on the step loop whenever a request ends. Set before the first Step.
  void set_observer(RequestObserver observer) { observer_ = std::move(observer); }
  // Attaches the KV store (paper 001): on admission a request that finds no better
  // resident KV loads its stored KV (session id, else longest stored prefix) and
  // prefills only the rest; each finished turn's KV is saved (pre-RoPE). The store must
  // outlive the scheduler; stored KV enters this scheduler's compute buffer (the store is
  // attached to it: one scheduler per store). Set before the first Step; null = no store.
  // The connector is made again over it (SchedulerOptions::kv_connector).
  void set_store(store::KvStore* store);

  const SchedulerOptions& options() const { return options_; }

 private:
  struct Waiting;
  struct Running;

  int BlocksFor(int n_slots) const;
  // Blocks a request of `n` choices reaches (each up to max_slots slots; the prompt's
  // full blocks shared, each choice's others its own).
  int BlocksForChoices(int n_prompt, int max_slots, int n) const;
  // Sequences running, counting the choices still to fork from a prefilling request
  // (what max_running bounds: each decodes one row of every step).
  int RunningSequences() const;
  // The tokens that end a sequence of `req`: the engine's unless ignore_eos, and its own.
  std::vector<int32_t> StopIds(const GenerationRequest& req) const;
  // Requests of n > 1 choices among this step's sampling rows whose prompt is now in
  // fork into their n choices (kv::SequenceKv::Fork); each new choice is added to
  // `rows` with a copy of its parent's logits row `logits`.
  void ForkChoices(std::vector<Running*>* rows, std::vector<const float*>* logits);
  int OutstandingReservation() const;
  int AvailableBlocks() const;
  // Admits `w`, the head of `queue` (the connector's view of the waiting queue), if it
  // fits now.
  bool TryAdmit(Waiting& w, const kv::KvQueue& queue, SchedClock::time_point now);
  void Admit(SchedClock::time_point now);
  void ReapRunning(SchedClock::time_point now);
  void OnToken(Running& r, int32_t token, SchedClock::time_point now);
  void Finish(Running& r, const std::string& reason);
  void Fail(Running& r, const Status& status);
  void Retire(Running& r);
  // A planner found r's slots without the KV they should hold (KvSeq::lost: a load broke
  // off): the request starts again as a fresh prefill of its whole prompt, reusing
  // nothing (new slots, new states). Nothing was sampled from it.
  void StartOver(Running& r);
  void Report(RequestRecord record);
  void PublishStats();
  void FlushReports();

  Engine& engine_;
  SchedulerOptions options_;
  kv::BlockPool& pool_;
  const int block_size_;
  const int vocab_;
  const int max_slots_;  // per sequence: min(context window, pool capacity in tokens)
  // The KV connector (kv/connector.h): options_.kv_connector's, made again by set_store.
  std::unique_ptr<kv::KvConnector> connector_;
  RequestObserver observer_;
  // The measured prefill rates (seconds per token) not yet handed to the connector (step loop).
  std::vector<double> prefill_rates_;

  // Guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<std::unique_ptr<Waiting>> waiting_;
  uint64_t next_id_ = 1;
  bool shutdown_ = false;
  SchedulerStats stats_;
  std::atomic<int> n_running_{0};

  // Step loop only.
  std::vector<std::unique_ptr<Running>> running_;  // admission order
  // Finished sequences whose KV stays in the compute buffer (resident_set.h).
  std::unique_ptr<ResidentSet> resident_;
  uint64_t steps_ = 0;
  uint64_t prompt_tokens_computed_ = 0;
  int peak_decode_batch_ = 0;
  std::vector<float> logits_;
  std::vector<Running*> sample_rows_;  // this step's rows that sample a token
  std::vector<int32_t> sampled_;       // ... and their tokens
  std::vector<const float*> sample_logits_;  // ... and their logits rows
  std::vector<size_t> first_row_;      // where each batch entry's logits rows start
  std::vector<int> first_new_;         // each batch entry's first appended slot
  std::vector<kv::LayerHooks*> step_hooks_;  // the step's hooks, entry by entry ...
  std::vector<size_t> step_hooks_from_;      // ... entry i's from step_hooks_from_[i]
  std::vector<float> fork_logits_;     // forked choices' copies of their first logits row
  std::vector<RequestRecord> reports_;  // delivered to observer_ at the end of a step
};

}  // namespace attic::engine
