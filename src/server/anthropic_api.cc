// The Anthropic Messages API: request validation and the response shapes.
#include "attic/server/anthropic_api.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace attic::server {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const ojson* Field(const ojson& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// What text may not contain: the private-use prefix of Attic's in-prompt markers.
std::optional<ApiError> CheckText(const std::string& param, const std::string& text) {
  if (text.find(kPartMarkerOpen) != std::string::npos)
    return InvalidParam(param,
                        "'" + param + "' contains a reserved character sequence (U+E000 followed by 'attic-part:')");
  return std::nullopt;
}

std::optional<ApiError> ReadNumber(const ojson& body, const char* name, double lo, double hi, bool lo_open, float* out) {
  const ojson* v = Field(body, name);
  if (v == nullptr) return std::nullopt;
  const double d = v->is_number() ? v->get<double>() : NAN;
  if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
    return InvalidParam(name, std::string("'") + name + "' must be a number " + (lo_open ? "above " : "from ") +
                             json(lo).dump() + " to " + json(hi).dump());
  *out = static_cast<float>(d);
  return std::nullopt;
}

std::optional<ApiError> ReadInt(const ojson& body, const char* name, int64_t lo, std::optional<int64_t>* out) {
  const ojson* v = Field(body, name);
  if (v == nullptr) return std::nullopt;
  const bool integral = v->is_number_integer() || (v->is_number_float() && std::isfinite(v->get<double>()) &&
                                                   v->get<double>() == std::floor(v->get<double>()));
  int64_t x = 0;
  if (integral) {
    const double d = v->get<double>();
    if (v->is_number_unsigned()) {
      x = v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v->get<uint64_t>());
    } else if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else {
      x = d >= 9.2e18 ? INT64_MAX : d <= -9.2e18 ? INT64_MIN : static_cast<int64_t>(d);
    }
  }
  if (!integral || x < lo)
    return InvalidParam(name, std::string("'") + name + "' must be an integer of at least " + std::to_string(lo));
  *out = x;
  return std::nullopt;
}

struct Breakpoints {
  int count = 0;
  size_t message = 0;  // where the last one ends: message index, byte offset in its content
  size_t offset = 0;
  int64_t ttl_s = 0;
};

// {"type": "ephemeral", "ttl"?: "5m" | "1h"}
std::optional<ApiError> ReadCacheControl(const ojson& cc, const std::string& param, Breakpoints* bp) {
  if (!cc.is_object() || Field(cc, "type") == nullptr || *Field(cc, "type") != "ephemeral")
    return InvalidParam(param,
                        "'" + param + "' must be {\"type\": \"ephemeral\"} with an optional \"ttl\" (\"5m\" or \"1h\")");
  int64_t ttl = 300;
  if (const ojson* t = Field(cc, "ttl")) {
    if (*t == "1h") {
      ttl = 3600;
    } else if (*t != "5m") {
      return InvalidParam(param + ".ttl", "'" + param + ".ttl' must be \"5m\" or \"1h\"");
    }
  }
  if (++bp->count > 4) return InvalidParam(param, "at most 4 blocks may have cache_control");
  bp->ttl_s = std::max(bp->ttl_s, ttl);
  return std::nullopt;
}

