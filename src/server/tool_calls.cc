// Tools: the grammar of forced calls, and the model's output read back into calls.
#include "attic/server/tool_calls.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "server/json_stream.h"

namespace attic::server {

namespace {

using ojson = nlohmann::ordered_json;
using tokenizer::ChatTemplateKind;

constexpr const char* kCallOpen = "<tool_call>";
constexpr const char* kCallClose = "</tool_call>";
constexpr const char* kPythonTag = "<|python_tag|>";
constexpr const char* kMistralCalls = "[TOOL_CALLS]";

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && IsSpace(s[b])) ++b;
  while (e > b && IsSpace(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string TrimRight(std::string s) {
  while (!s.empty() && IsSpace(s.back())) s.pop_back();
  return s;
}

bool Declared(const ToolSpec& spec, const std::string& name) {
  return std::any_of(spec.tools.begin(), spec.tools.end(), [&](const ToolSpec::Tool& t) { return t.name == name; });
}

// {"name": <declared function>, "arguments"|"parameters": <object, or its JSON text>}.
bool ReadCall(const ojson& v, const ToolSpec& spec, ToolCall* out) {
  if (!v.is_object()) return false;
  auto name = v.find("name");
  if (name == v.end() || !name->is_string() || !Declared(spec, name->get<std::string>())) return false;
  const ojson* args = nullptr;
  for (const char* key : {"arguments", "parameters"})
    if (auto it = v.find(key); it != v.end() && args == nullptr) args = &*it;
  ojson obj = ojson::object();
  if (args != nullptr && args->is_string()) {
    const std::string text = args->get<std::string>();
    if (HasNulByte(text)) return false;  // "{}\u0000..." is not an object's JSON text
    try {
      obj = ojson::parse(text);
    } catch (const std::exception&) {
      return false;
    }
  } else if (args != nullptr) {
    obj = *args;
  }
  if (!obj.is_object()) return false;
  out->name = name->get<std::string>();
  out->arguments = obj.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return true;
}

// A call or an array of calls; nothing is added unless all of them read.
bool ReadCalls(const std::string& text, const ToolSpec& spec, std::vector<ToolCall>* out) {
  if (HasNulByte(text)) return false;  // nlohmann would read a call and drop what follows the NUL
  ojson v;
  try {
    v = ojson::parse(text);
  } catch (const std::exception&) {
    return false;
  }
  std::vector<ToolCall> calls;
  if (v.is_array()) {
    if (v.empty()) return false;
    for (const ojson& c : v) {
      ToolCall call;
      if (!ReadCall(c, spec, &call)) return false;
      calls.push_back(std::move(call));
    }
  } else {
    ToolCall call;
    if (!ReadCall(v, spec, &call)) return false;
    calls.push_back(std::move(call));
  }
  out->insert(out->end(), calls.begin(), calls.end());
  return true;
}

// ChatML: <tool_call> blocks anywhere (the last may lack its closing tag: a reply that
// ran out of tokens or stopped at the end of turn).
ToolOutput ParseHermes(const std::string& text, const ToolSpec& spec) {
  ToolOutput out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find(kCallOpen, at);
    if (open == std::string::npos) break;
    const size_t body = open + std::strlen(kCallOpen);
    const size_t close = text.find(kCallClose, body);
    const size_t end = close == std::string::npos ? text.size() : close + std::strlen(kCallClose);
    out.content += text.substr(at, open - at);
    if (!ReadCalls(Trim(text.substr(body, (close == std::string::npos ? text.size() : close) - body)), spec, &out.calls))
      out.content += text.substr(open, end - open);
    at = end;
  }
  if (at < text.size()) out.content += text.substr(at);
  if (!out.calls.empty()) out.content = TrimRight(out.content);
  return out;
}

// Llama-3: the whole reply is one call (or, as Llama models also write, calls separated
// by ';', or an array of them).
ToolOutput ParseLlama3(const std::string& text, const ToolSpec& spec) {
  ToolOutput out;
  std::string t = Trim(text);
  if (t.rfind(kPythonTag, 0) == 0) t = Trim(t.substr(std::strlen(kPythonTag)));
  if (!t.empty() && (t[0] == '{' || t[0] == '[')) {
    if (ReadCalls(t, spec, &out.calls)) return out;
    std::vector<ToolCall> calls;
    bool all = true;
    size_t at = 0;
    while (all && at <= t.size()) {
      size_t semi = t.find(';', at);
      if (semi == std::string::npos) semi = t.size();
      all = ReadCalls(Trim(t.substr(at, semi - at)), spec, &calls);
      at = semi + 1;
    }
    if (all && !calls.empty()) {
      out.calls = std::move(calls);
      return out;
    }
  }
  out.content = text;
  return out;
}

// Mistral: [TOOL_CALLS] followed by an array of calls (or one call). The marker is a
// control token that detokenization usually drops; where a tokenizer writes it, text
// before it is content.
ToolOutput ParseMistral(const std::string& text, const ToolSpec& spec) {
  ToolOutput out;
  const size_t marker = text.find(kMistralCalls);
  const std::string head = marker == std::string::npos ? "" : text.substr(0, marker);
  const std::string body =
      Trim(marker == std::string::npos ? text : text.substr(marker + std::strlen(kMistralCalls)));
  if (!body.empty() && (body[0] == '[' || body[0] == '{') && ReadCalls(body, spec, &out.calls)) {
    out.content = TrimRight(head);
    return out;
  }
  out.content = text;
  return out;
}

}  // namespace

std::vector<std::string> ToolSpec::ToolJson() const {
  std::vector<std::string> out;
  out.reserve(tools.size());
  for (const Tool& t : tools) out.push_back(t.json);
  return out;
}

StatusOr<std::shared_ptr<const grammar::Grammar>> ToolCallGrammar(const ToolSpec& spec, ChatTemplateKind kind) {
  if (!spec.forced() || spec.tools.empty()) return std::shared_ptr<const grammar::Grammar>();
  std::vector<grammar::Grammar::Function> functions;
  std::vector<std::string> names;
  for (const ToolSpec::Tool& t : spec.tools) {
    if (spec.choice == ToolChoice::kFunction && t.name != spec.function) continue;
    grammar::Grammar::Function f;
    f.name = t.name;
    if (!t.parameters.empty()) f.parameters = ojson::parse(t.parameters);
    functions.push_back(std::move(f));
    names.push_back(t.name);
  }
  // Llama 3.1 writes "parameters" and takes one call per turn; Hermes and Mistral
  // "arguments", several.
  const std::string args_key = kind == ChatTemplateKind::kLlama3 ? "parameters" : "arguments";
  const bool array = spec.choice == ToolChoice::kRequired && spec.parallel && kind != ChatTemplateKind::kLlama3;
  auto g = grammar::Grammar::ToolCalls(functions, args_key, array);
  if (g.ok()) return g;
  std::string message = g.status().message();
  if (message.rfind("functions[", 0) == 0) {  // "functions[i]: ..." -> the function's name
    const size_t close = message.find("]: ");
    const size_t i = std::stoul(message.substr(10, close - 10));
    if (close != std::string::npos && i < names.size())
      message = "the parameters of function '" + names[i] + "': " + message.substr(close + 3);
  }
  return InvalidArgumentError(message);
}

ToolOutput ParseToolOutput(const std::string& text, ChatTemplateKind kind, const ToolSpec& spec) {
  if (spec.forced()) {
    ToolOutput out;
    if (!ReadCalls(Trim(text), spec, &out.calls)) out.content = text;
    return out;
  }
  if (kind == ChatTemplateKind::kLlama3) return ParseLlama3(text, spec);
  if (kind == ChatTemplateKind::kMistral) return ParseMistral(text, spec);
  return ParseHermes(text, spec);
}

bool ReadToolCallJson(const std::string& text, const ToolSpec& spec, std::vector<ToolCall>* out) {
  return ReadCalls(Trim(text), spec, out);
}

std::string ToolCallId(ChatTemplateKind kind, const std::string& base, size_t index) {
  const std::string id = base + std::to_string(index);
  return kind == ChatTemplateKind::kMistral ? tokenizer::MistralToolCallId(id) : id;
}

void NameToolCalls(ChatTemplateKind kind, const std::string& base, std::vector<ToolCall>* calls) {
  for (size_t i = 0; i < calls->size(); ++i) (*calls)[i].id = ToolCallId(kind, base, i);
}

}  // namespace attic::server
