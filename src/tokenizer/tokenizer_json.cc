// Tokenizer::FromJson / FromDirectory: builds a BpeTokenizer from HF tokenizers'
// tokenizer.json (+ tokenizer_config.json, and in a directory also config.json and
// chat_template.jinja). Supported: model BPE; normalizers Sequence/Prepend/Replace/NFC;
// pre-tokenizers Sequence/Split/ByteLevel/Digits/Metaspace/Whitespace/WhitespaceSplit;
// decoders ByteLevel/Metaspace/Sequence of Replace, ByteFallback, Fuse, Strip;
// post-processor TemplateProcessing (BOS/EOS). Anything else is Unimplemented.
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "attic/core/file.h"
#include "attic/tokenizer/tokenizer.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace attic::tokenizer {

namespace {

using json = nlohmann::json;

constexpr char kMetaspace[] = "\xE2\x96\x81";  // U+2581 "▁"
// GPT-2's pre-tokenizer regex (ByteLevel with use_regex).
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string Str(const json& j, const char* key, const std::string& def = "") {
  auto it = j.find(key);
  return (it != j.end() && it->is_string()) ? it->get<std::string>() : def;
}

bool Bool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  return (it != j.end() && it->is_boolean()) ? it->get<bool>() : def;
}

// A token named in tokenizer_config.json: "<s>" or {"content": "<s>", ...}.
std::string TokenName(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return Str(*it, "content");
  return "";
}

// {"Regex": "..."} or {"String": "..."}.
StatusOr<std::shared_ptr<const Regex>> PatternRegex(const json& j) {
  if (!j.is_object()) return InvalidArgumentError("tokenizer.json: pattern must be an object");
  if (j.contains("Regex") && j["Regex"].is_string()) return Regex::Compile(j["Regex"].get<std::string>());
  if (j.contains("String") && j["String"].is_string()) {
    return Regex::Compile(j["String"].get<std::string>(), /*literal=*/true);
  }
  return InvalidArgumentError("tokenizer.json: pattern needs \"Regex\" or \"String\"");
}

Status ParseNormalizer(const json& j, TextPipeline* pipe) {
  if (j.is_null()) return OkStatus();
  const std::string type = Str(j, "type");
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) return InvalidArgumentError("tokenizer.json: Sequence normalizer without list");
    for (const json& n : *it) ATTIC_RETURN_IF_ERROR(ParseNormalizer(n, pipe));
    return OkStatus();
  }
  if (type == "Prepend") {
    NormalizerStep s;
    s.kind = NormalizerStep::Kind::kPrepend;
    s.content = Str(j, "prepend");
    pipe->normalizers.push_back(std::move(s));
    return OkStatus();
  }
  if (type == "Replace") {
    NormalizerStep s;
    s.kind = NormalizerStep::Kind::kReplace;
    s.content = Str(j, "content");
    const json& pat = j.contains("pattern") ? j["pattern"] : json();
    if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      s.pattern = pat["String"].get<std::string>();
    } else {
      ATTIC_ASSIGN_OR_RETURN(s.regex, PatternRegex(pat));
    }
    pipe->normalizers.push_back(std::move(s));
    return OkStatus();
  }
  // NFC leaves already-composed text (nearly all real text) unchanged; it is accepted
  // as the identity rather than pulling in Unicode normalization tables.
  if (type == "NFC") return OkStatus();
  return UnimplementedError("tokenizer.json: normalizer '" + type + "' is not supported");
}

Status AddSplit(const std::string& pattern, SplitBehavior behavior, bool invert, TextPipeline* pipe) {
  PreTokenizerStep s;
  s.kind = PreTokenizerStep::Kind::kSplit;
  ATTIC_ASSIGN_OR_RETURN(s.regex, Regex::Compile(pattern));
  s.behavior = behavior;
  s.invert = invert;
  pipe->pre_tokenizers.push_back(std::move(s));
  return OkStatus();
}

