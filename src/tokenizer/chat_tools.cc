// Tool formats of the chat template families, each reproducing its reference Jinja
// template byte for byte (Hugging Face's `tojson` is Python's json.dumps with
// ensure_ascii=False):
//  * ChatML: Qwen2.5-Instruct's tokenizer_config.json chat_template.
//  * Llama-3: Llama 3.1-Instruct's, with its defaults (tools_in_user_message, date_string
//    "26 Jul 2024", no builtin_tools).
//  * Mistral: Mistral-7B-Instruct-v0.3's tool-calling template, for every conversation of
//    the family (it renders plain chats too). Its quirks are kept, since they are what the
//    model was given: the system prompt joins the last message only when that is a user
//    message; the tools go before every user message equal to the last one; a tool
//    definition's string fields and a tool result are written raw, not as JSON strings;
//    an assistant turn with calls loses its text.
#include <nlohmann/json.hpp>

#include <algorithm>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tokenizer/chat_tools.h"

namespace attic::tokenizer {

namespace {

using ojson = nlohmann::ordered_json;

// JSON text as Python's json.loads reads it. nlohmann::json::parse alone ends its input at
// a NUL byte ("{}\0x" reads as {}); JSON text never holds one, and json.loads refuses it.
ojson ParseJsonText(const std::string& text) {
  if (text.find('\0') != std::string::npos) throw std::invalid_argument("a NUL byte is not JSON text");
  return ojson::parse(text);
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && IsSpace(s[b])) ++b;
  while (e > b && IsSpace(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// Python's json.dumps(ensure_ascii=False): strings escape as nlohmann does ('"', '\\',
// control characters; the rest as UTF-8), numbers in their shortest round-trip form.
void Dump(const ojson& v, int indent, int level, std::string* out) {
  const std::string nl = indent < 0 ? "" : "\n" + std::string(static_cast<size_t>(indent) * (level + 1), ' ');
  const std::string close = indent < 0 ? "" : "\n" + std::string(static_cast<size_t>(indent) * level, ' ');
  const char* sep = indent < 0 ? ", " : ",";
  if (v.is_object()) {
    if (v.empty()) {
      *out += "{}";
      return;
    }
    *out += "{";
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      if (!first) *out += sep;
      first = false;
      *out += nl + ojson(k).dump() + ": ";
      Dump(x, indent, level + 1, out);
    }
    *out += close + "}";
  } else if (v.is_array()) {
    if (v.empty()) {
      *out += "[]";
      return;
    }
    *out += "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) *out += sep;
      *out += nl;
      Dump(v[i], indent, level + 1, out);
    }
    *out += close + "]";
  } else {
    *out += v.dump(-1, ' ', false, ojson::error_handler_t::replace);
  }
}

std::string PyDumps(const ojson& v, int indent = -1) {
  std::string out;
  Dump(v, indent, 0, &out);
  return out;
}

// A call's arguments as its template's `tojson` writes them: the object they hold (the
// OpenAI wire format sends a JSON text; templates expect the mapping), or the text as a
// JSON string when it is not JSON.
std::string ArgumentsJson(const std::string& arguments) {
  try {
    return PyDumps(ParseJsonText(arguments));
  } catch (const std::exception&) {
    return PyDumps(ojson(arguments));
  }
}

StatusOr<std::vector<ojson>> ParseTools(const ChatRenderOptions& opts) {
  std::vector<ojson> tools;
  for (size_t i = 0; i < opts.tools.size(); ++i) {
    try {
      tools.push_back(ParseJsonText(opts.tools[i]));
    } catch (const std::exception&) {
      return InvalidArgumentError("chat: tool " + std::to_string(i) + " is not JSON");
    }
  }
  return tools;
}

Status UnknownRole(const std::string& r) {
  return InvalidArgumentError("chat: unknown role '" + r + "' (expected system, user, assistant or tool)");
}

StatusOr<std::string> RenderHermes(const std::vector<ChatMessage>& msgs, const ChatRenderOptions& opts) {
  ATTIC_ASSIGN_OR_RETURN(std::vector<ojson> tools, ParseTools(opts));
  std::string out;
  const bool has_system = !msgs.empty() && msgs[0].role == "system";
  if (!tools.empty()) {
    out += "<|im_start|>system\n";
    out += has_system ? msgs[0].content : opts.default_system_prompt;
    out += "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
           "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const ojson& t : tools) out += "\n" + PyDumps(t);
    out += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
           "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
           "<args-json-object>}\n</tool_call><|im_end|>\n";
  } else if (has_system) {
    out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";
  } else if (!opts.default_system_prompt.empty()) {
    out += "<|im_start|>system\n" + opts.default_system_prompt + "<|im_end|>\n";
  }
  for (size_t i = has_system ? 1 : 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "user" || m.role == "system" || (m.role == "assistant" && m.tool_calls.empty())) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      out += "<|im_start|>assistant";
      if (!m.content.empty()) out += "\n" + m.content;
      for (const ChatToolCall& c : m.tool_calls)
        out += "\n<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + ArgumentsJson(c.arguments) + "}\n</tool_call>";
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == msgs.size() || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    } else {
      return UnknownRole(m.role);
    }
  }
  if (opts.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

StatusOr<std::string> RenderLlama31(const std::vector<ChatMessage>& msgs, const ChatRenderOptions& opts) {
  ATTIC_ASSIGN_OR_RETURN(std::vector<ojson> tools, ParseTools(opts));
  const std::string bos = opts.bos_token == "<s>" ? "<|begin_of_text|>" : opts.bos_token;
  size_t at = 0;
  std::string system;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = Trim(msgs[0].content);
    at = 1;
  }
  std::string out = bos + "<|start_header_id|>system<|end_header_id|>\n\n";
  if (!tools.empty()) out += "Environment: ipython\n";
  out += "Cutting Knowledge Date: December 2023\nToday Date: " + opts.date_string + "\n\n";
  out += system + "<|eot_id|>";
  if (!tools.empty()) {
    if (at >= msgs.size())
      return InvalidArgumentError("chat: the Llama 3.1 template puts the tools in the first user message, and there is none");
    out += "<|start_header_id|>user<|end_header_id|>\n\n";
    out += "Given the following functions, please respond with a JSON for a function call with its proper "
           "arguments that best answers the given prompt.\n\n";
    out += "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
           "value}.Do not use variables.\n\n";
    for (const ojson& t : tools) out += PyDumps(t, 4) + "\n\n";
    out += Trim(msgs[at].content) + "<|eot_id|>";
    ++at;
  }
  for (size_t i = at; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "tool") {
      // A string is iterable in Jinja: the template writes the result with tojson.
      out += "<|start_header_id|>ipython<|end_header_id|>\n\n" + PyDumps(ojson(m.content)) + "<|eot_id|>";
    } else if (!m.tool_calls.empty()) {
      if (m.tool_calls.size() != 1)
        return InvalidArgumentError("chat: the Llama 3.1 template takes one tool call per assistant message (this one has " +
                                    std::to_string(m.tool_calls.size()) + ")");
      const ChatToolCall& c = m.tool_calls[0];
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"" + c.name + "\", \"parameters\": " +
             ArgumentsJson(c.arguments) + "}<|eot_id|>";
    } else if (m.role == "system" || m.role == "user" || m.role == "assistant") {
      out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + Trim(m.content) + "<|eot_id|>";
    } else {
      return UnknownRole(m.role);
    }
  }
  if (opts.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}