// A content: a string, or an array of text blocks (the only type served). Appends the
// text to *out; a block with cache_control moves the last breakpoint to its end.
std::optional<ApiError> ReadContent(const ojson& content, const std::string& param, size_t message, std::string* out,
                                    Breakpoints* bp) {
  if (content.is_string()) {
    if (content.get_ref<const std::string&>().empty())
      return InvalidParam(param, "'" + param + "' must not be empty");
    *out += content.get<std::string>();
    return CheckText(param, *out);
  }
  if (!content.is_array() || content.empty())
    return InvalidParam(param, "'" + param + "' must be a string or a non-empty array of content blocks");
  for (size_t j = 0; j < content.size(); ++j) {
    const ojson& b = content[j];
    const std::string p = param + "[" + std::to_string(j) + "]";
    if (!b.is_object()) return InvalidParam(p, "'" + p + "' must be a content block object");
    const ojson* type = Field(b, "type");
    if (type == nullptr || !type->is_string()) return InvalidParam(p + ".type", "'" + p + ".type' must be a string");
    if (*type != "text")
      return InvalidParam(p + ".type", "content block type '" + type->get<std::string>() +
                                      "' is not supported (only 'text')", "unsupported_parameter");
    const ojson* text = Field(b, "text");
    if (text == nullptr || !text->is_string()) return InvalidParam(p + ".text", "'" + p + ".text' must be a string");
    if (text->get_ref<const std::string&>().empty())
      return InvalidParam(p + ".text", "text content blocks must be non-empty");
    if (auto e = CheckText(p + ".text", text->get<std::string>())) return e;
    *out += text->get<std::string>();
    if (const ojson* cc = Field(b, "cache_control")) {
      if (auto e = ReadCacheControl(*cc, p + ".cache_control", bp)) return e;
      bp->message = message;
      bp->offset = out->size();
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ReadFields(const ojson& body, MessagesRequest* m) {
  ApiRequest& r = m->chat;
  r.kind = ApiKind::kChat;
  const ojson* model = Field(body, "model");
  if (model == nullptr) return InvalidParam("model", "'model' is required", "missing_required_parameter");
  if (!model->is_string() || model->get_ref<const std::string&>().empty())
    return InvalidParam("model", "'model' must be a non-empty string");
  r.model = model->get<std::string>();
  std::optional<int64_t> max_tokens, top_k;
  if (Field(body, "max_tokens") == nullptr)
    return InvalidParam("max_tokens", "'max_tokens' is required", "missing_required_parameter");
  if (auto e = ReadInt(body, "max_tokens", 1, &max_tokens)) return e;
  r.max_tokens = max_tokens;
  Breakpoints bp;
  if (const ojson* sys = Field(body, "system")) {
    tokenizer::ChatMessage cm;
    cm.role = "system";
    if (auto e = ReadContent(*sys, "system", 0, &cm.content, &bp)) return e;
    r.messages.push_back(std::move(cm));
  }
  const ojson* msgs = Field(body, "messages");
  if (msgs == nullptr) return InvalidParam("messages", "'messages' is required", "missing_required_parameter");
  if (!msgs->is_array() || msgs->empty()) return InvalidParam("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& msg = (*msgs)[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) return InvalidParam(p, "'" + p + "' must be an object");
    const ojson* role = Field(msg, "role");
    if (role == nullptr || !role->is_string() || (*role != "user" && *role != "assistant"))
      return InvalidParam(p + ".role", "'" + p + ".role' must be \"user\" or \"assistant\"");
    const ojson* content = Field(msg, "content");
    if (content == nullptr) return InvalidParam(p + ".content",
                                                "'" + p + ".content' is required", "missing_required_parameter");
    tokenizer::ChatMessage cm;
    cm.role = role->get<std::string>();
    if (auto e = ReadContent(*content, p + ".content", r.messages.size(), &cm.content, &bp)) return e;
    r.messages.push_back(std::move(cm));
  }
  if (r.messages.back().role != "user")
    return InvalidParam("messages",
                        "the last message must have role \"user\" (a final assistant message, a prefill, is "
                        "not supported by this server)", "unsupported_parameter");
  if (const ojson* cc = Field(body, "cache_control")) {  // automatic caching: up to the last message
    if (auto e = ReadCacheControl(*cc, "cache_control", &bp)) return e;
    bp.message = r.messages.size() - 1;
    bp.offset = r.messages.back().content.size();
  }
  if (bp.count > 0) {
    m->marked = r.messages;
    m->marked[bp.message].content.insert(bp.offset, kCacheBreakMarker);
    m->cache_ttl_s = bp.ttl_s;
  }
  if (auto e = ReadNumber(body, "temperature", 0.0, 1.0, false, &r.temperature)) return e;
  if (auto e = ReadNumber(body, "top_p", 0.0, 1.0, true, &r.top_p)) return e;
  if (auto e = ReadInt(body, "top_k", 0, &top_k)) return e;
  if (top_k) r.top_k = static_cast<int>(std::min<int64_t>(*top_k, 1 << 30));
  if (const ojson* stops = Field(body, "stop_sequences")) {
    if (!stops->is_array()) return InvalidParam("stop_sequences", "'stop_sequences' must be an array of strings");
    if (stops->size() > static_cast<size_t>(kMaxStops))
      return InvalidParam("stop_sequences", "at most " + std::to_string(kMaxStops) + " stop sequences are allowed");
    for (const ojson& s : *stops) {
      if (!s.is_string() || s.get_ref<const std::string&>().empty() || s.get_ref<const std::string&>().size() > 1024)
        return InvalidParam("stop_sequences", "each stop sequence must be a non-empty string of at most 1024 bytes");
      m->stop_sequences.push_back(s.get<std::string>());
    }
    r.stop = m->stop_sequences;
  }
  if (const ojson* s = Field(body, "stream")) {
    if (!s->is_boolean()) return InvalidParam("stream", "'stream' must be a boolean");
    r.stream = s->get<bool>();
  }
  if (const ojson* md = Field(body, "metadata")) {
    if (!md->is_object()) return InvalidParam("metadata", "'metadata' must be an object");
    if (const ojson* u = Field(*md, "user_id")) {
      if (!u->is_string() || u->get_ref<const std::string&>().size() > 256)
        return InvalidParam("metadata.user_id", "'metadata.user_id' must be a string of at most 256 bytes");
      r.user = u->get<std::string>();
    }
  }
  for (const char* name : {"tools", "tool_choice", "mcp_servers", "container"}) {
    const ojson* v = Field(body, name);
    if (v != nullptr && !(v->is_array() && v->empty()))
      return InvalidParam(name, std::string("'") + name + "' is not supported on /v1/messages by this server",
                          "unsupported_parameter");
  }
  if (const ojson* t = Field(body, "thinking"); t != nullptr && !(t->is_object() && Field(*t, "type") != nullptr &&
                                                                   *Field(*t, "type") == "disabled"))
    return InvalidParam("thinking", "extended thinking is not supported by this server", "unsupported_parameter");
  return std::nullopt;
}

json UsageJson(const MessagesUsage& u) {
  return json{{"input_tokens", u.input_tokens},
              {"cache_creation_input_tokens", u.cache_creation_input_tokens},
              {"cache_read_input_tokens", u.cache_read_input_tokens},
              {"output_tokens", u.output_tokens}};
}

std::string Event(const char* name, const json& data) {
  return std::string("event: ") + name + "\ndata: " + Dump(data) + "\n\n";
}

json NullIfEmpty(const std::string& s) { return s.empty() ? json() : json(s); }

}  // namespace

MessagesParse ParseMessagesRequest(std::string_view body) {
  MessagesParse out;
  ojson parsed;
  out.error = ParseJsonObject(body, &parsed);
  if (out.error) return out;
  try {
    out.error = ReadFields(parsed, &out.request);
  } catch (const std::exception& e) {  // defensive: a type we did not expect
    out.error = InvalidParam("", std::string("invalid request: ") + e.what());
  }
  return out;
}

const char* AnthropicErrorType(int http_status) {
  switch (http_status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return http_status >= 500 ? "api_error" : "invalid_request_error";
  }
}

std::string AnthropicErrorJson(const ApiError& e) {
  std::string message = e.message;
  if (!e.param.empty() && message.find(e.param) == std::string::npos) message = e.param + ": " + message;
  if (message.size() > 2048) message = message.substr(0, 2048) + "...";
  return Dump(json{{"type", "error"}, {"error", {{"type", AnthropicErrorType(e.http_status)}, {"message", message}}}});
}

MessagesUsage AnthropicUsage(const engine::TokenUsage& usage, int breakpoint_tokens, bool stored) {
  MessagesUsage u;
  u.output_tokens = usage.completion_tokens;
  u.cache_read_input_tokens = usage.cached_tokens;
  if (stored) u.cache_creation_input_tokens = std::max(0, std::min(breakpoint_tokens, usage.prompt_tokens) - usage.cached_tokens);
  u.input_tokens = usage.prompt_tokens - u.cache_read_input_tokens - u.cache_creation_input_tokens;
  return u;
}

std::string AnthropicStopReason(const std::string& finish_reason, const std::string& stop_string,
                                const std::vector<std::string>& stop_sequences, std::string* stop_sequence) {
  stop_sequence->clear();
  if (finish_reason == "length") return "max_tokens";
  if (!stop_string.empty() && std::find(stop_sequences.begin(), stop_sequences.end(), stop_string) != stop_sequences.end()) {
    *stop_sequence = stop_string;
    return "stop_sequence";
  }
  return "end_turn";
}

std::string MessageBody(const std::string& id, const std::string& model, const std::string& text,
                        const std::string& stop_reason, const std::string& stop_sequence, const MessagesUsage& usage) {
  return Dump(json{{"id", id},
                   {"type", "message"},
                   {"role", "assistant"},
                   {"model", model},
                   {"content", json::array({json{{"type", "text"}, {"text", text}}})},
                   {"stop_reason", stop_reason},
                   {"stop_sequence", NullIfEmpty(stop_sequence)},
                   {"usage", UsageJson(usage)}});
}

std::string MessageStartEvent(const std::string& id, const std::string& model, int input_tokens) {
  MessagesUsage u;
  u.input_tokens = input_tokens;  // the whole prompt; message_delta splits it when known
  return Event("message_start", json{{"type", "message_start"},
                                     {"message", {{"id", id},
                                                  {"type", "message"},
                                                  {"role", "assistant"},
                                                  {"model", model},
                                                  {"content", json::array()},
                                                  {"stop_reason", nullptr},
                                                  {"stop_sequence", nullptr},
                                                  {"usage", UsageJson(u)}}}});
}

std::string ContentBlockStartEvent() {
  return Event("content_block_start",
               json{{"type", "content_block_start"}, {"index", 0}, {"content_block", {{"type", "text"}, {"text", ""}}}});
}

std::string TextDeltaEvent(const std::string& text) {
  return Event("content_block_delta",
               json{{"type", "content_block_delta"}, {"index", 0}, {"delta", {{"type", "text_delta"}, {"text", text}}}});
}

std::string ContentBlockStopEvent() { return Event("content_block_stop", json{{"type", "content_block_stop"}, {"index", 0}}); }

std::string MessageDeltaEvent(const std::string& stop_reason, const std::string& stop_sequence, const MessagesUsage& usage) {
  return Event("message_delta", json{{"type", "message_delta"},
                                     {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", NullIfEmpty(stop_sequence)}}},
                                     {"usage", UsageJson(usage)}});
}

std::string MessageStopEvent() { return Event("message_stop", json{{"type", "message_stop"}}); }

std::string AnthropicErrorEvent(const ApiError& error) {
  return "event: error\ndata: " + AnthropicErrorJson(error) + "\n\n";
}

}  // namespace attic::server