Status ParsePreTokenizer(const json& j, TextPipeline* pipe, bool* byte_level) {
  if (j.is_null()) return OkStatus();
  const std::string type = Str(j, "type");
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) return InvalidArgumentError("tokenizer.json: Sequence pre-tokenizer without list");
    for (const json& p : *it) ATTIC_RETURN_IF_ERROR(ParsePreTokenizer(p, pipe, byte_level));
    return OkStatus();
  }
  if (type == "Split") {
    PreTokenizerStep s;
    s.kind = PreTokenizerStep::Kind::kSplit;
    ATTIC_ASSIGN_OR_RETURN(s.regex, PatternRegex(j.contains("pattern") ? j["pattern"] : json()));
    const std::string b = Str(j, "behavior", "Isolated");
    if (b == "Removed") {
      s.behavior = SplitBehavior::kRemoved;
    } else if (b == "Isolated") {
      s.behavior = SplitBehavior::kIsolated;
    } else if (b == "MergedWithPrevious") {
      s.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (b == "MergedWithNext") {
      s.behavior = SplitBehavior::kMergedWithNext;
    } else if (b == "Contiguous") {
      s.behavior = SplitBehavior::kContiguous;
    } else {
      return InvalidArgumentError("tokenizer.json: unknown split behavior '" + b + "'");
    }
    s.invert = Bool(j, "invert", false);
    pipe->pre_tokenizers.push_back(std::move(s));
    return OkStatus();
  }
  if (type == "ByteLevel") {
    *byte_level = true;
    PreTokenizerStep s;
    s.kind = PreTokenizerStep::Kind::kByteLevel;
    s.add_prefix_space = Bool(j, "add_prefix_space", true);
    if (Bool(j, "use_regex", true)) {
      ATTIC_ASSIGN_OR_RETURN(s.regex, Regex::Compile(kGpt2Pattern));
    }
    pipe->pre_tokenizers.push_back(std::move(s));
    return OkStatus();
  }
  if (type == "Digits") {
    return AddSplit(Bool(j, "individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)", SplitBehavior::kIsolated,
                    false, pipe);
  }
  if (type == "Whitespace") return AddSplit(R"(\w+|[^\w\s]+)", SplitBehavior::kRemoved, true, pipe);
  if (type == "WhitespaceSplit") return AddSplit(R"(\s+)", SplitBehavior::kRemoved, false, pipe);
  if (type == "Metaspace") {
    PreTokenizerStep s;
    s.kind = PreTokenizerStep::Kind::kMetaspace;
    s.replacement = Str(j, "replacement", kMetaspace);
    s.split = Bool(j, "split", true);
    const std::string scheme = Str(j, "prepend_scheme");
    if (scheme == "first") {
      s.prepend = PreTokenizerStep::Prepend::kFirst;
    } else if (scheme == "never") {
      s.prepend = PreTokenizerStep::Prepend::kNever;
    } else if (scheme == "always") {
      s.prepend = PreTokenizerStep::Prepend::kAlways;
    } else {
      s.prepend = Bool(j, "add_prefix_space", true) ? PreTokenizerStep::Prepend::kAlways
                                                    : PreTokenizerStep::Prepend::kNever;
    }
    pipe->pre_tokenizers.push_back(std::move(s));
    return OkStatus();
  }
  return UnimplementedError("tokenizer.json: pre-tokenizer '" + type + "' is not supported");
}

// What the decoder chain does to each token, reduced to the pieces Llama-family
// tokenizers use.
struct DecoderSpec {
  bool byte_level = false;     // GPT-2 byte map undone
  bool byte_fallback = false;  // <0xNN> -> byte
  std::vector<std::pair<std::string, std::string>> replaces;
  int strip_leading = 0;
};

Status ParseDecoder(const json& j, DecoderSpec* d) {
  if (j.is_null()) return OkStatus();
  const std::string type = Str(j, "type");
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) return InvalidArgumentError("tokenizer.json: Sequence decoder without list");
    for (const json& x : *it) ATTIC_RETURN_IF_ERROR(ParseDecoder(x, d));
    return OkStatus();
  }
  if (type == "ByteLevel") {
    d->byte_level = true;
  } else if (type == "ByteFallback") {
    d->byte_fallback = true;
  } else if (type == "Fuse") {
    // Concatenation is what Decode does anyway.
  } else if (type == "Replace") {
    const json& pat = j.contains("pattern") ? j["pattern"] : json();
    if (!pat.is_object() || !pat.contains("String") || !pat["String"].is_string()) {
      return UnimplementedError("tokenizer.json: Replace decoder supports only String patterns");
    }
    d->replaces.emplace_back(pat["String"].get<std::string>(), Str(j, "content"));
  } else if (type == "Strip") {
    const std::string content = Str(j, "content", " ");
    if (content != " ") return UnimplementedError("tokenizer.json: Strip decoder supports only spaces");
    auto it = j.find("start");
    if (it != j.end() && it->is_number_integer()) d->strip_leading = it->get<int>();
  } else if (type == "Metaspace") {
    d->replaces.emplace_back(Str(j, "replacement", kMetaspace), " ");
    const std::string scheme = Str(j, "prepend_scheme");
    const bool prepends = scheme.empty() ? Bool(j, "add_prefix_space", true) : scheme != "never";
    if (prepends) d->strip_leading = 1;
  } else {
    return UnimplementedError("tokenizer.json: decoder '" + type + "' is not supported");
  }
  return OkStatus();
}

