// Parsing and validation of OpenAI completion requests and of /tokenize and /detokenize
// requests. Every field is checked for type and range; unknown fields are ignored
// (clients send many), unsupported features that would change the answer (functions,
// best_of, ...) are a clear 400. The tool fields are read by tool_request.cc.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "attic/server/openai_api.h"
#include "attic/tokenizer/tokenizer.h"
#include "server/json_stream.h"
#include "server/tool_request.h"

namespace attic::server {

ApiError InvalidParam(const std::string& param, const std::string& message, const std::string& code) {
  ApiError e;
  e.http_status = 400;
  e.param = param;
  e.message = message;
  e.code = code;
  return e;
}

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

ApiError Invalid(const std::string& param, const std::string& message, const std::string& code = "invalid_value") {
  return InvalidParam(param, message, code);
}

ApiError Unsupported(const std::string& param, const std::string& what) {
  return Invalid(param, what + " is not supported by this server", "unsupported_parameter");
}

// Deepest [ / { nesting outside strings; stops counting past `limit`.
int JsonDepth(std::string_view s, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

// Field readers: absent or null leaves the default; a wrong type or range is an error.
const json* Field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> ReadBool(const json& obj, const char* name, bool* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return Invalid(name, std::string("'") + name + "' must be a boolean");
  *out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> ReadNumber(const json& obj, const char* name, double lo, double hi, float* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return Invalid(name, std::string("'") + name + "' must be a number");
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    return Invalid(name, std::string("'") + name + "' must be between " + json(lo).dump() + " and " + json(hi).dump());
  }
  *out = static_cast<float>(d);
  return std::nullopt;
}

// Integers: JSON integers, or floats with an integral value (1.0). Values beyond int64
// are clamped to the int64 range (then validated against lo/hi).
// A JSON number that no int64 holds: above 2^63 - 1 or below -2^63 (ReadInt clamps
// those). An integer literal that fits is parsed as one, so a float of magnitude 2^63
// (-9223372036854775809 rounds to -2^63 as a double) was out of range too.
bool OutsideInt64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && (d >= 9223372036854775808.0 || d <= -9223372036854775808.0);
}

std::optional<ApiError> ReadInt(const json& obj, const char* name, int64_t lo, int64_t hi, std::optional<int64_t>* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  int64_t x;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    x = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                        : static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return Invalid(name, std::string("'") + name + "' must be an integer");
    x = d >= 9.2e18 ? std::numeric_limits<int64_t>::max() : d <= -9.2e18 ? std::numeric_limits<int64_t>::min()
                                                                       : static_cast<int64_t>(d);
  } else {
    return Invalid(name, std::string("'") + name + "' must be an integer");
  }
  if (x < lo || x > hi) {
    return Invalid(name, std::string("'") + name + "' must be between " + std::to_string(lo) + " and " +
                             std::to_string(hi));
  }
  *out = x;
  return std::nullopt;
}

std::optional<ApiError> ReadString(const json& obj, const char* name, size_t max_bytes, std::string* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return Invalid(name, std::string("'") + name + "' must be a string");
  if (v->get_ref<const std::string&>().size() > max_bytes) {
    return Invalid(name, std::string("'") + name + "' is longer than " + std::to_string(max_bytes) + " bytes");
  }
  *out = v->get<std::string>();
  return std::nullopt;
}

// A field that must be absent, null, false, empty, or equal to `neutral`.
std::optional<ApiError> RejectUnless(const json& obj, const char* name, const std::string& what,
                                     const json& neutral = json()) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  if ((v->is_boolean() && !v->get<bool>()) || (v->is_array() && v->empty()) || (v->is_object() && v->empty()) ||
      *v == neutral) {
    return std::nullopt;
  }
  return Unsupported(name, what);
}

// A text the user sent must not contain a part marker (it would read as a cache part).
std::optional<ApiError> CheckText(const std::string& param, const std::string& text) {
  if (text.find(kPartMarkerOpen) != std::string::npos)
    return Invalid(param, "'" + param + "' contains a reserved character sequence (U+E000 followed by 'attic-part:')");
  return std::nullopt;
}

