// What `attic quantize` and `attic make-model --dtype` write: one block type for every
// matrix (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q6_k), or llama.cpp's q4_k_m mix, decided
// per tensor as llama.cpp's preset decides it:
//   * the output head (lm_head; the embedding table when tied) takes q6_k;
//   * q4_k_m: attn_v and ffn_down take q6_k in the first and last eighth of the layers
//     and every third layer between (llama.cpp's use_more_bits); the rest q4_k;
//   * a K-quant on rows that are not a multiple of 256 falls back: q4_k -> q5_0,
//     q6_k -> q8_0 (so stories260K's 64-wide rows take q5_0 and q8_0); rows that are not
//     whole blocks of any type take f16 (stories260K's 172-wide ffn_down), as in llama.cpp.
// The single-type presets put every matrix in that type (llama.cpp's --pure).
// Norms stay f32.
#pragma once

#include <cstdint>
#include <string>

#include "attic/core/status.h"
#include "attic/model/config.h"
#include "attic/model/tensor_specs.h"
#include "attic/tensor/dtype.h"

namespace attic::model {

struct QuantPreset {
  std::string name;       // lower case: "q4_k_m", "q8_0", ...
  DType base = DType::kQ8_0;
  bool mix = false;       // q4_k_m: the per-tensor rules above
  uint32_t file_type = 7; // GGUF general.file_type (llama_ftype)
};

// Accepts q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q6_k, q4_k_m (any case);
// InvalidArgument naming them otherwise.
StatusOr<QuantPreset> ParseQuantPreset(const std::string& name);
// Whether `name` names a preset rather than f32/f16/bf16.
bool IsQuantPresetName(const std::string& name);

// The dtype the preset gives one matrix of a model of config c.
DType PresetMatrixType(const QuantPreset& p, const TensorSpec& spec, const ModelConfig& c);

}  // namespace attic::model