// TemplateProcessing "single": special tokens before $A are BOS, after it EOS.
void ParsePostProcessor(const json& j, const StringIdMap& ids, TokenizerParts* parts) {
  if (!j.is_object()) return;
  const std::string type = Str(j, "type");
  if (type == "Sequence" && j.contains("processors") && j["processors"].is_array()) {
    for (const json& p : j["processors"]) ParsePostProcessor(p, ids, parts);
    return;
  }
  if (type != "TemplateProcessing" || !j.contains("single") || !j["single"].is_array()) return;
  bool seen_sequence = false;
  for (const json& item : j["single"]) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].is_object()) continue;
    const std::string name = Str(item["SpecialToken"], "id");
    int32_t id = -1;
    const json* st = j.contains("special_tokens") ? &j["special_tokens"] : nullptr;
    if (st && st->contains(name) && (*st)[name].contains("ids") && (*st)[name]["ids"].is_array() &&
        !(*st)[name]["ids"].empty() && (*st)[name]["ids"][0].is_number_integer()) {
      id = (*st)[name]["ids"][0].get<int32_t>();
    } else if (auto it = ids.find(name); it != ids.end()) {
      id = it->second;
    }
    if (id < 0) continue;
    if (!seen_sequence) {
      parts->bos_id = id;
      parts->add_bos = true;
    } else {
      parts->eos_id = id;
      parts->add_eos = true;
    }
  }
}

int32_t FirstInt(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return -1;
  if (it->is_number_integer()) return it->get<int32_t>();
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) return (*it)[0].get<int32_t>();
  return -1;
}

struct JsonSources {
  std::string tokenizer_json;
  std::string tokenizer_config_json;  // may be ""
  std::string model_config_json;      // config.json, may be ""
  std::string chat_template_file;     // chat_template.jinja, may be ""
};

StatusOr<json> ParseJson(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(std::string(what) + " is not valid JSON");
  return j;
}

Status SetVocab(const json& model, const json& added_json, TokenizerParts* parts, StringIdMap* model_ids) {
  auto vit = model.find("vocab");
  if (vit == model.end() || !vit->is_object()) return InvalidArgumentError("tokenizer.json: model.vocab must be an object");
  int32_t max_id = -1;
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it.value().is_number_integer()) return InvalidArgumentError("tokenizer.json: vocab ids must be integers");
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > (1 << 24)) return InvalidArgumentError("tokenizer.json: vocab id out of range");
    max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
    model_ids->emplace(it.key(), static_cast<int32_t>(id));
  }
  if (added_json.is_array()) {
    for (const json& a : added_json) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer()) continue;
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id > (1 << 24)) return InvalidArgumentError("tokenizer.json: added token id out of range");
      AddedTokenSpec t;
      t.id = static_cast<int32_t>(id);
      t.content = Str(a, "content");
      t.special = Bool(a, "special", false);
      t.lstrip = Bool(a, "lstrip", false);
      t.rstrip = Bool(a, "rstrip", false);
      if (t.content.empty() || !IsValidUtf8(t.content)) continue;
      max_id = std::max(max_id, t.id);
      parts->added.push_back(std::move(t));
    }
  }
  if (max_id < 0) return InvalidArgumentError("tokenizer.json: empty vocabulary");
  parts->texts.assign(max_id + 1, "");
  parts->special.assign(max_id + 1, 0);
  for (const auto& [text, id] : *model_ids) parts->texts[id] = text;
  for (const AddedTokenSpec& t : parts->added) {
    parts->texts[t.id] = t.content;
    if (t.special) parts->special[t.id] = 1;
  }
  return OkStatus();
}

