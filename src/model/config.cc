// ModelConfig: parsing and writing Hugging Face config.json, validation, RoPE frequencies.
#include "attic/model/config.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "model/json_util.h"

namespace attic::model {

namespace {

// Sizes above these are rejected so that products such as n_heads * head_dim and the
// tensor sizes derived from them stay far from integer overflow.
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxVocab = int64_t{1} << 24;

struct ArchInfo {
  const char* architecture;
  const char* model_type;
  float default_eps;
  int default_max_positions;
};

// Defaults follow transformers' LlamaConfig / MistralConfig / Qwen2Config.
constexpr ArchInfo kArchs[] = {
    {"LlamaForCausalLM", "llama", 1e-6f, 2048},
    {"MistralForCausalLM", "mistral", 1e-6f, 4096 * 32},
    {"Qwen2ForCausalLM", "qwen2", 1e-6f, 32768},
};

const ArchInfo* FindArch(const std::string& name) {
  for (const ArchInfo& a : kArchs) {
    if (name == a.architecture) return &a;
  }
  return nullptr;
}

std::string SupportedList() {
  std::string s;
  for (const ArchInfo& a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.architecture);
  return s;
}

Status ParseRopeScaling(const Json& rs, RopeScaling* out) {
  if (!rs.is_object()) return InvalidArgumentError("'rope_scaling' must be an object or null");
  std::string type;
  ATTIC_RETURN_IF_ERROR(GetString(rs, "rope_type", &type));
  if (type.empty()) ATTIC_RETURN_IF_ERROR(GetString(rs, "type", &type));
  RopeScaling r;
  if (type.empty() || type == "default") {
    *out = r;
    return OkStatus();
  }
  if (type == "linear") {
    r.type = RopeScalingType::kLinear;
  } else if (type == "llama3") {
    r.type = RopeScalingType::kLlama3;
    ATTIC_RETURN_IF_ERROR(GetFloat(rs, "low_freq_factor", &r.low_freq_factor));
    ATTIC_RETURN_IF_ERROR(GetFloat(rs, "high_freq_factor", &r.high_freq_factor));
    ATTIC_RETURN_IF_ERROR(GetInt(rs, "original_max_position_embeddings", &r.original_max_position_embeddings));
  } else {
    return UnimplementedError("rope_scaling type '" + type + "' is not supported (supported: linear, llama3)");
  }
  if (FindMember(rs, "factor") == nullptr) return InvalidArgumentError("rope_scaling '" + type + "' needs a 'factor'");
  ATTIC_RETURN_IF_ERROR(GetFloat(rs, "factor", &r.factor));
  *out = r;
  return OkStatus();
}

Status ParseEosIds(const Json& j, std::vector<int>* out) {
  const Json* v = FindMember(j, "eos_token_id");
  if (v == nullptr) return OkStatus();
  out->clear();
  if (v->is_array()) {
    for (const Json& e : *v) {
      if (!e.is_number_integer() || e.get<int64_t>() < INT32_MIN || e.get<int64_t>() > INT32_MAX) {
        return InvalidArgumentError("'eos_token_id' entries must be integers");
      }
      out->push_back(static_cast<int>(e.get<int64_t>()));
    }
    return OkStatus();
  }
  int id = -1;
  ATTIC_RETURN_IF_ERROR(GetInt(j, "eos_token_id", &id));
  out->push_back(id);
  return OkStatus();
}

Status Required(const Json& j, const char* key) {
  if (FindMember(j, key) == nullptr) return InvalidArgumentError(std::string("config.json: missing '") + key + "'");
  return OkStatus();
}

// Shortest decimal text that reads back as the same float (1e-5f -> 1e-05, not
// 9.999999747378752e-06), as a JSON number.
Json FloatJson(float f) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), f);
  return Json(std::strtod(std::string(buf, res.ptr).c_str(), nullptr));
}

}  // namespace

const std::vector<std::string>& SupportedArchitectures() {
  static const std::vector<std::string> kList = [] {
    std::vector<std::string> v;
    for (const ArchInfo& a : kArchs) v.push_back(a.architecture);
    return v;
  }();
  return kList;
}

