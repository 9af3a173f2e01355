// The OpenAI wire format Attic speaks: request parsing and validation for
// /v1/chat/completions, /v1/completions, /tokenize and /detokenize (vLLM's shapes),
// response and SSE chunk bodies, and OpenAI error objects
// ({"error":{"message","type","param","code"}}) with the HTTP status each travels with.
//
// Parsing never throws and never trusts the input: any JSON (or non-JSON) body yields
// either a request whose every field is in range, or a 400 error naming the field.
//
// Thread-safety: free functions, safe to call concurrently.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attic/core/status.h"
#include "attic/engine/scheduler.h"
#include "attic/grammar/json_grammar.h"
#include "attic/pic/link.h"
#include "attic/pq/sparse.h"
#include "attic/server/tool_call_stream.h"
#include "attic/server/tool_calls.h"
#include "attic/tokenizer/chat_template.h"

namespace attic::server {

// An OpenAI error object and its HTTP status.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" = null
  std::string code;   // "" = null
};

// {"error":{"message":...,"type":...,"param":...,"code":...}}
std::string ErrorJson(const ApiError& error);
// InvalidArgument 400, NotFound 404, OutOfRange 413 (context_length_exceeded),
// ResourceExhausted 429, Unavailable 503, DeadlineExceeded 504, anything else 500.
ApiError ErrorFromStatus(const Status& status);
// A 400 naming the request field `param` (invalid_request_error).
ApiError InvalidParam(const std::string& param, const std::string& message, const std::string& code = "invalid_value");

enum class ApiKind { kChat, kCompletion };

// A validated request. Defaults are OpenAI's.
struct ApiRequest {
  ApiKind kind = ApiKind::kChat;
  std::string model;
  std::vector<tokenizer::ChatMessage> messages;  // kChat: system/user/assistant/tool turns
  std::string prompt_text;                       // kCompletion, text prompt
  std::vector<int32_t> prompt_ids;               // kCompletion, prompt given as token ids
  bool prompt_is_ids = false;
  std::optional<int64_t> max_tokens;             // max_tokens / max_completion_tokens; >= 1 (0: echo)
  float temperature = 1.0f;                      // [0, 2]
  float top_p = 1.0f;                            // [0, 1]; 0 means greedy
  int top_k = 0;                                 // extension; 0 = off
  float min_p = 0.0f;                            // extension; [0, 1]
  std::optional<uint64_t> seed;
  int n = 1;                                     // choices, 1..engine::kMaxChoices
  std::vector<std::string> stop;                 // up to kMaxStops non-empty strings
  bool stream = false;
  bool include_usage = false;                    // stream_options.include_usage
  std::string user;
  std::string session_id;                        // extension: conversation id (a hint)
  bool ignore_eos = false;                       // extension: generate max_tokens tokens
  // Chat: logprobs true -> top_logprobs (0..20); completions: logprobs N (0..20). -1 = off.
  int logprobs = -1;
  bool echo = false;                             // completions: the prompt before the completion
  // response_format json_object / json_schema: the grammar the output follows (null: text).
  std::shared_ptr<const grammar::Grammar> grammar;
  // Chat: tools, tool_choice, parallel_tool_calls (include/attic/server/tool_calls.h).
  ToolSpec tools;
  int64_t session_ttl_s = -1;                    // extension: stored-KV lifetime (s); -1 = server default, 0 = forever
  // Context caches (paper 002; docs/serving.md "Context caches"): content parts
  // {"type":"context_cache","id":...} and text parts with Anthropic-style
  // "cache_control", in order. Each stands in the message content (or prompt_text) as
  // PartMarker(i); the prompt is built around them.
  struct CachePart {
    std::string cache_id;  // a cache or chunk id; "" = a text part with cache_control
    std::string text;      // cache_control: the text
    int64_t ttl_s = 0;     // cache_control: its TTL (300 or 3600)
  };
  std::vector<CachePart> cache_parts;
  std::optional<pic::LinkOptions> link;       // extension: "link" (else the server's --link)
  // Extension: "sparse" (sparse decoding, PQCache; docs/serving.md "Sparse decoding");
  // else the server's --sparse.
  std::optional<pq::SparseOptions> sparse;
};

// The stand-in of cache part i in a message's content or a prompt's text: private-use
// characters around an index (text that contains kPartMarkerOpen is refused).
// (U+E000 then "attic-part:": two literals, as "\x80a..." would read 'a' as a hex digit.)
inline constexpr const char* kPartMarkerOpen = "\xEE\x80\x80" "attic-part:";
inline constexpr const char* kPartMarkerClose = "\xEE\x80\x81";
std::string PartMarker(size_t index);

inline constexpr int kMaxStops = 16;
inline constexpr int kMaxTopLogprobs = 20;  // logprobs / top_logprobs, as OpenAI's chat
inline constexpr int kMaxJsonDepth = 64;
inline constexpr size_t kMaxSessionIdBytes = 256;