// Merges are "a b" strings or ["a", "b"] arrays; rank = position in the list.
Status AddMerges(const json& merges, const StringIdMap& model_ids, const TokenizerParts& parts, BpeModel* bpe) {
  if (merges.is_null()) return OkStatus();
  if (!merges.is_array()) return InvalidArgumentError("tokenizer.json: model.merges must be a list");
  std::string left, right;
  int32_t rank = 0;
  for (const json& m : merges) {
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) return InvalidArgumentError("tokenizer.json: bad merge '" + s + "'");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return InvalidArgumentError("tokenizer.json: a merge must be \"a b\" or [\"a\", \"b\"]");
    }
    const auto l = model_ids.find(left), r = model_ids.find(right), c = model_ids.find(left + right);
    const int32_t this_rank = rank++;
    if (l == model_ids.end() || r == model_ids.end() || c == model_ids.end()) continue;
    if (parts.special[c->second]) continue;  // merging never yields a special token
    bpe->AddMerge(l->second, r->second, c->second, this_rank);
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Tokenizer>> Build(const JsonSources& src) {
  ATTIC_ASSIGN_OR_RETURN(json tj, ParseJson(src.tokenizer_json, "tokenizer.json"));
  json cfg = json::object();
  if (!src.tokenizer_config_json.empty()) {
    ATTIC_ASSIGN_OR_RETURN(cfg, ParseJson(src.tokenizer_config_json, "tokenizer_config.json"));
    if (!cfg.is_object()) cfg = json::object();
  }
  if (!tj.is_object() || !tj.contains("model") || !tj["model"].is_object()) {
    return InvalidArgumentError("tokenizer.json: no \"model\" object");
  }
  const json& model = tj["model"];
  const std::string model_type = Str(model, "type", "BPE");
  if (model_type != "BPE") {
    return UnimplementedError("tokenizer.json: model type '" + model_type + "' is not supported (BPE only)");
  }

  TokenizerParts parts;
  StringIdMap model_ids;
  ATTIC_RETURN_IF_ERROR(SetVocab(model, tj.contains("added_tokens") ? tj["added_tokens"] : json(), &parts, &model_ids));

  bool byte_level = false;
  ATTIC_RETURN_IF_ERROR(ParseNormalizer(tj.contains("normalizer") ? tj["normalizer"] : json(), &parts.pipeline));
  ATTIC_RETURN_IF_ERROR(
      ParsePreTokenizer(tj.contains("pre_tokenizer") ? tj["pre_tokenizer"] : json(), &parts.pipeline, &byte_level));
  DecoderSpec dec;
  ATTIC_RETURN_IF_ERROR(ParseDecoder(tj.contains("decoder") ? tj["decoder"] : json(), &dec));
  byte_level = byte_level || dec.byte_level;
  parts.strip_leading_spaces = dec.strip_leading;

  // Keys the model matches text against, and the bytes each token decodes to.
  const size_t n = parts.texts.size();
  std::vector<std::string> keys(n);
  parts.bytes.assign(n, "");
  std::vector<uint8_t> is_added(n, 0);
  for (const AddedTokenSpec& t : parts.added) is_added[t.id] = 1;
  std::string raw;
  for (size_t id = 0; id < n; ++id) {
    const std::string& text = parts.texts[id];
    if (is_added[id]) {
      parts.bytes[id] = text;
    } else if (dec.byte_level && ByteLevelToBytes(text, &raw)) {
      parts.bytes[id] = raw;
    } else {
      std::string b = text;
      if (dec.byte_fallback && ParseByteToken(text) >= 0) {
        b = std::string(1, static_cast<char>(ParseByteToken(text)));
      } else {
        for (const auto& [from, to] : dec.replaces) {
          for (size_t p = b.find(from); !from.empty() && p != std::string::npos; p = b.find(from, p + to.size())) {
            b.replace(p, from.size(), to);
          }
        }
      }
      parts.bytes[id] = std::move(b);
    }
    if (parts.special[id]) continue;  // never produced by merging
    if (byte_level) {
      keys[id] = ByteLevelToBytes(text, &raw) ? raw : text;
    } else {
      keys[id] = text;
    }
  }

  BpeModel::Options mo;
  mo.unit = byte_level ? BpeModel::SymbolUnit::kByte : BpeModel::SymbolUnit::kUtf8Char;
  mo.byte_fallback = Bool(model, "byte_fallback", false);
  mo.fuse_unk = Bool(model, "fuse_unk", false);
  mo.ignore_merges = Bool(model, "ignore_merges", false);
  const std::string unk = Str(model, "unk_token");
  if (!unk.empty()) {
    auto it = model_ids.find(unk);
    mo.unk_id = it == model_ids.end() ? -1 : it->second;
  }
  std::vector<int32_t> byte_ids(256, -1);
  for (int b = 0; b < 256; ++b) {
    const std::string key = byte_level ? BytesToByteLevel(std::string(1, static_cast<char>(b)))
                                       : ByteTokenText(static_cast<uint8_t>(b));
    if (auto it = model_ids.find(key); it != model_ids.end()) byte_ids[b] = it->second;
  }
  parts.model = std::make_unique<BpeModel>(std::move(keys), byte_ids, mo);
  ATTIC_RETURN_IF_ERROR(AddMerges(model.contains("merges") ? model["merges"] : json(), model_ids, parts, parts.model.get()));

  // BOS / EOS: post-processor, then tokenizer_config.json, then config.json.
  StringIdMap all_ids;
  for (size_t id = 0; id < n; ++id) all_ids.emplace(parts.texts[id], static_cast<int32_t>(id));
  ParsePostProcessor(tj.contains("post_processor") ? tj["post_processor"] : json(), all_ids, &parts);
  if (const std::string bos = TokenName(cfg, "bos_token"); !bos.empty()) {
    if (auto it = all_ids.find(bos); it != all_ids.end()) parts.bos_id = it->second;
  }
  if (const std::string eos = TokenName(cfg, "eos_token"); !eos.empty()) {
    if (auto it = all_ids.find(eos); it != all_ids.end()) parts.eos_id = it->second;
  }
  parts.add_bos = Bool(cfg, "add_bos_token", parts.add_bos);
  parts.add_eos = Bool(cfg, "add_eos_token", parts.add_eos);
  if (!src.model_config_json.empty()) {
    json mc = json::parse(src.model_config_json, nullptr, false);
    if (mc.is_object()) {
      if (parts.bos_id < 0) parts.bos_id = FirstInt(mc, "bos_token_id");
      if (parts.eos_id < 0) parts.eos_id = FirstInt(mc, "eos_token_id");
    }
  }
  if (parts.eos_id < 0) {
    for (const char* name : {"</s>", "<|eot_id|>", "<|im_end|>", "<|end_of_text|>", "<|endoftext|>"}) {
      if (auto it = all_ids.find(name); it != all_ids.end()) {
        parts.eos_id = it->second;
        break;
      }
    }
  }
  if (parts.bos_id >= static_cast<int32_t>(n)) parts.bos_id = -1;
  if (parts.eos_id >= static_cast<int32_t>(n)) parts.eos_id = -1;
  if (parts.bos_id < 0) parts.add_bos = false;
  if (parts.eos_id < 0) parts.add_eos = false;

  // Chat template: a string, or a list of {name, template} (take "default").
  if (auto it = cfg.find("chat_template"); it != cfg.end()) {
    if (it->is_string()) {
      parts.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      for (const json& t : *it) {
        if (t.is_object() && Str(t, "name") == "default") parts.chat_template = Str(t, "template");
      }
    }
  }
  if (parts.chat_template.empty()) parts.chat_template = src.chat_template_file;
  return std::unique_ptr<Tokenizer>(new BpeTokenizer(std::move(parts)));
}

