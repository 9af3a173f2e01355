// Internal: the Scheduler's per-request state, shared by scheduler*.cc.
#pragma once

#include <list>
#include <memory>
#include <string>
#include <vector>

#include "attic/engine/scheduler.h"
#include "attic/kv/block_pool.h"
#include "attic/tokenizer/tokenizer.h"

namespace attic::engine {

// A queued request. The prompt is shared with look-ahead views.
struct Scheduler::Waiting {
  uint64_t id = 0;
  GenerationRequest req;  // req.prompt is moved into `prompt`
  std::shared_ptr<const std::vector<int32_t>> prompt;
  std::shared_ptr<ResultChannel> channel;
};

// A finished (or cancelled) sequence whose KV stays in the compute buffer.
struct Scheduler::Resident {
  std::string tenant;
  std::string session_id;
  std::unique_ptr<kv::SequenceKv> kv;
};

// Which resident sequence a new request reuses, and how.
struct Scheduler::ReusePlan {
  const Resident* source = nullptr;  // nullptr = no reuse
  int n_reuse = 0;                   // common-prefix tokens whose KV is reused
  bool take_over = false;            // adopt the source's blocks (else copy the prefix)
};

// An admitted request: prefilling while kv->n_slots() < prompt->size(), then decoding.
struct Scheduler::Running {
  Running(const tokenizer::Tokenizer& tok, const SamplingParams& params) : sampler(params), decoder(tok) {}

  uint64_t id = 0;
  GenerationRequest req;
  std::shared_ptr<const std::vector<int32_t>> prompt;
  std::shared_ptr<ResultChannel> channel;
  std::unique_ptr<kv::SequenceKv> kv;
  std::vector<int32_t> stop_ids;  // sorted
  int max_slots = 0;              // KV slots this sequence may grow to
  int reserved_blocks = 0;        // BlocksFor(max_slots), reserved at admission
  int n_cached = 0;

  bool decoding = false;
  int32_t next_token = -1;  // sampled, fed at the next step
  Sampler sampler;
  tokenizer::StreamDecoder decoder;
  std::string text;         // generated text so far (cut at a stop string)
  size_t emitted = 0;       // bytes of `text` already pushed
  int n_generated = 0;
  bool done = false;

  double queue_seconds = 0;
  double ttft_seconds = -1;
  SchedClock::time_point last_token;
  std::vector<double> gaps;

  TokenUsage usage() const {
    TokenUsage u;
    u.prompt_tokens = static_cast<int>(prompt->size());
    u.completion_tokens = n_generated;
    u.cached_tokens = n_cached;
    return u;
  }
};

}  // namespace attic::engine
