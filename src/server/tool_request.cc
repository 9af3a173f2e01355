// Parsing and validation of the tool fields of a chat request (OpenAI's shapes).
#include "server/tool_request.h"

#include <algorithm>
#include <cctype>
#include <set>

namespace attic::server {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

bool ValidName(const std::string& s) {
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

const ojson* OField(const ojson& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::optional<ApiError> ReadTool(const ojson& t, size_t i, ToolSpec::Tool* out) {
  const std::string p = "tools[" + std::to_string(i) + "]";
  if (!t.is_object()) return InvalidParam(p,
                                          "'" + p + "' must be an object {\"type\": \"function\", \"function\": {...}}");
  const ojson* type = OField(t, "type");
  if (type == nullptr || !type->is_string())
    return InvalidParam(p + ".type",
                        "'" + p + ".type' is required and must be \"function\"", "missing_required_parameter");
  if (*type != "function")
    return InvalidParam(p + ".type",
                        "tool type '" + type->get<std::string>() + "' is not supported (only \"function\")",
                        "unsupported_parameter");
  const ojson* f = OField(t, "function");
  if (f == nullptr || !f->is_object())
    return InvalidParam(p + ".function",
                        "'" + p + ".function' is required and must be an object", "missing_required_parameter");
  const ojson* name = OField(*f, "name");
  if (name == nullptr || !name->is_string() || !ValidName(name->get<std::string>()))
    return InvalidParam(p + ".function.name",
                        "'" + p + ".function.name' must be 1 to 64 characters: a-z, A-Z, 0-9, '_' or '-'");
  if (const ojson* d = OField(*f, "description"); d != nullptr && !d->is_string())
    return InvalidParam(p + ".function.description", "'" + p + ".function.description' must be a string");
  if (const ojson* s = OField(*f, "strict"); s != nullptr && !s->is_boolean())
    return InvalidParam(p + ".function.strict", "'" + p + ".function.strict' must be a boolean");
  if (const ojson* params = OField(*f, "parameters")) {
    if (!params->is_object())
      return InvalidParam(p + ".function.parameters", "'" + p + ".function.parameters' must be a JSON Schema object");
    out->parameters = params->dump();
  }
  out->name = name->get<std::string>();
  out->json = t.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ReadToolFields(const ojson& body, ToolSpec* spec) {
  if (const ojson* tools = OField(body, "tools")) {
    if (!tools->is_array()) return InvalidParam("tools", "'tools' must be an array of tools");
    if (tools->size() > kMaxTools)
      return InvalidParam("tools", "at most " + std::to_string(kMaxTools) + " tools are allowed");
    std::set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      ToolSpec::Tool t;
      if (auto e = ReadTool((*tools)[i], i, &t)) return e;
      if (!names.insert(t.name).second)
        return InvalidParam("tools[" + std::to_string(i) + "].function.name", "two tools are named '" + t.name + "'");
      spec->tools.push_back(std::move(t));
    }
  }
  spec->choice = spec->tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (const ojson* c = OField(body, "tool_choice")) {
    const char* kShape = "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}";
    if (c->is_string()) {
      const std::string s = c->get<std::string>();
      if (s == "none") {
        spec->choice = ToolChoice::kNone;
      } else if (s == "auto") {
        spec->choice = ToolChoice::kAuto;
      } else if (s == "required") {
        spec->choice = ToolChoice::kRequired;
      } else {
        return InvalidParam("tool_choice", kShape);
      }
    } else if (c->is_object()) {
      const ojson* type = OField(*c, "type");
      const ojson* f = OField(*c, "function");
      const ojson* name = f != nullptr && f->is_object() ? OField(*f, "name") : nullptr;
      if (type == nullptr || *type != "function" || name == nullptr || !name->is_string())
        return InvalidParam("tool_choice", kShape);
      spec->choice = ToolChoice::kFunction;
      spec->function = name->get<std::string>();
      if (std::none_of(spec->tools.begin(), spec->tools.end(),
                       [&](const ToolSpec::Tool& t) { return t.name == spec->function; }))
        return InvalidParam("tool_choice.function.name", "tool_choice names function '" + spec->function +
                                                        "', which is not in 'tools'");
    } else {
      return InvalidParam("tool_choice", kShape);
    }
    if (spec->choice != ToolChoice::kNone && spec->tools.empty())
      return InvalidParam("tool_choice", "'tool_choice' other than \"none\" needs 'tools'");
  }
  if (const ojson* par = OField(body, "parallel_tool_calls")) {
    if (!par->is_boolean()) return InvalidParam("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    spec->parallel = par->get<bool>();
  }
  return std::nullopt;
}

std::optional<ApiError> ReadMessageToolFields(const json& m, size_t i, const std::string& role,
                                              tokenizer::ChatMessage* cm) {
  const std::string p = "messages[" + std::to_string(i) + "]";
  auto id = m.find("tool_call_id");
  if (role == "tool") {
    if (id == m.end() || !id->is_string() || id->get_ref<const std::string&>().empty() ||
        id->get_ref<const std::string&>().size() > 256)
      return InvalidParam(p + ".tool_call_id",
                          "'" + p + ".tool_call_id' is required for role 'tool' (the id of the call "
                          "this is the result of)", "missing_required_parameter");
    cm->tool_call_id = id->get<std::string>();
  }
  auto calls = m.find("tool_calls");
  if (calls == m.end() || calls->is_null() || (calls->is_array() && calls->empty())) return std::nullopt;
  if (role != "assistant")
    return InvalidParam(p + ".tool_calls", "'tool_calls' is only allowed in messages with role 'assistant'");
  if (!calls->is_array()) return InvalidParam(p + ".tool_calls", "'" + p + ".tool_calls' must be an array");
  for (size_t j = 0; j < calls->size(); ++j) {
    const json& c = (*calls)[j];
    const std::string q = p + ".tool_calls[" + std::to_string(j) + "]";
    if (!c.is_object()) return InvalidParam(q, "'" + q + "' must be an object");
    auto cid = c.find("id");
    if (cid == c.end() || !cid->is_string() || cid->get_ref<const std::string&>().size() > 256)
      return InvalidParam(q + ".id", "'" + q + ".id' must be a string", "missing_required_parameter");
    if (auto type = c.find("type"); type != c.end() && !type->is_null() && *type != "function")
      return InvalidParam(q + ".type", "'" + q + ".type' must be \"function\"", "unsupported_parameter");
    auto f = c.find("function");
    if (f == c.end() || !f->is_object())
      return InvalidParam(q + ".function", "'" + q + ".function' must be an object {\"name\", \"arguments\"}",
                          "missing_required_parameter");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || !ValidName(name->get<std::string>()))
      return InvalidParam(q + ".function.name",
                          "'" + q + ".function.name' must be 1 to 64 characters: a-z, A-Z, 0-9, '_' or '-'");
    auto args = f->find("arguments");
    if (args == f->end() || !args->is_string())
      return InvalidParam(q + ".function.arguments", "'" + q + ".function.arguments' must be a string (JSON text)");
    cm->tool_calls.push_back({cid->get<std::string>(), name->get<std::string>(), args->get<std::string>()});
  }
  return std::nullopt;
}

}  // namespace attic::server
