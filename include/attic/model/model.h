// Model: a loaded checkpoint (config + weights + where its tokenizer lives) and its
// fingerprint. Loading accepts a Hugging Face directory (config.json +
// model.safetensors or model.safetensors.index.json shards) or a GGUF v3 file.
//
// Thread-safety: immutable after Load; share freely across threads.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attic/core/file.h"
#include "attic/core/status.h"
#include "attic/model/config.h"
#include "attic/model/weights.h"
#include "attic/tensor/buffer.h"

namespace attic::model {

struct LoadOptions {
  // Called with (bytes done, bytes total) while tensors are validated/converted and
  // checksummed for the fingerprint. Calls are serialised but may come from loader
  // worker threads; `done` never decreases and ends equal to `total`.
  std::function<void(uint64_t, uint64_t)> progress;
};

// Tokenizer data carried inside a GGUF file (tokenizer.ggml.*), so the tokenizer module
// can build a tokenizer without a tokenizer.json.
struct GgufTokenizerData {
  std::string model;                 // "llama" (SentencePiece-style) or "gpt2" (byte-level)
  std::string pre;                   // pre-tokenizer name, e.g. "smollm", "llama-bpe", "qwen2", "default"
  std::vector<std::string> tokens;
  std::vector<float> scores;         // may be empty
  std::vector<int32_t> token_types;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
  std::vector<std::string> merges;   // "a b" pairs, gpt2 only (and some llama files)
  int bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = true;
  std::string chat_template;         // tokenizer.chat_template, may be empty
};

class Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& path, const LoadOptions& opts = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // 32 hex digits, derived from the config and every weight byte: a KV entry is valid
  // only for the fingerprint it was made with.
  const std::string& fingerprint() const { return fingerprint_; }
  // The directory of an HF checkpoint, or the GGUF file path.
  const std::string& path() const { return path_; }
  bool is_gguf() const { return is_gguf_; }
  // For HF directories: path to tokenizer.json ("" if absent) and the chat template text
  // found in tokenizer_config.json or chat_template.jinja ("" if none).
  const std::string& tokenizer_json_path() const { return tokenizer_json_path_; }
  const std::string& chat_template() const { return chat_template_; }
  // For GGUF files: the embedded tokenizer (nullptr for HF dirs).
  const GgufTokenizerData* gguf_tokenizer() const { return gguf_tokenizer_.get(); }
  // The dtype most matmul weights are stored in.
  DType weight_dtype() const { return weight_dtype_; }
  uint64_t weight_bytes() const { return weight_bytes_; }
  // For backends that add their own layouts of the weights at load time
  // (WeightTensor::packed); `memory` then lives as long as the model.
  ModelWeights& mutable_weights() { return weights_; }
  void Own(std::shared_ptr<void> memory) { owned_maps_.push_back(std::move(memory)); }

 private:
  friend class ModelBuilder;
  Model() = default;
  ModelConfig config_;
  ModelWeights weights_;
  std::string fingerprint_;
  std::string path_;
  bool is_gguf_ = false;
  std::string tokenizer_json_path_;
  std::string chat_template_;
  std::unique_ptr<GgufTokenizerData> gguf_tokenizer_;
  DType weight_dtype_ = DType::kF32;
  uint64_t weight_bytes_ = 0;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<AlignedBuffer> owned_;  // converted / permuted tensors
  std::vector<std::shared_ptr<void>> owned_maps_;  // other owned memory (anonymous maps)
};

}  // namespace attic::model
