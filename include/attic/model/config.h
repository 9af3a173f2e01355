// ModelConfig: the architecture hyper-parameters of a Llama-family model, parsed from a
// Hugging Face config.json or from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "attic/tensor/dtype.h"

namespace attic::model {

enum class RopeScalingType { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;
  // llama3 only:
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  // or MistralForCausalLM, Qwen2ForCausalLM
  int hidden_size = 0;
  int intermediate_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // hidden_size / n_heads unless config.json gives head_dim
  int vocab_size = 0;
  int max_position_embeddings = 2048;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (Qwen2 always has them)
  // Sliding-window attention span in tokens (Mistral's `sliding_window`, Qwen2's when
  // `use_sliding_window`); 0 = full causal attention.
  int sliding_window = 0;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  DType torch_dtype = DType::kF32;  // dtype named by the checkpoint

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // Validates internal consistency (positive sizes, heads divisible, ...).
  Status Validate() const;
};

// Parses config.json text. Unsupported architectures (or rope scaling types) ->
// Unimplemented naming them and the supported ones; malformed JSON -> DataLoss; values
// of the wrong type or out of range -> InvalidArgument. The result is Validate()d.
StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text);

// Serialises back to a config.json (used by `attic make-model`); ParseHfConfig inverts it.
std::string HfConfigToJson(const ModelConfig& c);

// The architectures ParseHfConfig accepts, e.g. "LlamaForCausalLM".
const std::vector<std::string>& SupportedArchitectures();

// RoPE inverse frequencies theta^(-2i/head_dim), i in [0, head_dim/2), with the config's
// rope scaling applied (linear: divided by factor; llama3: per-frequency smooth factor,
// as in transformers' _compute_llama3_parameters). REQUIRES: c.Validate().ok().
std::vector<float> RopeInvFrequencies(const ModelConfig& c);

// The parts of the config that change what the model computes (sizes, eps, RoPE,
// biases, sliding window), as a stable text; part of the model fingerprint. Leaves out
// metadata such as token ids, max_position_embeddings and torch_dtype.
std::string CanonicalConfigString(const ModelConfig& c);

}  // namespace attic::model
