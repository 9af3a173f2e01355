// Response bodies, SSE chunks and error objects in OpenAI's format.
#include <nlohmann/json.hpp>

#include <algorithm>

#include "attic/server/openai_api.h"

namespace attic::server {

namespace {

using json = nlohmann::json;

// Text that reached us from a client or a model is always valid UTF-8 by construction,
// but error messages may quote raw input: never let dump() throw on it.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json NullIfEmpty(const std::string& s) { return s.empty() ? json() : json(s); }

json UsageJson(const engine::TokenUsage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}, {"recomputed_tokens", u.recomputed_tokens}}},
              {"completion_tokens_details", {{"reasoning_tokens", 0}}}};
}

json Envelope(const ResponseMeta& meta, bool chunk) {
  const char* object = meta.kind == ApiKind::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                   : "text_completion";
  return json{{"id", meta.id},
              {"object", object},
              {"created", meta.created},
              {"model", meta.model},
              {"system_fingerprint", meta.system_fingerprint}};
}

}  // namespace

std::string ErrorJson(const ApiError& e) {
  std::string message = e.message;
  if (message.size() > 2048) message = message.substr(0, 2048) + "...";
  json j{{"error", {{"message", message}, {"type", e.type}, {"param", NullIfEmpty(e.param)},
                    {"code", NullIfEmpty(e.code)}}}};
  return Dump(j);
}

ApiError ErrorFromStatus(const Status& s) {
  ApiError e;
  e.message = s.message();
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      e.http_status = 400;
      e.code = "invalid_value";
      break;
    case StatusCode::kNotFound:
      e.http_status = 404;
      e.code = "not_found";
      break;
    case StatusCode::kOutOfRange:
      e.http_status = 413;
      e.code = "context_length_exceeded";
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "queue_full";
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "server_error";
      e.code = "unavailable";
      break;
    case StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "server_error";
      e.code = "timeout";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      e.code = "internal_error";
      break;
  }
  return e;
}

std::string CompletionBody(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                           const engine::TokenUsage& usage, const std::string& logprobs,
                           const std::vector<ToolCall>& tool_calls) {
  return CompletionBody(meta, std::vector<ChoiceBody>{{text, finish_reason, logprobs, tool_calls}}, usage);
}

std::string CompletionBody(const ResponseMeta& meta, const std::vector<ChoiceBody>& choices,
                           const engine::TokenUsage& usage) {
  json j = Envelope(meta, false);
  j["choices"] = json::array();
  for (size_t index = 0; index < choices.size(); ++index) {
    const ChoiceBody& c = choices[index];
    const json lp = c.logprobs.empty() ? json() : json::parse(c.logprobs);
    json choice;
    if (meta.kind == ApiKind::kChat) {
      json message = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
      if (!c.tool_calls.empty()) {
        if (c.text.empty()) message["content"] = nullptr;
        json calls = json::array();
        for (const ToolCall& t : c.tool_calls)
          calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        message["tool_calls"] = std::move(calls);
      }
      choice = {{"index", index}, {"message", std::move(message)}, {"logprobs", lp}, {"finish_reason", c.finish_reason}};
    } else {
      choice = {{"index", index}, {"text", c.text}, {"logprobs", lp}, {"finish_reason", c.finish_reason}};
    }
    j["choices"].push_back(std::move(choice));
  }
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string ChunkEvent(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                       bool include_usage, bool role_chunk, const std::string& logprobs, int index) {
  const json lp = logprobs.empty() ? json() : json::parse(logprobs);
  json j = Envelope(meta, true);
  json choice;
  if (meta.kind == ApiKind::kChat) {
    json delta = json::object();
    if (role_chunk) {
      delta["role"] = "assistant";
      delta["content"] = "";
    } else if (!text.empty()) {
      delta["content"] = text;
    }
    choice = {{"index", index}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", NullIfEmpty(finish_reason)}};
  } else {
    choice = {{"index", index}, {"text", text}, {"logprobs", lp}, {"finish_reason", NullIfEmpty(finish_reason)}};
  }
  j["choices"] = json::array({choice});
  if (include_usage) j["usage"] = nullptr;
  return "data: " + Dump(j) + "\n\n";
}

std::string ToolStreamEvents(const ResponseMeta& meta, const std::vector<ToolStreamPiece>& pieces, bool include_usage,
                             const std::string& logprobs) {
  std::string out;
  const bool any_content = std::any_of(pieces.begin(), pieces.end(), [](const ToolStreamPiece& p) { return p.call < 0; });
  std::string lp = logprobs;  // sent once
  if (!lp.empty() && !any_content) {
    out += ChunkEvent(meta, "", "", include_usage, false, lp);
    lp.clear();
  }
  for (const ToolStreamPiece& p : pieces) {
    if (p.call < 0) {
      out += ChunkEvent(meta, p.text, "", include_usage, false, lp);
      lp.clear();
      continue;
    }
    json delta = {{"index", p.call}};
    if (!p.id.empty()) {
      delta["id"] = p.id;
      delta["type"] = "function";
      delta["function"] = {{"name", p.name}, {"arguments", ""}};
    } else {
      delta["function"] = {{"arguments", p.text}};
    }
    json j = Envelope(meta, true);
    j["choices"] = json::array({json{{"index", 0}, {"delta", {{"tool_calls", json::array({delta})}}},
                                     {"logprobs", nullptr}, {"finish_reason", nullptr}}});
    if (include_usage) j["usage"] = nullptr;
    out += "data: " + Dump(j) + "\n\n";
  }
  return out;
}

std::string UsageEvent(const ResponseMeta& meta, const engine::TokenUsage& usage) {
  json j = Envelope(meta, true);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return "data: " + Dump(j) + "\n\n";
}

std::string ErrorEvent(const ApiError& error) { return "data: " + ErrorJson(error) + "\n\n"; }

}  // namespace attic::server