// One content part that is not plain text (parts == null: none are accepted here).
// {"type":"context_cache","id":"ctx-..."} or {"type":"text","text":...,"cache_control":{...}}.
std::optional<ApiError> ReadCachePart(const json& part, const std::string& pp, std::vector<ApiRequest::CachePart>* parts,
                                      std::string* out) {
  ApiRequest::CachePart cp;
  const std::string& type = part.at("type").get_ref<const std::string&>();
  if (type == "context_cache") {
    auto id = part.find("id");
    if (id == part.end() || !id->is_string() || id->get_ref<const std::string&>().empty() ||
        id->get_ref<const std::string&>().size() > 256)
      return Invalid(pp + ".id", "'" + pp + ".id' must be a context cache id or one of its chunk ids");
    cp.cache_id = id->get<std::string>();
  } else {
    const json& cc = part.at("cache_control");
    const std::string cp_param = pp + ".cache_control";
    if (!cc.is_object() || cc.value("type", json()) != json("ephemeral"))
      return Invalid(cp_param, "'" + cp_param + "' must be {\"type\": \"ephemeral\"} with an optional \"ttl\"");
    cp.ttl_s = 300;
    if (auto ttl = cc.find("ttl"); ttl != cc.end() && !ttl->is_null()) {
      if (*ttl == json("5m")) {
        cp.ttl_s = 300;
      } else if (*ttl == json("1h")) {
        cp.ttl_s = 3600;
      } else {
        return Invalid(cp_param + ".ttl", "'" + cp_param + ".ttl' must be \"5m\" or \"1h\"");
      }
    }
    cp.text = part.at("text").get<std::string>();
    if (cp.text.empty()) return Invalid(pp + ".text", "'" + pp + ".text' must not be empty when it is cached");
  }
  if (parts == nullptr) {
    return Invalid(pp, type == "context_cache" ? "context cache parts are not accepted here"
                                               : "cache_control is not accepted here",
                   "unsupported_parameter");
  }
  *out += PartMarker(parts->size());
  parts->push_back(std::move(cp));
  return std::nullopt;
}

// Appends a content array's parts to *out: text parts as text, cache parts as markers.
std::optional<ApiError> ReadParts(const json& arr, const std::string& param, std::vector<ApiRequest::CachePart>* parts,
                                  std::string* out, bool strings_are_text) {
  for (size_t j = 0; j < arr.size(); ++j) {
    const json& part = arr[j];
    const std::string pp = param + "[" + std::to_string(j) + "]";
    if (strings_are_text && part.is_string()) {
      if (auto e = CheckText(pp, part.get<std::string>())) return e;
      *out += part.get<std::string>();
      continue;
    }
    if (!part.is_object()) return Invalid(pp, "'" + pp + "' must be an object");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return Invalid(pp + ".type", "'" + pp + ".type' must be a string");
    if (*type != "text" && *type != "context_cache") {
      return Invalid(pp + ".type",
                     "content part type '" + type->get<std::string>() + "' is not supported (only 'text' and 'context_cache')",
                     "unsupported_parameter");
    }
    if (*type == "text") {
      auto text = part.find("text");
      if (text == part.end() || !text->is_string()) return Invalid(pp + ".text", "'" + pp + ".text' must be a string");
      if (auto e = CheckText(pp + ".text", text->get<std::string>())) return e;
      auto cc = part.find("cache_control");
      if (cc == part.end() || cc->is_null()) {
        *out += text->get<std::string>();
        continue;
      }
    }
    if (auto e = ReadCachePart(part, pp, parts, out)) return e;
  }
  return std::nullopt;
}

std::optional<ApiError> ReadContent(const json& msg, size_t index, std::string* out,
                                    std::vector<ApiRequest::CachePart>* parts) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) {
    std::string role = msg.value("role", "");
    if (role == "assistant") return std::nullopt;  // assistant turns may have no content
    return Invalid(param, "'" + param + "' is required");
  }
  if (it->is_string()) {
    *out = it->get<std::string>();
    return CheckText(param, *out);
  }
  if (!it->is_array()) return Invalid(param, "'" + param + "' must be a string or an array of content parts");
  return ReadParts(*it, param, parts, out, /*strings_are_text=*/false);
}

std::optional<ApiError> ReadMessages(const json& body, std::vector<tokenizer::ChatMessage>* messages,
                                     std::vector<ApiRequest::CachePart>* parts) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return Invalid("messages", "'messages' is required", "missing_required_parameter");
  if (!it->is_array()) return Invalid("messages", "'messages' must be an array");
  if (it->empty()) return Invalid("messages", "'messages' must contain at least one message");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Invalid(p, "'" + p + "' must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Invalid(p + ".role", "'" + p + ".role' must be a string");
    std::string rs = role->get<std::string>();
    if (rs == "developer") rs = "system";
    if (rs != "system" && rs != "user" && rs != "assistant" && rs != "tool") {
      return Invalid(p + ".role", "role '" + role->get<std::string>() +
                                      "' is not supported (expected system, developer, user, assistant or tool)");
    }
    tokenizer::ChatMessage cm;
    cm.role = rs;
    if (auto e = ReadMessageToolFields(m, i, rs, &cm)) return e;
    if (auto e = ReadContent(m, i, &cm.content, parts)) return e;
    messages->push_back(std::move(cm));
  }
  return std::nullopt;
}

