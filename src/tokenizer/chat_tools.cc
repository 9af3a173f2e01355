// Tool formats of the chat template families, each reproducing its reference Jinja
// template byte for byte (Hugging Face's `tojson` is Python's json.dumps with
// ensure_ascii=False):
//  * ChatML: Qwen2.5-Instruct's tokenizer_config.json chat_template.
//  * Llama-3: Llama 3.1-Instruct's, with its defaults (tools_in_user_message, date_string
//    "26 Jul 2024", no builtin_tools).
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tokenizer/chat_tools.h"

namespace attic::tokenizer {

namespace {

using ojson = nlohmann::ordered_json;

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
    return PyDumps(ojson::parse(arguments));
  } catch (const std::exception&) {
    return PyDumps(ojson(arguments));
  }
}

StatusOr<std::vector<ojson>> ParseTools(const ChatRenderOptions& opts) {
  std::vector<ojson> tools;
  for (size_t i = 0; i < opts.tools.size(); ++i) {
    try {
      tools.push_back(ojson::parse(opts.tools[i]));
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

}  // namespace

bool ChatUsesTools(const std::vector<ChatMessage>& messages, const ChatRenderOptions& opts) {
  if (!opts.tools.empty()) return true;
  for (const ChatMessage& m : messages)
    if (m.role == "tool" || !m.tool_calls.empty()) return true;
  return false;
}

StatusOr<std::string> PythonJsonDumps(const std::string& json_text, int indent) {
  try {
    return PyDumps(ojson::parse(json_text), indent);
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("not JSON: ") + e.what());
  }
}

StatusOr<std::string> RenderChatWithTools(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                          const ChatRenderOptions& opts) {
  switch (kind) {
    case ChatTemplateKind::kChatML: return RenderHermes(messages, opts);
    case ChatTemplateKind::kLlama3: return RenderLlama31(messages, opts);
    case ChatTemplateKind::kLlama2: break;
  }
  return InvalidArgumentError("chat: the llama2 chat template family has no tool format (tools, tool calls and "
                              "tool results need a ChatML or Llama-3 template)");
}

}  // namespace attic::tokenizer
