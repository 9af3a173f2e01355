// Token logprobs (engine::TokenLogprob) in OpenAI's two shapes:
//   chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
//                 "refusal": null}
//   completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob} | null], "text_offset"}
// A token's string is its text (a special token's as written in the vocabulary). A
// token whose bytes are not valid UTF-8 (a byte-fallback piece, part of a character) is
// "bytes:\xNN..." in completions (OpenAI's spelling), and in chat its text with U+FFFD
// for the bad bytes, its exact bytes in "bytes". A prompt's first token has no logprob
// (null, top_logprobs null). text_offset counts code points of the token strings
// before each, from the start of the returned text.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

#include "attic/engine/logits_processor.h"
#include "attic/server/openai_api.h"
#include "attic/tokenizer/tokenizer.h"

namespace attic::server {

class LogprobsJson {
 public:
  LogprobsJson(const tokenizer::Tokenizer& tok, ApiKind kind) : tok_(tok), kind_(kind) {}
  // The logprobs object of `entries` (those of one chunk, or of a whole response);
  // completions' text offsets continue from the previous call's.
  nlohmann::json Of(const std::vector<engine::TokenLogprob>& entries);

 private:
  const tokenizer::Tokenizer& tok_;
  ApiKind kind_;
  int64_t offset_ = 0;
};

}  // namespace attic::server