std::optional<ApiError> ReadPrompt(const json& body, ApiRequest* r) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return Invalid("prompt", "'prompt' is required", "missing_required_parameter");
  const json* p = &*it;
  // One prompt per request: "text", ["text"], [1, 2, 3] or [[1, 2, 3]]; or one prompt of
  // content parts (an array holding any object: text and context-cache parts).
  if (p->is_array() && std::any_of(p->begin(), p->end(), [](const json& x) { return x.is_object(); }))
    return ReadParts(*p, "prompt", &r->cache_parts, &r->prompt_text, /*strings_are_text=*/true);
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    r->prompt_text = p->get<std::string>();
    return CheckText("prompt", r->prompt_text);
  }
  if (p->is_array()) {
    if (p->empty()) return Invalid("prompt", "'prompt' must not be empty");
    for (const json& t : *p) {
      if (t.is_string() || t.is_array()) {
        return Invalid("prompt", "batched prompts are not supported; send one prompt per request",
                       "unsupported_parameter");
      }
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Invalid("prompt", "'prompt' must be a string or an array of token ids");
      }
      r->prompt_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    r->prompt_is_ids = true;
    return std::nullopt;
  }
  return Invalid("prompt", "'prompt' must be a string or an array of token ids");
}

// "link": {"method": "attnlink", "k": 16} | {"method": "cacheblend", "ratio": 0.15,
// "check_layer": 1} | {"method": "naive"} | {"method": "full"}. check_layer is checked
// against the model's layers when the request is submitted.
std::optional<ApiError> ReadLink(const json& body, ApiRequest* r) {
  const json* l = Field(body, "link");
  if (l == nullptr) return std::nullopt;
  if (!l->is_object()) return Invalid("link", "'link' must be an object such as {\"method\": \"attnlink\", \"k\": 16}");
  const json* m = Field(*l, "method");
  if (m == nullptr || !m->is_string()) return Invalid("link.method", "'link.method' must be one of: attnlink, cacheblend, naive, full");
  auto method = pic::ParseLinkMethod(m->get<std::string>());
  if (!method.ok()) return Invalid("link.method", method.status().message());
  pic::LinkOptions o;
  o.method = *method;
  std::optional<int64_t> k, layer;
  auto named = [](std::optional<ApiError> e, const char* param) {
    e->param = param;
    return e;
  };
  if (auto e = ReadInt(*l, "k", 0, 1 << 20, &k)) return named(e, "link.k");
  if (k) o.k = static_cast<int>(*k);
  float ratio = static_cast<float>(o.ratio);
  if (auto e = ReadNumber(*l, "ratio", 0.0, 1.0, &ratio)) return named(e, "link.ratio");
  if (Field(*l, "ratio") != nullptr) o.ratio = Field(*l, "ratio")->get<double>();
  if (auto e = ReadInt(*l, "check_layer", 0, 1 << 20, &layer)) return named(e, "link.check_layer");
  if (layer) o.check_layer = static_cast<int>(*layer);
  for (const char* name : {"k", "ratio", "check_layer"}) {
    const bool belongs = (std::string(name) == "k") == (o.method == pic::LinkMethod::kAttnLink) &&
                         (std::string(name) == "k" || o.method == pic::LinkMethod::kCacheBlend);
    if (Field(*l, name) != nullptr && !belongs)
      return Invalid(std::string("link.") + name, std::string("'link.") + name + "' does not apply to method '" +
                                                      m->get<std::string>() + "'");
  }
  r->link = o;
  return std::nullopt;
}

