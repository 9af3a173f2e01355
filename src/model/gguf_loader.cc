// Loading a GGUF file of the llama architecture: config from llama.* metadata,
// tokenizer from tokenizer.ggml.*, tensors renamed to HF names, q/k rows un-permuted
// from GGUF's interleaved RoPE order into HF's rotate-half order.
#include <cmath>
#include <cstring>
#include <set>

#include "attic/model/tensor_specs.h"
#include "model/gguf_file.h"
#include "model/gguf_tokenizer.h"
#include "model/model_builder.h"

namespace attic::model {

namespace {

Status GetU32Key(const GgufFile& f, const std::string& key, bool required, int* out) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    if (required) return DataLossError("GGUF metadata lacks '" + key + "'");
    return OkStatus();
  }
  int64_t x = 0;
  if (!v->AsInt64(&x) || x < 0 || x > INT32_MAX) return DataLossError("GGUF metadata '" + key + "' is not a valid count");
  *out = static_cast<int>(x);
  return OkStatus();
}

Status GetFloatKey(const GgufFile& f, const std::string& key, float* out) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return OkStatus();
  if (!v->is_number()) return DataLossError("GGUF metadata '" + key + "' is not a number");
  *out = static_cast<float>(v->AsDouble());
  return OkStatus();
}

// Llama 3 scaling is stored by llama.cpp's converter as a per-frequency factor tensor
// (rope_freqs.weight) only. Attic's writer adds attic.rope_scaling.* keys with the
// exact parameters; without them the standard Llama 3.x parameters (low 1, high 4,
// original context 8192) are tried with factor = max(rope_freqs). The result must
// reproduce the tensor, else Unimplemented.
Status RopeScalingFromFreqs(const GgufFile& f, const GgufTensorInfo& t, ModelConfig* c) {
  const int half = c->head_dim / 2;
  if (t.dtype != DType::kF32 || t.ne.size() != 1 || t.ne[0] != static_cast<uint64_t>(half)) {
    return DataLossError("rope_freqs.weight must be " + std::to_string(half) + " f32 values");
  }
  std::vector<float> factors(static_cast<size_t>(half));
  std::memcpy(factors.data(), t.data, factors.size() * sizeof(float));
  ModelConfig fit = *c;
  fit.rope_scaling = RopeScaling();
  const std::vector<float> base = RopeInvFrequencies(fit);
  RopeScaling& r = fit.rope_scaling;
  r.type = RopeScalingType::kLlama3;
  r.factor = 1.0f;
  for (float x : factors) r.factor = std::max(r.factor, x);
  r.low_freq_factor = 1.0f;
  r.high_freq_factor = 4.0f;
  r.original_max_position_embeddings = 8192;
  ATTIC_RETURN_IF_ERROR(GetFloatKey(f, "attic.rope_scaling.factor", &r.factor));
  ATTIC_RETURN_IF_ERROR(GetFloatKey(f, "attic.rope_scaling.low_freq_factor", &r.low_freq_factor));
  ATTIC_RETURN_IF_ERROR(GetFloatKey(f, "attic.rope_scaling.high_freq_factor", &r.high_freq_factor));
  ATTIC_RETURN_IF_ERROR(
      GetU32Key(f, "attic.rope_scaling.original_max_position_embeddings", false, &r.original_max_position_embeddings));
  bool all_one = true;
  for (float x : factors) all_one = all_one && x == 1.0f;
  if (all_one) return OkStatus();  // no scaling at all
  if (!fit.Validate().ok()) return UnimplementedError("rope_freqs.weight: unsupported per-frequency RoPE factors");
  const std::vector<float> scaled = RopeInvFrequencies(fit);
  for (int i = 0; i < half; ++i) {
    float expect = base[static_cast<size_t>(i)] / scaled[static_cast<size_t>(i)];
    if (std::fabs(expect - factors[static_cast<size_t>(i)]) > 1e-3f * expect) {
      return UnimplementedError("rope_freqs.weight holds per-frequency RoPE factors that are not Llama 3 scaling");
    }
  }
  c->rope_scaling = r;
  return OkStatus();
}

