#include "attic/model/quant_preset.h"

#include <cctype>

#include "attic/tensor/quants.h"

namespace attic::model {

namespace {

bool EndsWith(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// llama.cpp's use_more_bits(i, n): the first and last eighth, and every third between.
bool UseMoreBits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

DType Fallback(DType t, int64_t cols) {
  if (cols % DTypeBlockSize(t) == 0) return t;
  if (t == DType::kQ4_K) return DType::kQ5_0;
  if (t == DType::kQ6_K) return DType::kQ8_0;
  return t;
}

}  // namespace

StatusOr<QuantPreset> ParseQuantPreset(const std::string& name) {
  std::string n = name;
  for (char& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  QuantPreset p;
  p.name = n;
  if (n == "q4_k_m") {
    p.base = DType::kQ4_K;
    p.mix = true;
    p.file_type = 15;
    return p;
  }
  auto d = ParseDType(n);
  if (d.ok() && CanQuantize(*d)) {
    p.base = *d;
    switch (*d) {
      case DType::kQ4_0: p.file_type = 2; break;
      case DType::kQ4_1: p.file_type = 3; break;
      case DType::kQ8_0: p.file_type = 7; break;
      case DType::kQ5_0: p.file_type = 8; break;
      case DType::kQ5_1: p.file_type = 9; break;
      case DType::kQ4_K: p.file_type = 14; break;
      case DType::kQ6_K: p.file_type = 18; break;
      default: break;
    }
    return p;
  }
  return InvalidArgumentError("cannot quantize to '" + name +
                              "' (expected q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q6_k, or q4_k_m)");
}

bool IsQuantPresetName(const std::string& name) { return ParseQuantPreset(name).ok(); }

DType PresetMatrixType(const QuantPreset& p, const TensorSpec& spec, const ModelConfig& c) {
  const int64_t cols = spec.shape.size() == 2 ? spec.shape[1] : spec.numel();
  if (!p.mix) return Fallback(p.base, cols);
  const bool output = spec.name == "lm_head.weight" || (c.tie_word_embeddings && spec.name == "model.embed_tokens.weight");
  DType t = p.base;
  if (output) {
    t = DType::kQ6_K;
  } else if (spec.layer >= 0 && (EndsWith(spec.name, "v_proj.weight") || EndsWith(spec.name, "down_proj.weight")) &&
             UseMoreBits(spec.layer, c.n_layers)) {
    t = DType::kQ6_K;
  }
  return Fallback(t, cols);
}

}  // namespace attic::model