StatusOr<std::unique_ptr<Tokenizer>> BuildGuarded(const JsonSources& src) {
  // nlohmann::json throws on some malformed inputs (e.g. invalid UTF-8 in keys while
  // iterating); a broken file is the user's problem, never a crash.
  try {
    return Build(src);
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("tokenizer.json: ") + e.what());
  }
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const std::string& tokenizer_json,
                                                         const std::string& tokenizer_config_json) {
  JsonSources src;
  src.tokenizer_json = tokenizer_json;
  src.tokenizer_config_json = tokenizer_config_json;
  return BuildGuarded(src);
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir) {
  JsonSources src;
  const std::string tj = JoinPath(dir, "tokenizer.json");
  auto text = ReadFileToString(tj);
  if (!text.ok()) return text.status().WithContext("tokenizer");
  src.tokenizer_json = std::move(text).value();
  for (auto [name, dest] : {std::pair<const char*, std::string*>{"tokenizer_config.json", &src.tokenizer_config_json},
                            {"config.json", &src.model_config_json},
                            {"chat_template.jinja", &src.chat_template_file}}) {
    const std::string path = JoinPath(dir, name);
    if (!FileExists(path)) continue;
    auto s = ReadFileToString(path);
    if (!s.ok()) return s.status().WithContext("tokenizer");
    *dest = std::move(s).value();
  }
  auto tok = BuildGuarded(src);
  if (!tok.ok()) return tok.status().WithContext(tj);
  return tok;
}

}  // namespace attic::tokenizer