Status ConfigFromGguf(const GgufFile& f, const GgufTokenizerData* tok, ModelConfig* c) {
  c->architecture = "LlamaForCausalLM";
  ATTIC_RETURN_IF_ERROR(GetU32Key(f, "llama.embedding_length", true, &c->hidden_size));
  ATTIC_RETURN_IF_ERROR(GetU32Key(f, "llama.block_count", true, &c->n_layers));
  ATTIC_RETURN_IF_ERROR(GetU32Key(f, "llama.feed_forward_length", true, &c->intermediate_size));
  ATTIC_RETURN_IF_ERROR(GetU32Key(f, "llama.attention.head_count", true, &c->n_heads));
  c->n_kv_heads = c->n_heads;
  ATTIC_RETURN_IF_ERROR(GetU32Key(f, "llama.attention.head_count_kv", false, &c->n_kv_heads));
  c->head_dim = c->n_heads > 0 && c->hidden_size % c->n_heads == 0 ? c->hidden_size / c->n_heads : 0;
  ATTIC_RETURN_IF_ERROR(GetU32Key(f, "llama.attention.key_length", false, &c->head_dim));
  int value_length = c->head_dim, rope_dims = c->head_dim;
  ATTIC_RETURN_IF_ERROR(GetU32Key(f, "llama.attention.value_length", false, &value_length));
  ATTIC_RETURN_IF_ERROR(GetU32Key(f, "llama.rope.dimension_count", false, &rope_dims));
  if (value_length != c->head_dim) return UnimplementedError("GGUF: key_length != value_length is not supported");
  if (rope_dims != c->head_dim) {
    return UnimplementedError("GGUF: partial rotary embeddings (rope.dimension_count " + std::to_string(rope_dims) +
                              " != head_dim " + std::to_string(c->head_dim) + ") are not supported");
  }
  c->vocab_size = 0;
  ATTIC_RETURN_IF_ERROR(GetU32Key(f, "llama.vocab_size", false, &c->vocab_size));
  if (c->vocab_size == 0 && tok != nullptr) c->vocab_size = static_cast<int>(tok->tokens.size());
  if (c->vocab_size == 0) {
    const GgufTensorInfo* emb = f.FindTensor("token_embd.weight");
    if (emb != nullptr && emb->ne.size() == 2 && emb->ne[1] <= INT32_MAX) c->vocab_size = static_cast<int>(emb->ne[1]);
  }
  if (tok != nullptr && static_cast<int64_t>(tok->tokens.size()) > c->vocab_size) {
    return DataLossError("GGUF tokenizer has " + std::to_string(tok->tokens.size()) + " tokens but the model vocab is " +
                         std::to_string(c->vocab_size));
  }
  c->max_position_embeddings = 2048;
  ATTIC_RETURN_IF_ERROR(GetU32Key(f, "llama.context_length", false, &c->max_position_embeddings));
  c->rms_norm_eps = 1e-5f;
  ATTIC_RETURN_IF_ERROR(GetFloatKey(f, "llama.attention.layer_norm_rms_epsilon", &c->rms_norm_eps));
  c->rope_theta = 10000.0f;
  ATTIC_RETURN_IF_ERROR(GetFloatKey(f, "llama.rope.freq_base", &c->rope_theta));

  std::string scaling = "none";
  if (const GgufValue* v = f.Find("llama.rope.scaling.type")) {
    if (v->type != GgufType::kString) return DataLossError("GGUF 'llama.rope.scaling.type' is not a string");
    scaling = v->str;
  }
  float factor = 0.0f;
  ATTIC_RETURN_IF_ERROR(GetFloatKey(f, "llama.rope.scaling.factor", &factor));
  ATTIC_RETURN_IF_ERROR(GetFloatKey(f, "llama.rope.scale_linear", &factor));  // older files
  if (f.Find("llama.rope.scale_linear") != nullptr && f.Find("llama.rope.scaling.type") == nullptr) scaling = "linear";
  if (scaling == "linear" && factor != 0.0f && factor != 1.0f) {
    c->rope_scaling.type = RopeScalingType::kLinear;
    c->rope_scaling.factor = factor;
  } else if (scaling != "none" && scaling != "linear") {
    return UnimplementedError("GGUF rope scaling type '" + scaling + "' is not supported (supported: none, linear)");
  }
  if (const GgufTensorInfo* freqs = f.FindTensor("rope_freqs.weight")) {
    if (c->rope_scaling.type != RopeScalingType::kNone) {
      return UnimplementedError("GGUF has both rope_freqs.weight and rope scaling '" + scaling + "'");
    }
    ATTIC_RETURN_IF_ERROR(c->Validate());
    ATTIC_RETURN_IF_ERROR(RopeScalingFromFreqs(f, *freqs, c));
  }

  c->tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  c->attention_bias = false;
  if (tok != nullptr) {
    c->bos_token_id = tok->bos_id;
    if (tok->eos_id >= 0) c->eos_token_ids.push_back(tok->eos_id);
    int eot = -1;
    if (GetU32Key(f, "tokenizer.ggml.eot_token_id", false, &eot).ok() && eot >= 0 &&
        eot < static_cast<int>(tok->tokens.size()) && eot != tok->eos_id) {
      c->eos_token_ids.push_back(eot);
    }
  }
  if (const GgufTensorInfo* q = f.FindTensor("blk.0.attn_q.weight"); q != nullptr && q->dtype && !DTypeIsBlock(*q->dtype)) {
    c->torch_dtype = *q->dtype;
  }
  return c->Validate();
}