Status ModelConfig::Validate() const {
  auto bad = [](const std::string& m) { return InvalidArgumentError("model config: " + m); };
  auto in_range = [](int64_t v, int64_t hi) { return v > 0 && v <= hi; };
  if (FindArch(architecture) == nullptr) {
    return UnimplementedError("unsupported architecture '" + architecture + "' (supported: " + SupportedList() + ")");
  }
  if (!in_range(hidden_size, kMaxDim)) return bad("hidden_size must be in [1, 2^20], got " + std::to_string(hidden_size));
  if (!in_range(intermediate_size, kMaxDim)) return bad("intermediate_size must be in [1, 2^20], got " + std::to_string(intermediate_size));
  if (!in_range(n_layers, kMaxLayers)) return bad("num_hidden_layers must be in [1, 4096], got " + std::to_string(n_layers));
  if (!in_range(n_heads, kMaxHeads)) return bad("num_attention_heads must be in [1, 4096], got " + std::to_string(n_heads));
  if (!in_range(n_kv_heads, n_heads)) {
    return bad("num_key_value_heads must be in [1, num_attention_heads], got " + std::to_string(n_kv_heads));
  }
  if (n_heads % n_kv_heads != 0) {
    return bad("num_attention_heads (" + std::to_string(n_heads) + ") must be a multiple of num_key_value_heads (" +
               std::to_string(n_kv_heads) + ")");
  }
  if (!in_range(head_dim, kMaxHeads) || head_dim % 2 != 0) {
    return bad("head_dim must be even and in [2, 4096], got " + std::to_string(head_dim) +
               " (hidden_size not divisible by num_attention_heads?)");
  }
  if (static_cast<int64_t>(n_heads) * head_dim > kMaxDim) return bad("num_attention_heads * head_dim exceeds 2^20");
  if (!in_range(vocab_size, kMaxVocab)) return bad("vocab_size must be in [1, 2^24], got " + std::to_string(vocab_size));
  if (max_position_embeddings <= 0) return bad("max_position_embeddings must be positive");
  if (!(rms_norm_eps > 0.0f) || !std::isfinite(rms_norm_eps)) return bad("rms_norm_eps must be positive");
  if (!(rope_theta > 0.0f) || !std::isfinite(rope_theta)) return bad("rope_theta must be positive");
  if (sliding_window < 0) return bad("sliding_window must be >= 0");
  const RopeScaling& r = rope_scaling;
  if (r.type != RopeScalingType::kNone) {
    if (!(r.factor > 0.0f) || !std::isfinite(r.factor)) return bad("rope_scaling.factor must be positive");
    if (r.type == RopeScalingType::kLlama3) {
      if (!(r.low_freq_factor > 0.0f) || !(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor)) {
        return bad("rope_scaling needs 0 < low_freq_factor < high_freq_factor");
      }
      if (r.original_max_position_embeddings <= 0) return bad("rope_scaling.original_max_position_embeddings must be positive");
    }
  }
  for (int id : eos_token_ids) {
    if (id < 0) return bad("eos_token_id must be non-negative");
  }
  return OkStatus();
}

StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text) {
  ATTIC_ASSIGN_OR_RETURN(Json j, ParseJson(json_text, "config.json"));
  if (!j.is_object()) return DataLossError("config.json: expected a JSON object");

  // Architecture: the first supported entry of "architectures", else "model_type".
  std::string first_arch;
  const ArchInfo* arch = nullptr;
  if (const Json* a = FindMember(j, "architectures")) {
    if (!a->is_array()) return InvalidArgumentError("config.json: 'architectures' must be a list");
    for (const Json& e : *a) {
      if (!e.is_string()) return InvalidArgumentError("config.json: 'architectures' entries must be strings");
      if (first_arch.empty()) first_arch = e.get<std::string>();
      if (arch == nullptr) arch = FindArch(e.get<std::string>());
    }
  }
  std::string model_type;
  ATTIC_RETURN_IF_ERROR(GetString(j, "model_type", &model_type));
  if (arch == nullptr && first_arch.empty()) {
    for (const ArchInfo& a : kArchs) {
      if (model_type == a.model_type) arch = &a;
    }
    if (arch == nullptr) {
      return UnimplementedError("unsupported model_type '" + model_type + "' and no 'architectures' (supported: " +
                                SupportedList() + ")");
    }
  }
  if (arch == nullptr) {
    return UnimplementedError("unsupported architecture '" + first_arch + "' (supported: " + SupportedList() + ")");
  }

  ModelConfig c;
  c.architecture = arch->architecture;
  c.rms_norm_eps = arch->default_eps;
  c.max_position_embeddings = arch->default_max_positions;
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"}) {
    ATTIC_RETURN_IF_ERROR(Required(j, key));
  }
  ATTIC_RETURN_IF_ERROR(GetInt(j, "hidden_size", &c.hidden_size));
  ATTIC_RETURN_IF_ERROR(GetInt(j, "intermediate_size", &c.intermediate_size));
  ATTIC_RETURN_IF_ERROR(GetInt(j, "num_hidden_layers", &c.n_layers));
  ATTIC_RETURN_IF_ERROR(GetInt(j, "num_attention_heads", &c.n_heads));
  c.n_kv_heads = c.n_heads;
  ATTIC_RETURN_IF_ERROR(GetInt(j, "num_key_value_heads", &c.n_kv_heads));
  if (c.n_heads > 0 && c.hidden_size % c.n_heads == 0) c.head_dim = c.hidden_size / c.n_heads;
  ATTIC_RETURN_IF_ERROR(GetInt(j, "head_dim", &c.head_dim));
  ATTIC_RETURN_IF_ERROR(GetInt(j, "vocab_size", &c.vocab_size));
  ATTIC_RETURN_IF_ERROR(GetInt(j, "max_position_embeddings", &c.max_position_embeddings));
  ATTIC_RETURN_IF_ERROR(GetFloat(j, "rms_norm_eps", &c.rms_norm_eps));
  ATTIC_RETURN_IF_ERROR(GetFloat(j, "rope_theta", &c.rope_theta));
  if (const Json* rs = FindMember(j, "rope_scaling")) ATTIC_RETURN_IF_ERROR(ParseRopeScaling(*rs, &c.rope_scaling));
  // transformers >= 5 nests both under "rope_parameters".
  if (const Json* rp = FindMember(j, "rope_parameters")) {
    ATTIC_RETURN_IF_ERROR(GetFloat(*rp, "rope_theta", &c.rope_theta));
    ATTIC_RETURN_IF_ERROR(ParseRopeScaling(*rp, &c.rope_scaling));
  }
  ATTIC_RETURN_IF_ERROR(GetBool(j, "tie_word_embeddings", &c.tie_word_embeddings));

  bool mlp_bias = false;
  ATTIC_RETURN_IF_ERROR(GetBool(j, "mlp_bias", &mlp_bias));
  if (mlp_bias) return UnimplementedError("config.json: mlp_bias=true is not supported");
  if (c.architecture == std::string("Qwen2ForCausalLM")) {
    c.attention_bias = true;  // Qwen2 always has q/k/v biases (and none on o_proj)
    bool use_sliding = false;
    ATTIC_RETURN_IF_ERROR(GetBool(j, "use_sliding_window", &use_sliding));
    if (use_sliding) ATTIC_RETURN_IF_ERROR(GetInt(j, "sliding_window", &c.sliding_window));
  } else {
    ATTIC_RETURN_IF_ERROR(GetBool(j, "attention_bias", &c.attention_bias));
    if (c.attention_bias) {
      // Llama's attention_bias also biases o_proj, which LayerWeights has no slot for.
      return UnimplementedError("config.json: attention_bias=true is supported for Qwen2ForCausalLM only");
    }
    if (c.architecture == std::string("MistralForCausalLM")) {
      ATTIC_RETURN_IF_ERROR(GetInt(j, "sliding_window", &c.sliding_window));
    }
  }

  ATTIC_RETURN_IF_ERROR(GetInt(j, "bos_token_id", &c.bos_token_id));
  ATTIC_RETURN_IF_ERROR(ParseEosIds(j, &c.eos_token_ids));
  std::string dtype;
  ATTIC_RETURN_IF_ERROR(GetString(j, "torch_dtype", &dtype));
  if (dtype.empty()) ATTIC_RETURN_IF_ERROR(GetString(j, "dtype", &dtype));
  if (!dtype.empty()) {
    auto d = ParseDType(dtype);
    if (d.ok() && !DTypeIsBlock(*d)) c.torch_dtype = *d;  // other dtypes are only metadata here
  }
  ATTIC_RETURN_IF_ERROR(c.Validate());
  return c;
}

