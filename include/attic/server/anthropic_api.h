// The Anthropic Messages API (POST /v1/messages) on Attic: the request read into the same
// ApiRequest a chat completion uses, and the response, SSE events and errors in
// Anthropic's shapes ({"type":"error","error":{"type":"invalid_request_error",...}}).
//
// Prompt caching: a `cache_control` block ({"type": "ephemeral"}, "ttl" "5m" or "1h") is
// a breakpoint, as in Anthropic's API: the prompt up to the end of that block is cached.
// Attic keeps every turn's KV anyway (resident, then in the KV store), and finds a stored
// prefix by its tokens; so a breakpoint changes nothing in what is computed, and sets
// what usage reports (docs/serving.md, "Anthropic Messages API"):
//   cache_read_input_tokens      prompt tokens whose KV was reused (cached_tokens);
//   cache_creation_input_tokens  the tokens after those, up to the last breakpoint, that
//                                this request computed and the store keeps (0 without a
//                                breakpoint or without the KV store);
//   input_tokens                 the rest of the prompt.
// A TTL longer than the server's --session-ttl lengthens this turn's stored life.
//
// Thread-safety: free functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attic/server/openai_api.h"

namespace attic::server {

// Stands where the last cache_control breakpoint ends in MessagesRequest::marked (text a
// client sends never contains it: the part-marker prefix is refused).
inline constexpr const char* kCacheBreakMarker = "\xEE\x80\x80" "attic-part:cache-breakpoint" "\xEE\x80\x81";

struct MessagesRequest {
  ApiRequest chat;  // kChat: model, messages (system first), sampling, stop, stream, user
  std::vector<std::string> stop_sequences;  // as sent (also in chat.stop)
  // The messages with kCacheBreakMarker after the last block with cache_control (empty:
  // no breakpoint).
  std::vector<tokenizer::ChatMessage> marked;
  int64_t cache_ttl_s = 0;  // the longest TTL among the breakpoints (300 or 3600; 0: none)
};

struct MessagesParse {
  MessagesRequest request;
  std::optional<ApiError> error;
};

// Validates a /v1/messages body; any input yields a request or a 400 naming the field.
MessagesParse ParseMessagesRequest(std::string_view body);

// Anthropic's error type for an HTTP status (400 invalid_request_error, 401
// authentication_error, 404 not_found_error, 413 request_too_large, 429
// rate_limit_error, 503 overloaded_error, other 5xx api_error).
const char* AnthropicErrorType(int http_status);
// {"type":"error","error":{"type":...,"message":...}}
std::string AnthropicErrorJson(const ApiError& error);

struct MessagesUsage {
  int input_tokens = 0;
  int output_tokens = 0;
  int cache_creation_input_tokens = 0;
  int cache_read_input_tokens = 0;
};
// `breakpoint_tokens`: prompt tokens up to the last breakpoint (0: none); `stored`:
// whether the turn's KV is kept by the KV store.
MessagesUsage AnthropicUsage(const engine::TokenUsage& usage, int breakpoint_tokens, bool stored);

// "end_turn", "max_tokens" (finish "length") or "stop_sequence" (a stop string the
// request gave; *stop_sequence is set to it).
std::string AnthropicStopReason(const std::string& finish_reason, const std::string& stop_string,
                                const std::vector<std::string>& stop_sequences, std::string* stop_sequence);

// The non-streaming response: {"id","type":"message","role":"assistant","model",
// "content":[{"type":"text","text"}],"stop_reason","stop_sequence","usage"}.
std::string MessageBody(const std::string& id, const std::string& model, const std::string& text,
                        const std::string& stop_reason, const std::string& stop_sequence, const MessagesUsage& usage);

// SSE events ("event: NAME\ndata: {...}\n\n") in the order a stream sends them.
std::string MessageStartEvent(const std::string& id, const std::string& model, int input_tokens);
std::string ContentBlockStartEvent();
std::string TextDeltaEvent(const std::string& text);
std::string ContentBlockStopEvent();
std::string MessageDeltaEvent(const std::string& stop_reason, const std::string& stop_sequence, const MessagesUsage& usage);
std::string MessageStopEvent();
std::string AnthropicErrorEvent(const ApiError& error);

}  // namespace attic::server