// Copies a q/k matrix into `out` with its rows moved from GGUF's interleaved order to HF's.
void UnpermuteRows(const GgufTensorInfo& t, int head_dim, uint8_t* out) {
  const int64_t rows = static_cast<int64_t>(t.ne[1]);
  const size_t row_bytes = t.nbytes / static_cast<size_t>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(out + static_cast<size_t>(r) * row_bytes,
                t.data + static_cast<size_t>(HfRowToGgufRow(r, head_dim)) * row_bytes, row_bytes);
  }
}

bool NeedsUnpermute(const std::string& hf_name, const GgufTensorInfo& t, int head_dim) {
  return IsRopePermuted(hf_name) && t.ne.size() == 2 && t.ne[1] > 0 && t.ne[1] % static_cast<uint64_t>(head_dim) == 0;
}

constexpr size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadGgufFile(const std::string& path, const LoadOptions& opts) {
  ATTIC_ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(path));
  ATTIC_ASSIGN_OR_RETURN(GgufFile f, ParseGguf(mapped->data(), mapped->size(), path));
  const GgufValue* arch = f.Find("general.architecture");
  if (arch == nullptr || arch->type != GgufType::kString) {
    return DataLossError(path + ": GGUF metadata lacks general.architecture");
  }
  if (arch->str != "llama") {
    return UnimplementedError(path + ": GGUF architecture '" + arch->str + "' is not supported (supported: llama)");
  }
  ModelBuilder b(path, /*is_gguf=*/true);
  b.AddFile(std::move(mapped));  // the parsed pointers stay valid: the builder owns the map
  auto tok = ReadGgufTokenizer(f);
  if (!tok.ok()) return tok.status().WithContext(path);
  Status st = ConfigFromGguf(f, tok->get(), &b.config());
  if (!st.ok()) return st.WithContext(path);
  const ModelConfig& c = b.config();
  if (*tok != nullptr) b.set_chat_template((*tok)->chat_template);
  b.set_gguf_tokenizer(std::move(*tok));

  std::set<std::string> needed;
  for (const TensorSpec& s : ModelTensorSpecs(c)) needed.insert(s.name);
  // One buffer for all un-permuted q/k matrices.
  size_t unpermuted_bytes = 0;
  for (const GgufTensorInfo& t : f.tensors) {
    const std::string hf = GgufToHfName(t.name);
    if (t.dtype && needed.count(hf) != 0 && NeedsUnpermute(hf, t, c.head_dim)) unpermuted_bytes += Align64(t.nbytes);
  }
  ATTIC_ASSIGN_OR_RETURN(uint8_t* unpermuted, b.OwnRaw(unpermuted_bytes));
  std::map<std::string, SourceTensor> tensors;
  for (const GgufTensorInfo& t : f.tensors) {
    const std::string hf = GgufToHfName(t.name);
    if (hf.empty() || needed.count(hf) == 0) continue;  // e.g. rope_freqs.weight, handled above
    if (!t.dtype) {
      return UnimplementedError(path + ": tensor '" + t.name + "' has ggml type " + GgmlTypeName(t.ggml_type) +
                                " (supported: " + SupportedGgmlTypeNames() + ")");
    }
    if (tensors.count(hf) != 0) return DataLossError(path + ": tensor '" + t.name + "' appears twice");
    SourceTensor s{*t.dtype, {}, t.data, t.nbytes, t.name};
    for (auto it = t.ne.rbegin(); it != t.ne.rend(); ++it) s.shape.push_back(static_cast<int64_t>(*it));
    if (NeedsUnpermute(hf, t, c.head_dim)) {
      UnpermuteRows(t, c.head_dim, unpermuted);
      s.data = unpermuted;
      unpermuted += Align64(t.nbytes);
    }
    tensors[hf] = std::move(s);
  }
  return b.Finish(tensors, opts);
}

}  // namespace attic::model
