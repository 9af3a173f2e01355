// GgufTokenizerFromHfJson: an HF tokenizer.json (BPE) as tokenizer.ggml.* data, following
// llama.cpp's convert_hf_to_gguf.py (token types, [PADi] holes, merges "a b").
#include <map>
#include <regex>

#include "attic/model/writer.h"
#include "model/json_util.h"

namespace attic::model {

namespace {

constexpr int32_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4, kTypeUnused = 5,
                  kTypeByte = 6;

// True when `j` (a pre_tokenizer / decoder / normalizer tree) contains a node of `type`.
bool HasNode(const Json& j, const std::string& type) {
  if (j.is_object()) {
    const Json* t = FindMember(j, "type");
    if (t != nullptr && t->is_string() && t->get<std::string>() == type) return true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (HasNode(it.value(), type)) return true;
    }
  } else if (j.is_array()) {
    for (const Json& e : j) {
      if (HasNode(e, type)) return true;
    }
  }
  return false;
}

// SmolLM2's pre-tokenizer: Sequence[Digits(individual_digits), ByteLevel].
bool IsSmolLmPre(const Json& root) {
  const Json* pre = FindMember(root, "pre_tokenizer");
  if (pre == nullptr) return false;
  const Json* seq = FindMember(*pre, "pretokenizers");
  if (seq == nullptr || !seq->is_array() || seq->size() != 2) return false;
  const Json* t0 = FindMember((*seq)[0], "type");
  const Json* digits = FindMember((*seq)[0], "individual_digits");
  return t0 != nullptr && *t0 == "Digits" && digits != nullptr && *digits == true && HasNode((*seq)[1], "ByteLevel");
}

// The content of a special-token entry in tokenizer_config.json ("<s>" or {"content": "<s>"}).
std::string TokenContent(const Json& cfg, const char* key) {
  const Json* v = FindMember(cfg, key);
  if (v == nullptr) return "";
  if (v->is_string()) return v->get<std::string>();
  const Json* c = FindMember(*v, "content");
  return c != nullptr && c->is_string() ? c->get<std::string>() : "";
}

}  // namespace