// Mistral-7B-Instruct-v0.3 (tests/data/tokenizer/mistral-v0.3.jinja).
StatusOr<std::string> RenderMistral(const std::vector<ChatMessage>& msgs, const ChatRenderOptions& opts) {
  ATTIC_ASSIGN_OR_RETURN(std::vector<ojson> tools, ParseTools(opts));
  size_t start = 0;
  const std::string* system = nullptr;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = &msgs[0].content;
    start = 1;
  }
  // User and plain assistant turns alternate; calls and results are left out of the count.
  const std::string* last_user = nullptr;
  for (size_t i = start, turn = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "user") last_user = &m.content;
    if (m.role == "tool" || !m.tool_calls.empty()) continue;
    if ((m.role == "user") != (turn % 2 == 0))
      return InvalidArgumentError("chat: the Mistral template needs roles that alternate user/assistant/user/... after "
                                  "the optional system message (tool calls and tool results aside)");
    ++turn;
  }
  std::string tools_block;
  if (!tools.empty()) {
    tools_block = "[AVAILABLE_TOOLS] [";
    for (size_t t = 0; t < tools.size(); ++t) {
      auto f = tools[t].find("function");
      if (f == tools[t].end() || !f->is_object())
        return InvalidArgumentError("chat: tool " + std::to_string(t) + " has no \"function\" object");
      tools_block += "{\"type\": \"function\", \"function\": {";
      bool first = true;
      for (const auto& [key, val] : f->items()) {
        if (key == "return") continue;
        if (!first) tools_block += ", ";
        first = false;
        // A string is written between quotes as it is (the template does not escape it).
        tools_block += "\"" + key + "\": " + (val.is_string() ? "\"" + val.get<std::string>() + "\"" : PyDumps(val));
      }
      tools_block += t + 1 < tools.size() ? "}}, " : "}}]";
    }
    tools_block += "[/AVAILABLE_TOOLS]";
  }
  std::string out = opts.bos_token;
  for (size_t i = start; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "user") {
      // The template compares messages, so an earlier user message equal to the last one
      // gets the tools too.
      if (!tools.empty() && m.content == *last_user) out += tools_block;
      if (i + 1 == msgs.size() && system != nullptr) {
        out += "[INST] " + *system + "\n\n" + m.content + "[/INST]";
      } else {
        out += "[INST] " + m.content + "[/INST]";
      }
    } else if (!m.tool_calls.empty()) {
      out += "[TOOL_CALLS] [";
      for (size_t c = 0; c < m.tool_calls.size(); ++c) {
        const ChatToolCall& call = m.tool_calls[c];
        out += "{\"name\": " + PyDumps(ojson(call.name)) + ", \"arguments\": " + ArgumentsJson(call.arguments) +
               ", \"id\": \"" + MistralToolCallId(call.id) + "\"}";
        out += c + 1 < m.tool_calls.size() ? ", " : "]" + opts.eos_token;
      }
    } else if (m.role == "assistant") {
      out += " " + Trim(m.content) + opts.eos_token;
    } else if (m.role == "tool") {
      out += "[TOOL_RESULTS] {\"content\": " + m.content + ", \"call_id\": \"" + MistralToolCallId(m.tool_call_id) +
             "\"}[/TOOL_RESULTS]";
    } else if (m.role == "system") {
      return InvalidArgumentError("chat: the Mistral template takes a system message only as the first message");
    } else {
      return UnknownRole(m.role);
    }
  }
  return out;
}

}  // namespace