// "sparse": {"method": "pq", "ratio": 0.2} and optionally "count" (instead of ratio),
// "initial", "local", "min_tokens", "combine" ("sum" | "max"; not for streaming),
// "iterations" (fixed k-means iterations; pq only), "offload" (true, or {"cache_blocks":
// N, "policy": "lru" | "lfu"}: the KV below the compute buffer, pq/offload.h; pq and
// streaming only); {"method": "full"} alone. Every
// error is a 400 with param "sparse" whose message names the field. What depends on the
// model (PQ sub-spaces against head_dim) is checked when the request is submitted.
std::optional<ApiError> ReadSparse(const json& body, ApiRequest* r) {
  const json* sp = Field(body, "sparse");
  if (sp == nullptr) return std::nullopt;
  auto invalid = [](const std::string& message) { return Invalid("sparse", message); };
  if (!sp->is_object())
    return invalid("'sparse' must be an object such as {\"method\": \"pq\", \"ratio\": 0.2}");
  static const char* const kKeys[] = {"method",     "ratio",   "count",      "initial", "local",
                                      "min_tokens", "combine", "iterations", "offload"};
  for (const auto& item : sp->items()) {
    const std::string& key = item.key();  // (not a structured binding: clang 14 cannot capture one)
    if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return key == k; }) == std::end(kKeys))
      return invalid("'sparse." + key + "' is not a sparse option (method, ratio, count, initial, local, min_tokens, "
                     "combine, iterations, offload)");
  }
  const json* m = Field(*sp, "method");
  const std::string kMethods = "'sparse.method' must be one of: " + pq::SparseMethodNames();
  if (m == nullptr || !m->is_string()) return invalid(kMethods);
  pq::SparseOptions o;
  const std::string& name = m->get_ref<const std::string&>();
  StatusOr<pq::SparseMethod> method = pq::ParseSparseMethod(name);
  if (!method.ok()) return invalid(kMethods + " (got '" + name + "')");
  o.method = *method;
  auto applies = [&](const char* key) {
    const std::string k = key;
    if (o.method == pq::SparseMethod::kFull) return false;
    if (k == "iterations") return o.method == pq::SparseMethod::kPq;
    if (k == "combine") return o.method != pq::SparseMethod::kStreaming;
    if (k == "offload") return o.method == pq::SparseMethod::kPq || o.method == pq::SparseMethod::kStreaming;
    return true;
  };
  for (const char* key : kKeys) {
    if (std::string(key) != "method" && Field(*sp, key) != nullptr && !applies(key))
      return invalid(std::string("'sparse.") + key + "' does not apply to method '" + name + "'");
  }
  // The readers name the field by its key; the param is "sparse", the message says which
  // (`path`: the key's path under "sparse", when it is nested).
  auto named = [](std::optional<ApiError> e, const char* key, const char* path = nullptr) {
    const std::string from = std::string("'") + key + "'";
    if (size_t at = e->message.find(from); at != std::string::npos)
      e->message.replace(at, from.size(), std::string("'sparse.") + (path != nullptr ? path : key) + "'");
    e->param = "sparse";
    return e;
  };
  if (Field(*sp, "ratio") != nullptr && Field(*sp, "count") != nullptr)
    return invalid("give 'sparse.ratio' or 'sparse.count', not both");
  if (const json* ratio = Field(*sp, "ratio")) {
    if (!ratio->is_number() || !std::isfinite(ratio->get<double>()) || ratio->get<double>() <= 0 ||
        ratio->get<double>() > 1)
      return invalid("'sparse.ratio' must be a number in (0, 1]: the share of the context attended");
    o.ratio = ratio->get<double>();
  }
  constexpr int64_t kMaxSlots = 1 << 30;
  std::optional<int64_t> count, initial, local, min_tokens, iterations;
  if (auto e = ReadInt(*sp, "count", 1, kMaxSlots, &count)) return named(e, "count");
  if (auto e = ReadInt(*sp, "initial", 0, kMaxSlots, &initial)) return named(e, "initial");
  if (auto e = ReadInt(*sp, "local", 0, kMaxSlots, &local)) return named(e, "local");
  if (auto e = ReadInt(*sp, "min_tokens", 0, kMaxSlots, &min_tokens)) return named(e, "min_tokens");
  if (auto e = ReadInt(*sp, "iterations", 1, 1000, &iterations)) return named(e, "iterations");
  if (count) o.count = static_cast<int>(*count);
  if (initial) o.n_initial = static_cast<int>(*initial);
  if (local) o.n_local = static_cast<int>(*local);
  if (min_tokens) o.min_slots = static_cast<int>(*min_tokens);
  if (iterations) {
    o.pq.iterations = static_cast<int>(*iterations);
    o.fixed_iterations = true;
  }
  if (const json* c = Field(*sp, "combine")) {
    if (*c == json("sum")) {
      o.combine = pq::GqaCombine::kSum;
    } else if (*c == json("max")) {
      o.combine = pq::GqaCombine::kMax;
    } else {
      return invalid("'sparse.combine' must be \"sum\" or \"max\"");
    }
  }
  if (const json* off = Field(*sp, "offload")) {
    const char* kShape = "'sparse.offload' must be true, false or an object such as {\"cache_blocks\": 16, \"policy\": \"lru\"}";
    if (off->is_boolean()) {
      if (off->get<bool>()) o.offload_cache_blocks = pq::kDefaultOffloadCacheBlocks;
    } else if (off->is_object()) {
      for (const auto& [key, value] : off->items()) {
        if (key != "cache_blocks" && key != "policy")
          return invalid("'sparse.offload." + key + "' is not an offload option (cache_blocks, policy)");
      }
      std::optional<int64_t> blocks;
      if (auto e = ReadInt(*off, "cache_blocks", 0, 1 << 20, &blocks))
        return named(e, "cache_blocks", "offload.cache_blocks");
      o.offload_cache_blocks = blocks ? static_cast<int>(*blocks) : pq::kDefaultOffloadCacheBlocks;
      if (const json* p = Field(*off, "policy")) {
        if (*p == json("lru")) {
          o.offload_policy = pq::CachePolicy::kLru;
        } else if (*p == json("lfu")) {
          o.offload_policy = pq::CachePolicy::kLfu;
        } else {
          return invalid("'sparse.offload.policy' must be \"lru\" or \"lfu\"");
        }
      }
    } else {
      return invalid(kShape);
    }
  }
  r->sparse = o;
  return std::nullopt;
}

