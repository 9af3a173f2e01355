// Internal: the Scheduler's per-request state, shared by scheduler*.cc.
#pragma once

#include <list>
#include <memory>
#include <string>
#include <vector>

#include "attic/engine/scheduler.h"
#include "attic/kv/block_pool.h"
#include "attic/tokenizer/tokenizer.h"
#include "engine/generation_stream.h"
#include "engine/resident_set.h"

namespace attic::engine {

// A queued request. The prompt (as the connector's Check left it) is shared with
// look-ahead views.
struct Scheduler::Waiting {
  uint64_t id = 0;
  GenerationRequest req;  // req.prompt is moved into `prompt`
  std::shared_ptr<const std::vector<int32_t>> prompt;
  std::shared_ptr<ResultChannel> channel;
  kv::KvSeq seq;  // what the KV connector sees of it (Check passed)
};

// An admitted request: prefilling while kv->n_slots() < prompt->size(), then decoding.
struct Scheduler::Running {
  // stop_ids: the tokens that end it (the engine's unless ignore_eos, and the request's).
  Running(const tokenizer::Tokenizer& tok, const SamplingParams& params, std::vector<int32_t> stop_ids)
      : sampler(params), stream(tok, std::move(stop_ids), params.stop_strings) {}

  uint64_t id = 0;
  // The choice (req.n > 1): choice 0 prefills the prompt and, once it is in, the others
  // fork from it (Scheduler::ForkChoices). They share id, channel and prompt.
  int choice = 0;
  bool forked = false;  // choice 0 of n > 1: the others exist
  GenerationRequest req;
  std::shared_ptr<const std::vector<int32_t>> prompt;
  std::shared_ptr<ResultChannel> channel;
  std::unique_ptr<kv::SequenceKv> kv;
  int max_slots = 0;              // KV slots this sequence may grow to
  int reserved_blocks = 0;        // BlocksFor(max_slots), reserved at admission
  int n_cached = 0;               // prompt slots that came cached (KvSlots::n_cached)
  // The KV connector's view of the sequence and the features' states (its layer hooks,
  // the slots it computes in place before the rest of its prompt: KvSeqState). Declared
  // after kv: destroyed first (a load still writing into kv's blocks is waited for).
  kv::KvSeq seq;
  size_t compute_next = 0;        // the next of seq.compute_slots() to compute
  bool prefilled() const {
    const std::vector<int32_t>* compute = seq.compute_slots();
    return (compute == nullptr || compute_next >= compute->size()) && kv->n_slots() >= static_cast<int>(prompt->size());
  }

  bool decoding = false;
  int32_t next_token = -1;  // sampled, fed at the next step
  Sampler sampler;
  GenerationStream stream;  // stop tokens and strings, UTF-8-safe text, what is emitted
  int n_generated = 0;
  bool done = false;
  // Logprobs (req.logprobs >= 0): the row prepared this step (before the processor's
  // mask: the model's distribution), and sampled tokens not yet sent with their text; with req.prompt_logprobs,
  // the prompt's so far.
  LogprobRow step_logprob;
  std::vector<TokenLogprob> pending_logprobs;
  std::vector<TokenLogprob> prompt_logprobs;

  double queue_seconds = 0;
  double ttft_seconds = -1;
  SchedClock::time_point last_token;
  std::vector<double> gaps;

  // The request's record as it ends now with `code` ("finish_reason" only when it
  // finished normally); takes the gaps.
  RequestRecord TakeRecord(StatusCode code, std::string finish_reason = "") {
    RequestRecord rec;
    rec.id = id;
    rec.index = choice;
    rec.usage = usage();
    rec.finish_reason = std::move(finish_reason);
    rec.code = code;
    rec.queue_seconds = queue_seconds;
    rec.ttft_seconds = ttft_seconds;
    rec.inter_token_seconds = std::move(gaps);
    return rec;
  }

  // The prompt counts in choice 0's usage only (TokenUsage).
  TokenUsage usage() const {
    TokenUsage u;
    u.completion_tokens = n_generated;
    if (choice > 0) return u;
    u.prompt_tokens = static_cast<int>(prompt->size());
    u.recomputed_tokens = seq.recomputed();
    u.cached_tokens = n_cached - u.recomputed_tokens;
    return u;
  }
};

}  // namespace attic::engine