std::string HfConfigToJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  const ArchInfo* arch = FindArch(c.architecture);
  j["architectures"] = {c.architecture};
  j["model_type"] = arch != nullptr ? arch->model_type : "llama";
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = FloatJson(c.rms_norm_eps);
  j["rope_theta"] = FloatJson(c.rope_theta);
  const RopeScaling& r = c.rope_scaling;
  if (r.type == RopeScalingType::kNone) {
    j["rope_scaling"] = nullptr;
  } else {
    nlohmann::ordered_json rs;
    rs["rope_type"] = r.type == RopeScalingType::kLinear ? "linear" : "llama3";
    rs["factor"] = FloatJson(r.factor);
    if (r.type == RopeScalingType::kLlama3) {
      rs["low_freq_factor"] = FloatJson(r.low_freq_factor);
      rs["high_freq_factor"] = FloatJson(r.high_freq_factor);
      rs["original_max_position_embeddings"] = r.original_max_position_embeddings;
    }
    j["rope_scaling"] = rs;
  }
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["mlp_bias"] = false;
  if (c.architecture == "Qwen2ForCausalLM") {
    j["use_sliding_window"] = c.sliding_window > 0;
    j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
  } else if (c.architecture == "MistralForCausalLM") {
    j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids;
  }
  const char* dtype = c.torch_dtype == DType::kF16 ? "float16" : c.torch_dtype == DType::kBF16 ? "bfloat16" : "float32";
  j["torch_dtype"] = dtype;
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

std::vector<float> RopeInvFrequencies(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  const RopeScaling& r = c.rope_scaling;
  for (int i = 0; i < half; ++i) {
    // float32 exponent as transformers computes it (torch.arange(0, dim, 2).float() / dim).
    float expo = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    double f = 1.0 / std::pow(static_cast<double>(c.rope_theta), static_cast<double>(expo));
    if (r.type == RopeScalingType::kLinear) {
      f /= r.factor;
    } else if (r.type == RopeScalingType::kLlama3) {
      const double old_ctx = r.original_max_position_embeddings;
      const double low_wavelen = old_ctx / r.low_freq_factor;
      const double high_wavelen = old_ctx / r.high_freq_factor;
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f /= r.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (old_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1.0 - smooth) * f / r.factor + smooth * f;
      }
    }
    inv[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return inv;
}

std::string CanonicalConfigString(const ModelConfig& c) {
  char rope[160];
  const RopeScaling& r = c.rope_scaling;
  switch (r.type) {
    case RopeScalingType::kNone:
      std::snprintf(rope, sizeof(rope), "none");
      break;
    case RopeScalingType::kLinear:
      std::snprintf(rope, sizeof(rope), "linear,%.9g", static_cast<double>(r.factor));
      break;
    case RopeScalingType::kLlama3:
      std::snprintf(rope, sizeof(rope), "llama3,%.9g,%.9g,%.9g,%d", static_cast<double>(r.factor),
                    static_cast<double>(r.low_freq_factor), static_cast<double>(r.high_freq_factor),
                    r.original_max_position_embeddings);
      break;
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "attic-config-v1;hidden=%d;ffn=%d;layers=%d;heads=%d;kv_heads=%d;head_dim=%d;vocab=%d;"
                "eps=%.9g;theta=%.9g;rope=%s;qkv_bias=%d;swa=%d",
                c.hidden_size, c.intermediate_size, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size,
                static_cast<double>(c.rms_norm_eps), static_cast<double>(c.rope_theta), rope,
                c.attention_bias ? 1 : 0, c.sliding_window);
  return buf;
}

}  // namespace attic::model