std::optional<ApiError> ReadStop(const json& body, std::vector<std::string>* out) {
  const json* v = Field(body, "stop");
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) {
    if (v->get_ref<const std::string&>().empty()) return Invalid("stop", "stop strings must not be empty");
    out->push_back(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array()) return Invalid("stop", "'stop' must be a string or an array of strings");
  if (v->size() > static_cast<size_t>(kMaxStops)) {
    return Invalid("stop", "at most " + std::to_string(kMaxStops) + " stop sequences are allowed");
  }
  for (const json& s : *v) {
    if (!s.is_string()) return Invalid("stop", "'stop' must be a string or an array of strings");
    if (s.get_ref<const std::string&>().empty()) return Invalid("stop", "stop strings must not be empty");
    if (s.get_ref<const std::string&>().size() > 1024) return Invalid("stop", "stop strings are limited to 1024 bytes");
    out->push_back(s.get<std::string>());
  }
  return std::nullopt;
}

// Chat: "logprobs": bool and "top_logprobs": 0..20 (needs logprobs). Completions:
// "logprobs": 0..20 (the alternatives listed per token) and "echo": bool.
std::optional<ApiError> ReadLogprobs(ApiKind kind, const json& body, ApiRequest* r) {
  std::optional<int64_t> top;
  if (kind == ApiKind::kChat) {
    if (auto e = RejectUnless(body, "echo", "echo (a completions field)")) return e;
    bool on = false;
    if (auto e = ReadBool(body, "logprobs", &on)) return e;
    if (auto e = ReadInt(body, "top_logprobs", 0, kMaxTopLogprobs, &top)) return e;
    if (top && !on) return Invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (on) r->logprobs = static_cast<int>(top.value_or(0));
    return std::nullopt;
  }
  if (auto e = RejectUnless(body, "top_logprobs", "top_logprobs (a chat field; completions take 'logprobs': N)")) return e;
  if (auto e = ReadBool(body, "echo", &r->echo)) return e;
  if (auto e = ReadInt(body, "logprobs", 0, kMaxTopLogprobs, &top)) return e;
  if (top) r->logprobs = static_cast<int>(*top);
  if (r->echo && !r->cache_parts.empty())
    return Invalid("echo", "'echo' needs the whole prompt computed: not with context-cache or cache_control parts",
                   "unsupported_parameter");
  return std::nullopt;
}

