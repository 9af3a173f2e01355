#include "model/gguf_tokenizer.h"

namespace attic::model {

namespace {

Status StringKey(const GgufFile& f, const char* key, std::string* out) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return OkStatus();
  if (v->type != GgufType::kString) return DataLossError(std::string("GGUF '") + key + "' is not a string");
  *out = v->str;
  return OkStatus();
}

Status BoolKey(const GgufFile& f, const char* key, bool* out) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return OkStatus();
  if (v->type != GgufType::kBool) return DataLossError(std::string("GGUF '") + key + "' is not a bool");
  *out = v->b;
  return OkStatus();
}

// Token ids outside [0, n_tokens) (llama.cpp writes 0xffffffff for "none") become -1.
Status IdKey(const GgufFile& f, const char* key, size_t n_tokens, int* out) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return OkStatus();
  int64_t id = -1;
  if (!v->AsInt64(&id)) {
    if (v->is_integer()) return OkStatus();  // a u64 past int64: "none"
    return DataLossError(std::string("GGUF '") + key + "' is not an integer");
  }
  *out = id >= 0 && static_cast<uint64_t>(id) < n_tokens ? static_cast<int>(id) : -1;
  return OkStatus();
}

const GgufValue* ArrayKey(const GgufFile& f, const char* key, Status* st) {
  const GgufValue* v = f.Find(key);
  if (v != nullptr && v->type != GgufType::kArray) {
    *st = DataLossError(std::string("GGUF '") + key + "' is not an array");
    return nullptr;
  }
  return v;
}

}  // namespace

StatusOr<std::unique_ptr<GgufTokenizerData>> ReadGgufTokenizer(const GgufFile& f) {
  if (f.Find("tokenizer.ggml.model") == nullptr || f.Find("tokenizer.ggml.tokens") == nullptr) {
    return std::unique_ptr<GgufTokenizerData>();
  }
  auto t = std::make_unique<GgufTokenizerData>();
  ATTIC_RETURN_IF_ERROR(StringKey(f, "tokenizer.ggml.model", &t->model));
  ATTIC_RETURN_IF_ERROR(StringKey(f, "tokenizer.ggml.pre", &t->pre));
  if (t->pre.empty()) t->pre = "default";
  Status st;
  const GgufValue* tokens = ArrayKey(f, "tokenizer.ggml.tokens", &st);
  const GgufValue* scores = ArrayKey(f, "tokenizer.ggml.scores", &st);
  const GgufValue* types = ArrayKey(f, "tokenizer.ggml.token_type", &st);
  const GgufValue* merges = ArrayKey(f, "tokenizer.ggml.merges", &st);
  ATTIC_RETURN_IF_ERROR(st);
  if (tokens->elem_type != GgufType::kString) return DataLossError("GGUF tokenizer.ggml.tokens is not a string array");
  t->tokens = tokens->strs;
  const size_t n = t->tokens.size();
  if (scores != nullptr) {
    if (scores->elem_type != GgufType::kF32 && scores->elem_type != GgufType::kF64) {
      return DataLossError("GGUF tokenizer.ggml.scores is not a float array");
    }
    if (scores->floats.size() != n) return DataLossError("GGUF tokenizer.ggml.scores and tokens differ in length");
    t->scores.assign(scores->floats.begin(), scores->floats.end());
  }
  if (types != nullptr) {
    if (types->ints.size() != n || types->elem_type == GgufType::kBool) {
      return DataLossError("GGUF tokenizer.ggml.token_type must hold one integer per token");
    }
    t->token_types.assign(types->ints.begin(), types->ints.end());
  }
  if (merges != nullptr) {
    if (merges->elem_type != GgufType::kString) return DataLossError("GGUF tokenizer.ggml.merges is not a string array");
    t->merges = merges->strs;
  }
  ATTIC_RETURN_IF_ERROR(IdKey(f, "tokenizer.ggml.bos_token_id", n, &t->bos_id));
  ATTIC_RETURN_IF_ERROR(IdKey(f, "tokenizer.ggml.eos_token_id", n, &t->eos_id));
  ATTIC_RETURN_IF_ERROR(IdKey(f, "tokenizer.ggml.unknown_token_id", n, &t->unk_id));
  ATTIC_RETURN_IF_ERROR(IdKey(f, "tokenizer.ggml.padding_token_id", n, &t->pad_id));
  // Defaults as llama.cpp's vocab loader: SentencePiece-style ("llama") adds BOS and a
  // space prefix; byte-level BPE ("gpt2") does neither.
  const bool spm = t->model == "llama";
  t->add_bos = spm;
  t->add_eos = false;
  t->add_space_prefix = spm;
  ATTIC_RETURN_IF_ERROR(BoolKey(f, "tokenizer.ggml.add_bos_token", &t->add_bos));
  ATTIC_RETURN_IF_ERROR(BoolKey(f, "tokenizer.ggml.add_eos_token", &t->add_eos));
  ATTIC_RETURN_IF_ERROR(BoolKey(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix));
  ATTIC_RETURN_IF_ERROR(StringKey(f, "tokenizer.chat_template", &t->chat_template));
  return t;
}

}  // namespace attic::model