struct ParseResult {
  ApiRequest request;
  std::optional<ApiError> error;  // set => the request is invalid
};

ParseResult ParseApiRequest(ApiKind kind, std::string_view body);

// Parses a request body that must be a JSON object no deeper than kMaxJsonDepth (keys in
// the client's order with ordered_json); a 400 (invalid_json, invalid_value) otherwise,
// also for a body holding a NUL byte (nlohmann would end the input there and drop the
// rest). Never throws.
std::optional<ApiError> ParseJsonObject(std::string_view body, nlohmann::ordered_json* out);
std::optional<ApiError> ParseJsonObject(std::string_view body, nlohmann::json* out);

// The HTTP header that names a request's conversation, as a load balancer sees it
// (docs/serving.md "Several servers behind nginx"): a client sets it once as a default
// header, the balancer hashes on it, and the server takes it as the session id.
inline constexpr const char* kSessionIdHeader = "X-Session-Id";

// Applies an X-Session-Id header value to a parsed request: "" (absent) changes
// nothing; otherwise it is the session id when the body names none, must equal the
// body's `session_id` when it names one (else 400: the balancer routed one conversation
// and the body would store another), and is limited to kMaxSessionIdBytes like the field.
std::optional<ApiError> ApplySessionHeader(std::string_view header, ApiRequest* r);

// POST /tokenize, in vLLM's shape; llama-server's names are accepted as aliases
// (content = prompt, add_special = add_special_tokens, with_pieces = return_token_strs).
// Exactly one of prompt/content and messages; with messages, `tools` (and `tool_choice`,
// `parallel_tool_calls`) are read and checked as for /v1/chat/completions, and the tools
// rendered the same way.
struct TokenizeRequest {
  std::string model;                             // optional ("" = the served model)
  bool chat = false;                             // messages given (else prompt)
  std::string prompt;
  std::vector<tokenizer::ChatMessage> messages;
  ToolSpec tools;                                // chat: the request's tools
  bool add_generation_prompt = true;             // chat: end with the assistant header
  bool add_special_tokens = true;                // BOS; default true for prompt, false for messages
  bool return_token_strs = false;                // also each token's vocabulary string
};
struct TokenizeParse {
  TokenizeRequest request;
  std::optional<ApiError> error;
};
TokenizeParse ParseTokenizeRequest(std::string_view body);

// POST /detokenize: {"model"?, "tokens": [ids]}. Ids are checked against the
// vocabulary by the caller (the parser does not know it).
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
struct DetokenizeParse {
  DetokenizeRequest request;
  std::optional<ApiError> error;
};
DetokenizeParse ParseDetokenizeRequest(std::string_view body);

// What every response of one request shares.
struct ResponseMeta {
  ApiKind kind = ApiKind::kChat;
  std::string id;                  // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;             // unix seconds
  std::string model;
  std::string system_fingerprint;  // identifies model weights + serving configuration
};

// Non-streaming response body. `logprobs`: the choice's logprobs object as JSON text
// ("" = null).
// With `tool_calls` (chat), the message carries them (content null when `text` is "").
std::string CompletionBody(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                           const engine::TokenUsage& usage, const std::string& logprobs = "",
                           const std::vector<ToolCall>& tool_calls = {});
// The same with several choices (n > 1), choice i at index i.
struct ChoiceBody {
  std::string text;
  std::string finish_reason;
  std::string logprobs;  // JSON, "" = null
  std::vector<ToolCall> tool_calls = {};  // chat: the message carries them
};
std::string CompletionBody(const ResponseMeta& meta, const std::vector<ChoiceBody>& choices,
                           const engine::TokenUsage& usage);
// One SSE event ("data: {...}\n\n") of a streaming response. For chat, `role_chunk`
// makes the opening {"role":"assistant","content":""} delta. finish_reason "" = null.
// include_usage adds "usage":null, as OpenAI does on every chunk when usage is asked for.
// `index`: the choice the chunk belongs to.
std::string ChunkEvent(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                       bool include_usage, bool role_chunk = false, const std::string& logprobs = "", int index = 0);
// The chunks of a tool-call stream's pieces (tool_call_stream.h), in order, OpenAI's
// deltas: content as {"content": ...}; a call's first piece as {"tool_calls": [{"index",
// "id", "type": "function", "function": {"name", "arguments": ""}}]}, each piece of its
// arguments as {"tool_calls": [{"index", "function": {"arguments": ...}}]}. `logprobs`
// (JSON, "" = none) goes on the first content chunk, or on a chunk of its own before the
// calls' when there is no content.
std::string ToolStreamEvents(const ResponseMeta& meta, const std::vector<ToolStreamPiece>& pieces, bool include_usage,
                             const std::string& logprobs = "");
// The closing usage chunk (choices []), sent when stream_options.include_usage.
std::string UsageEvent(const ResponseMeta& meta, const engine::TokenUsage& usage);
// "data: {"error":{...}}\n\n"
std::string ErrorEvent(const ApiError& error);

}  // namespace attic::server