std::string MistralToolCallId(const std::string& id) {
  const bool fits = id.size() == 9 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  });
  if (fits) return id;
  uint64_t h = 14695981039346656037ull;  // FNV-1a, 64 bits
  for (unsigned char c : id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  static constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string out;
  for (int i = 0; i < 9; ++i) {
    out.push_back(kDigits[h % 62]);
    h /= 62;
  }
  return out;
}

bool ChatUsesTools(const std::vector<ChatMessage>& messages, const ChatRenderOptions& opts) {
  if (!opts.tools.empty()) return true;
  for (const ChatMessage& m : messages)
    if (m.role == "tool" || !m.tool_calls.empty()) return true;
  return false;
}

StatusOr<std::string> PythonJsonDumps(const std::string& json_text, int indent) {
  try {
    return PyDumps(ParseJsonText(json_text), indent);
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("not JSON: ") + e.what());
  }
}

StatusOr<std::string> RenderChatWithTools(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                          const ChatRenderOptions& opts) {
  switch (kind) {
    case ChatTemplateKind::kChatML: return RenderHermes(messages, opts);
    case ChatTemplateKind::kLlama3: return RenderLlama31(messages, opts);
    case ChatTemplateKind::kMistral: return RenderMistral(messages, opts);
    case ChatTemplateKind::kLlama2: break;
  }
  return InvalidArgumentError("chat: the llama2 chat template family has no tool format (tools, tool calls and "
                              "tool results need a ChatML, Llama-3 or Mistral template)");
}

}  // namespace attic::tokenizer