std::optional<ApiError> ParseFields(ApiKind kind, const json& body, ApiRequest* r) {
  if (!body.is_object()) return Invalid("", "the request body must be a JSON object");
  auto model = body.find("model");
  if (model == body.end() || model->is_null()) return Invalid("model", "'model' is required", "missing_required_parameter");
  if (!model->is_string()) return Invalid("model", "'model' must be a string");
  if (model->get_ref<const std::string&>().empty()) return Invalid("model", "'model' must not be empty");
  r->model = model->get<std::string>();
  if (kind == ApiKind::kChat) {
    if (auto e = ReadMessages(body, &r->messages, &r->cache_parts)) return e;
  } else {
    if (auto e = ReadPrompt(body, r)) return e;
  }
  if (auto e = ReadLink(body, r)) return e;
  if (auto e = ReadSparse(body, r)) return e;
  constexpr int64_t kBig = std::numeric_limits<int64_t>::max();
  std::optional<int64_t> n, max_tokens, max_completion_tokens, seed, top_k, best_of;
  if (auto e = ReadInt(body, "max_tokens", kind == ApiKind::kCompletion ? 0 : 1, kBig, &max_tokens)) return e;
  if (auto e = ReadInt(body, "max_completion_tokens", 1, kBig, &max_completion_tokens)) return e;
  r->max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (auto e = ReadNumber(body, "temperature", 0.0, 2.0, &r->temperature)) return e;
  if (auto e = ReadNumber(body, "top_p", 0.0, 1.0, &r->top_p)) return e;
  if (auto e = ReadInt(body, "top_k", -1, 1 << 30, &top_k)) return e;
  if (top_k) r->top_k = static_cast<int>(std::max<int64_t>(0, *top_k));
  if (auto e = ReadNumber(body, "min_p", 0.0, 1.0, &r->min_p)) return e;
  // A seed outside int64 is refused, not clamped as max_tokens is: two different seeds
  // must never become the same one (found by tests/hostile/hostile_http.mjs: 1e23 and
  // 2^63 both sampled as seed 2^63 - 1).
  if (const json* s = Field(body, "seed"); s != nullptr && OutsideInt64(*s))
    return Invalid("seed", "'seed' must be an integer between -9223372036854775808 and 9223372036854775807");
  if (auto e = ReadInt(body, "seed", std::numeric_limits<int64_t>::min(), kBig, &seed)) return e;
  if (seed) r->seed = static_cast<uint64_t>(*seed);
  if (auto e = ReadInt(body, "n", 1, engine::kMaxChoices, &n)) return e;
  if (n) r->n = static_cast<int>(*n);
  if (auto e = ReadInt(body, "best_of", std::numeric_limits<int64_t>::min(), kBig, &best_of)) return e;
  if (best_of && *best_of != 1) return Unsupported("best_of", "best_of other than 1");
  if (auto e = ReadStop(body, &r->stop)) return e;
  if (auto e = ReadBool(body, "stream", &r->stream)) return e;
  if (const json* so = Field(body, "stream_options")) {
    if (!so->is_object()) return Invalid("stream_options", "'stream_options' must be an object");
    if (auto e = ReadBool(*so, "include_usage", &r->include_usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
  }
  if (auto e = ReadString(body, "user", 1024, &r->user)) return e;
  if (auto e = ReadString(body, "session_id", kMaxSessionIdBytes, &r->session_id)) return e;
  std::optional<int64_t> session_ttl;
  if (auto e = ReadInt(body, "session_ttl", 0, int64_t{10} * 365 * 86400, &session_ttl)) return e;
  if (session_ttl) r->session_ttl_s = *session_ttl;
  if (auto e = ReadBool(body, "ignore_eos", &r->ignore_eos)) return e;
  float penalty = 0;
  if (auto e = ReadNumber(body, "presence_penalty", -2.0, 2.0, &penalty)) return e;
  if (auto e = ReadNumber(body, "frequency_penalty", -2.0, 2.0, &penalty)) return e;
  if (const json* lb = Field(body, "logit_bias"); lb != nullptr && !lb->is_object()) {
    return Invalid("logit_bias", "'logit_bias' must be an object");
  }
  if (auto e = RejectUnless(body, "logit_bias", "logit_bias")) return e;
  if (auto e = ReadLogprobs(kind, body, r)) return e;
  if (max_tokens && *max_tokens == 0 && !max_completion_tokens && !r->echo)
    return Invalid("max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo': the prompt's logprobs alone)");
  if (kind == ApiKind::kCompletion) {
    if (auto e = RejectUnless(body, "tools", "tools (a chat field)")) return e;
    if (auto e = RejectUnless(body, "tool_choice", "tool_choice (a chat field)", json("none"))) return e;
    if (auto e = RejectUnless(body, "parallel_tool_calls", "parallel_tool_calls (a chat field)")) return e;
  }
  if (auto e = RejectUnless(body, "functions", "functions (deprecated: send 'tools')")) return e;
  if (auto e = RejectUnless(body, "function_call", "function_call (deprecated: send 'tool_choice')", json("none"))) return e;
  if (auto e = RejectUnless(body, "suffix", "suffix", json(""))) return e;
  return std::nullopt;
}

// "response_format": {"type": "text"} | {"type": "json_object"} | {"type": "json_schema",
// "json_schema": {"name", "description"?, "schema"?, "strict"?}}. The schema is read from
// `ordered` (the body with its keys in the client's order: properties are written so).
std::optional<ApiError> ReadResponseFormat(const ojson& ordered, ApiRequest* r) {
  auto rf = ordered.find("response_format");
  if (rf == ordered.end() || rf->is_null()) return std::nullopt;
  const char* kShape = "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                       "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}";
  if (!rf->is_object()) return Invalid("response_format", kShape);
  auto type = rf->find("type");
  if (type == rf->end() || !type->is_string()) return Invalid("response_format.type", kShape);
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") {
    r->grammar = grammar::Grammar::AnyObject();
    return std::nullopt;
  }
  if (t != "json_schema")
    return Invalid("response_format.type", "response_format type '" + t + "' is not supported (text, json_object, json_schema)");
  auto js = rf->find("json_schema");
  if (js == rf->end() || !js->is_object())
    return Invalid("response_format.json_schema", "'response_format.json_schema' must be an object with a 'name'",
                   "missing_required_parameter");
  auto name = js->find("name");
  if (name == js->end() || !name->is_string() || name->get_ref<const std::string&>().empty() ||
      name->get_ref<const std::string&>().size() > 64 ||
      !std::all_of(name->get_ref<const std::string&>().begin(), name->get_ref<const std::string&>().end(),
                   [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }))
    return Invalid("response_format.json_schema.name",
                   "'response_format.json_schema.name' must be 1 to 64 characters: a-z, A-Z, 0-9, '_' or '-'");
  if (auto strict = js->find("strict"); strict != js->end() && !strict->is_null() && !strict->is_boolean())
    return Invalid("response_format.json_schema.strict", "'response_format.json_schema.strict' must be a boolean");
  auto schema = js->find("schema");
  if (schema == js->end() || schema->is_null()) {
    r->grammar = grammar::Grammar::AnyObject();
    return std::nullopt;
  }
  // Output always follows the schema (strict or not): it is how this server decodes.
  auto g = grammar::Grammar::Shared(*schema);
  if (!g.ok()) {
    const bool keyword = g.status().message().find("is not supported") != std::string::npos;
    return Invalid("response_format.json_schema.schema", g.status().message(),
                   keyword ? "unsupported_parameter" : "invalid_value");
  }
  r->grammar = *g;
  return std::nullopt;
}