StatusOr<GgufTokenizerData> GgufTokenizerFromHfJson(const std::string& tokenizer_json_text,
                                                    const std::string& tokenizer_config_text, const ModelConfig& c,
                                                    const std::string& gguf_pre) {
  ATTIC_ASSIGN_OR_RETURN(Json root, ParseJson(tokenizer_json_text, "tokenizer.json"));
  Json cfg = Json::object();
  if (!tokenizer_config_text.empty()) {
    ATTIC_ASSIGN_OR_RETURN(cfg, ParseJson(tokenizer_config_text, "tokenizer_config.json"));
  }
  const Json* model = FindMember(root, "model");
  if (model == nullptr || !model->is_object()) return DataLossError("tokenizer.json: no 'model' object");
  std::string type;
  ATTIC_RETURN_IF_ERROR(GetString(*model, "type", &type));
  if (type != "BPE") return UnimplementedError("tokenizer.json: model type '" + type + "' is not supported (BPE only)");
  const Json* vocab = FindMember(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) return DataLossError("tokenizer.json: no 'model.vocab' object");

  // id -> (text, type); added tokens override the vocab.
  std::map<int64_t, std::pair<std::string, int32_t>> by_id;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer()) return DataLossError("tokenizer.json: vocab ids must be integers");
    by_id[it.value().get<int64_t>()] = {it.key(), kTypeNormal};
  }
  if (const Json* added = FindMember(root, "added_tokens"); added != nullptr && added->is_array()) {
    for (const Json& a : *added) {
      int64_t id = -1;
      std::string content;
      bool special = false;
      ATTIC_RETURN_IF_ERROR(GetInt64(a, "id", &id));
      ATTIC_RETURN_IF_ERROR(GetString(a, "content", &content));
      ATTIC_RETURN_IF_ERROR(GetBool(a, "special", &special));
      by_id[id] = {content, special ? kTypeControl : kTypeUserDefined};
    }
  }
  if (by_id.empty() || by_id.begin()->first < 0) return DataLossError("tokenizer.json: empty vocab or negative id");
  const int64_t n = std::max<int64_t>(by_id.rbegin()->first + 1, c.vocab_size);
  if (n > c.vocab_size) {
    return InvalidArgumentError("tokenizer.json has ids up to " + std::to_string(n - 1) + " but vocab_size is " +
                                std::to_string(c.vocab_size));
  }

  const bool byte_level = HasNode(root, "ByteLevel");
  GgufTokenizerData t;
  t.model = byte_level ? "gpt2" : "llama";
  t.pre = !gguf_pre.empty() ? gguf_pre : byte_level && IsSmolLmPre(root) ? "smollm" : "default";
  t.tokens.resize(static_cast<size_t>(n));
  t.token_types.assign(static_cast<size_t>(n), kTypeUnused);
  for (int64_t i = 0; i < n; ++i) t.tokens[static_cast<size_t>(i)] = "[PAD" + std::to_string(i) + "]";
  for (const auto& [id, tok] : by_id) {
    t.tokens[static_cast<size_t>(id)] = tok.first;
    t.token_types[static_cast<size_t>(id)] = tok.second;
  }

  std::vector<std::string> merges;
  if (const Json* m = FindMember(*model, "merges"); m != nullptr && m->is_array()) {
    for (const Json& e : *m) {
      if (e.is_string()) {
        merges.push_back(e.get<std::string>());
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        merges.push_back(e[0].get<std::string>() + " " + e[1].get<std::string>());
      } else {
        return DataLossError("tokenizer.json: merges must be \"a b\" strings or [a, b] pairs");
      }
    }
  }

  std::string unk;
  ATTIC_RETURN_IF_ERROR(GetString(*model, "unk_token", &unk));
  auto find_id = [&](const std::string& text) -> int {
    if (text.empty()) return -1;
    for (const auto& [id, tok] : by_id) {
      if (tok.first == text) return static_cast<int>(id);
    }
    return -1;
  };
  t.unk_id = find_id(unk);
  t.bos_id = c.bos_token_id >= 0 && c.bos_token_id < n ? c.bos_token_id : find_id(TokenContent(cfg, "bos_token"));
  t.eos_id = !c.eos_token_ids.empty() && c.eos_token_ids[0] < n ? c.eos_token_ids[0]
                                                                 : find_id(TokenContent(cfg, "eos_token"));
  t.pad_id = find_id(TokenContent(cfg, "pad_token"));

  if (byte_level) {
    t.merges = std::move(merges);
    t.add_bos = false;
    t.add_space_prefix = false;
  } else {
    // SentencePiece-style: normal tokens score -k, k their rank among normal tokens in
    // id order (a SentencePiece model's piece scores; the vocab of a converted
    // tokenizer.json keeps that order); special, unknown and byte tokens score 0.
    static const std::regex kByteToken("<0x[0-9A-Fa-f]{2}>");
    if (t.unk_id >= 0) t.token_types[static_cast<size_t>(t.unk_id)] = kTypeUnknown;
    t.scores.assign(static_cast<size_t>(n), 0.0f);
    int64_t rank = 0;
    for (int64_t i = 0; i < n; ++i) {
      auto& ty = t.token_types[static_cast<size_t>(i)];
      if (ty == kTypeNormal && std::regex_match(t.tokens[static_cast<size_t>(i)], kByteToken)) ty = kTypeByte;
      if (ty == kTypeNormal) t.scores[static_cast<size_t>(i)] = -static_cast<float>(rank++);
    }
    t.add_bos = true;
    t.add_space_prefix = HasNode(root, "Prepend") || HasNode(root, "Metaspace");
  }
  ATTIC_RETURN_IF_ERROR(GetBool(cfg, "add_bos_token", &t.add_bos));
  ATTIC_RETURN_IF_ERROR(GetBool(cfg, "add_eos_token", &t.add_eos));
  if (const Json* ct = FindMember(cfg, "chat_template"); ct != nullptr && ct->is_string()) {
    t.chat_template = ct->get<std::string>();
  }
  return t;
}

}  // namespace attic::model
