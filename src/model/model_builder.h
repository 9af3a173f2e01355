// ModelBuilder: the format-independent half of loading. A format loader (HF directory,
// GGUF file) maps files, parses the config and hands over the tensors it found under
// their HF names in Attic's layout; the builder validates every tensor against the
// config, binds ModelWeights (matrices point into the maps; norms and biases are
// converted to f32), and computes the fingerprint.
//
// Thread-safety: single-threaded use during Load.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "attic/model/model.h"

namespace attic::model {

// A tensor as found in a checkpoint, in [out, in] row-major layout, HF row order.
struct SourceTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::string origin;  // where it came from, for messages ("model.safetensors", ...)
};

class ModelBuilder {
 public:
  ModelBuilder(std::string path, bool is_gguf);

  ModelConfig& config() { return model_->config_; }
  // Keeps a mapped checkpoint file alive for the model's lifetime.
  void AddFile(std::unique_ptr<MappedFile> f) { model_->files_.push_back(std::move(f)); }
  // Keeps `buf` alive for the model's lifetime; returns its data.
  const uint8_t* Own(AlignedBuffer buf);
  // Uninitialised, 64-byte aligned memory owned by the model: an anonymous map using
  // huge pages where the kernel allows (faulting hundreds of MB in 4 KiB pages costs
  // more than copying into them). ResourceExhausted if the map fails.
  StatusOr<uint8_t*> OwnRaw(size_t bytes);
  void set_tokenizer_json_path(std::string p) { model_->tokenizer_json_path_ = std::move(p); }
  void set_chat_template(std::string t) { model_->chat_template_ = std::move(t); }
  void set_gguf_tokenizer(std::unique_ptr<GgufTokenizerData> t) { model_->gguf_tokenizer_ = std::move(t); }

  // Validates `tensors` (keyed by HF name) against config(), binds the weights and
  // computes the fingerprint. Missing tensor -> NotFound; wrong shape or size ->
  // DataLoss; unsupported dtype or tensor -> Unimplemented.
  StatusOr<std::unique_ptr<Model>> Finish(const std::map<std::string, SourceTensor>& tensors, const LoadOptions& opts);

 private:
  StatusOr<WeightTensor> BindMatrix(const std::string& name, const SourceTensor& t);
  StatusOr<const float*> BindVector(const std::string& name, const SourceTensor& t);

  std::unique_ptr<Model> model_;
};

// Format loaders (hf_loader.cc, gguf_loader.cc). REQUIRES: path is a directory / file.
StatusOr<std::unique_ptr<Model>> LoadHfDirectory(const std::string& dir, const LoadOptions& opts);
StatusOr<std::unique_ptr<Model>> LoadGgufFile(const std::string& path, const LoadOptions& opts);

}  // namespace attic::model