// Parses `body` as a JSON object no deeper than kMaxJsonDepth into *out (ParseJsonObject).
template <typename Json>
std::optional<ApiError> ParseObjectBody(std::string_view body, Json* out) {
  if (JsonDepth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    return Invalid("", "the JSON body is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  constexpr std::string_view kCannot = "We could not parse the JSON body of your request: ";
  if (HasNulByte(body))
    return Invalid("", std::string(kCannot) + "it holds a NUL byte, which JSON text never does", "invalid_json");
  try {
    *out = Json::parse(body);
  } catch (const std::exception& e) {
    return Invalid("", std::string(kCannot) + e.what(), "invalid_json");
  }
  if (!out->is_object()) return Invalid("", "the request body must be a JSON object");
  return std::nullopt;
}

// A boolean that may be sent under either of two names (vLLM's, llama-server's).
std::optional<ApiError> ReadBoolAlias(const json& body, const char* name, const char* alias, bool* out) {
  if (Field(body, name) != nullptr && Field(body, alias) != nullptr) {
    return Invalid(alias, std::string("give '") + name + "' or '" + alias + "', not both");
  }
  if (auto e = ReadBool(body, name, out)) return e;
  return ReadBool(body, alias, out);
}

std::optional<ApiError> TokenizeFields(const json& body, TokenizeRequest* r) {
  if (auto e = ReadString(body, "model", 1024, &r->model)) return e;  // optional, as in vLLM
  const bool has_prompt = Field(body, "prompt") != nullptr;
  const bool has_content = Field(body, "content") != nullptr;
  const bool has_messages = Field(body, "messages") != nullptr;
  if (has_prompt + has_content + has_messages > 1) {
    return Invalid(has_messages ? "messages" : "content", "give one of 'prompt', 'content' or 'messages'");
  }
  if (!has_prompt && !has_content && !has_messages) {
    return Invalid("prompt", "'prompt' (or 'messages') is required", "missing_required_parameter");
  }
  if (has_messages) {
    r->chat = true;
    r->add_special_tokens = false;  // chat templates write their own BOS (vLLM's default)
    if (auto e = ReadMessages(body, &r->messages, nullptr)) return e;
    if (auto e = ReadBool(body, "add_generation_prompt", &r->add_generation_prompt)) return e;
    if (auto e = RejectUnless(body, "continue_final_message", "continue_final_message")) return e;
    if (auto e = RejectUnless(body, "chat_template", "a per-request chat_template", json(""))) return e;
    // tools: read with the client's key order (ParseTokenizeRequest), as for chat.
  } else {
    if (auto e = RejectUnless(body, "tools", "tools (with 'messages': a chat's tools)")) return e;
    const char* name = has_prompt ? "prompt" : "content";
    const json& p = body.at(name);
    if (!p.is_string()) return Invalid(name, std::string("'") + name + "' must be a string");
    r->prompt = p.get<std::string>();
  }
  if (auto e = ReadBoolAlias(body, "add_special_tokens", "add_special", &r->add_special_tokens)) return e;
  return ReadBoolAlias(body, "return_token_strs", "with_pieces", &r->return_token_strs);
}

std::optional<ApiError> DetokenizeFields(const json& body, DetokenizeRequest* r) {
  if (auto e = ReadString(body, "model", 1024, &r->model)) return e;  // optional, as in vLLM
  const json* t = Field(body, "tokens");
  if (t == nullptr) return Invalid("tokens", "'tokens' is required", "missing_required_parameter");
  if (!t->is_array()) return Invalid("tokens", "'tokens' must be an array of token ids");
  r->tokens.reserve(t->size());
  for (const json& id : *t) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return Invalid("tokens", "'tokens' must be an array of token ids (non-negative integers)");
    }
    r->tokens.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return std::nullopt;
}

// Parses the body and fills a request with `fields`; never throws.
template <typename Result, typename Fields>
Result ParseWith(std::string_view body, Fields fields) {
  Result out;
  json parsed;
  out.error = ParseObjectBody(body, &parsed);
  if (out.error) return out;
  try {
    out.error = fields(parsed, &out.request);
  } catch (const json::exception& e) {  // defensive: a type we did not expect
    out.error = Invalid("", std::string("invalid request: ") + e.what());
  }
  return out;
}

// Reads fields whose key order is the client's (schemas, tools) from the body again as
// ordered JSON. The body was parsed once already: valid JSON, no deeper than kMaxJsonDepth.
template <typename Read>
std::optional<ApiError> ReadOrdered(std::string_view body, Read read) {
  try {
    return read(ojson::parse(body));
  } catch (const std::exception& e) {
    return Invalid("", std::string("invalid request: ") + e.what());
  }
}

}  // namespace

std::string PartMarker(size_t index) { return kPartMarkerOpen + std::to_string(index) + kPartMarkerClose; }

std::optional<ApiError> ParseJsonObject(std::string_view body, nlohmann::ordered_json* out) {
  return ParseObjectBody(body, out);
}

std::optional<ApiError> ParseJsonObject(std::string_view body, nlohmann::json* out) {
  return ParseObjectBody(body, out);
}

ParseResult ParseApiRequest(ApiKind kind, std::string_view body) {
  ParseResult out = ParseWith<ParseResult>(body, [kind](const json& j, ApiRequest* r) { return ParseFields(kind, j, r); });
  out.request.kind = kind;
  const bool has_format = body.find("response_format") != std::string_view::npos;
  const bool has_tools = kind == ApiKind::kChat && (body.find("tool") != std::string_view::npos ||
                                                     body.find("parallel_tool_calls") != std::string_view::npos);
  if (!out.error && (has_format || has_tools)) {
    out.error = ReadOrdered(body, [&](const ojson& ordered) {
      std::optional<ApiError> e;
      if (has_format) e = ReadResponseFormat(ordered, &out.request);
      if (!e && has_tools) e = ReadToolFields(ordered, &out.request.tools);
      return e;
    });
    if (!out.error && out.request.tools.forced() && out.request.grammar != nullptr)
      out.error = Invalid("response_format", "'response_format' cannot be combined with a tool_choice that forces a "
                                             "call (\"required\" or a function): the reply is the call",
                          "unsupported_parameter");
    // One reply's calls are parsed (and streamed) per request: several choices would
    // each need their own.
    if (!out.error && out.request.tools.active() && out.request.n > 1)
      out.error = Unsupported("n", "n > 1 together with tools");
  }
  return out;
}

std::optional<ApiError> ApplySessionHeader(std::string_view header, ApiRequest* r) {
  if (header.empty()) return std::nullopt;
  if (header.size() > kMaxSessionIdBytes) {
    return Invalid("session_id", std::string("the ") + kSessionIdHeader + " header is longer than " +
                                     std::to_string(kMaxSessionIdBytes) + " bytes");
  }
  // Header bytes are not JSON-checked: a session id is echoed in JSON (session objects,
  // lists), so it must be UTF-8 like the body's field.
  if (!tokenizer::IsValidUtf8(header))
    return Invalid("session_id", std::string("the ") + kSessionIdHeader + " header is not valid UTF-8");
  if (r->session_id.empty()) {
    r->session_id = std::string(header);
  } else if (r->session_id != header) {
    return Invalid("session_id", std::string("the ") + kSessionIdHeader +
                                     " header and the 'session_id' field name different sessions");
  }
  return std::nullopt;
}

TokenizeParse ParseTokenizeRequest(std::string_view body) {
  TokenizeParse out = ParseWith<TokenizeParse>(body, TokenizeFields);
  if (!out.error && out.request.chat && body.find("tool") != std::string_view::npos)
    out.error = ReadOrdered(body, [&](const ojson& ordered) { return ReadToolFields(ordered, &out.request.tools); });
  return out;
}

DetokenizeParse ParseDetokenizeRequest(std::string_view body) {
  return ParseWith<DetokenizeParse>(body, DetokenizeFields);
}

}  // namespace attic::server
