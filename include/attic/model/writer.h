// Writing model checkpoints: a Hugging Face directory (config.json, model.safetensors
// or shards + index, tokenizer files) or a GGUF v3 file of the llama architecture that
// llama.cpp loads (q/k rows permuted to GGUF's interleaved RoPE order, as llama.cpp's
// converter does; tokenizer embedded as tokenizer.ggml.* metadata).
//
// Weights come either from explicit f32 tensors (tests: tiny models with given
// weights) or from a seeded generator (benchmarks: real shapes, random weights). The
// random generator depends only on (seed, tensor name), so an HF directory and a GGUF
// file written with the same seed hold the same weights. Tensors are streamed to disk
// in chunks: writing a 1B-parameter model needs tens of MB of memory, not GB.
//
// Thread-safety: stateless free functions; concurrent calls must use distinct paths.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "attic/model/config.h"
#include "attic/model/tensor_specs.h"
#include "attic/model/model.h"
#include "attic/tensor/dtype.h"

namespace attic::model {

// An f32 tensor under its HF name (see tensor_specs.h), [out, in] row-major.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // numel values
};

struct TokenizerSource {
  std::string tokenizer_json_path;         // HF tokenizer.json to copy / embed; "" = none
  std::string tokenizer_config_json_path;  // tokenizer_config.json to copy / read; "" = none
  // Chat template text. HF: written to chat_template.jinja; GGUF: tokenizer.chat_template
  // (falls back to tokenizer_config.json's chat_template). "" = none.
  std::string chat_template;
  // tokenizer.ggml.pre for GGUF; "" = detect ("smollm" for SmolLM2's byte-level
  // pre-tokenizer, "default" otherwise).
  std::string gguf_pre;
};

struct WriteOptions {
  // Storage dtype of the weights. HF: f32, f16 or bf16, every tensor. GGUF: also q8_0
  // (ggml's reference quantisation; matrix rows must be multiples of 32); norms stay
  // f32 as llama.cpp's converter writes them.
  DType dtype = DType::kF32;
  // GGUF only: when set, the storage dtype of each matrix (any type QuantizeBlocks
  // writes, or f32/f16/bf16) instead of `dtype`, and general.file_type (llama_ftype);
  // `attic quantize` sets them from a QuantPreset.
  std::function<DType(const TensorSpec&)> matrix_dtype;
  uint32_t file_type = UINT32_MAX;
  // HF only: split into model-0000i-of-0000n.safetensors + model.safetensors.index.json
  // when the tensors add up to more than this many bytes; 0 = always one file.
  uint64_t max_shard_bytes = 0;
  TokenizerSource tokenizer;
  // Called with (bytes written, bytes total) as tensor data is written.
  std::function<void(uint64_t, uint64_t)> progress;
  std::string name = "attic-model";  // GGUF general.name
  // Flush each weight file to disk before renaming it into place. Off by default: the
  // rename alone already keeps readers from seeing a partial file, and a flush costs
  // seconds per GB.
  bool fsync = false;
};

struct RandomWeights {
  uint64_t seed = 1234;
  // Matrices (and biases) ~ N(0, stddev) (Irwin-Hall approximation: sum of 4 uniforms,
  // so |x| < 3.5 stddev); RMSNorm weights = 1. Values depend only on (seed, tensor name,
  // element index), not on dtype, format or write order.
  float stddev = 0.02f;
};

// Writes exactly `tensors` (in order; any HF names, shapes as given, so tests can also
// write inconsistent checkpoints) with c as config.json. InvalidArgument when a
// tensor's data does not match its shape.
Status WriteHfModel(const std::string& dir, const ModelConfig& c, const std::vector<NamedTensor>& tensors,
                    const WriteOptions& opts);
// The same for GGUF: each HF name is mapped to its GGUF name (InvalidArgument if it has
// none), q_proj/k_proj rows are permuted. Unimplemented for configs GGUF's llama
// architecture cannot express (q/k/v biases, sliding window).
Status WriteGgufModel(const std::string& path, const ModelConfig& c, const std::vector<NamedTensor>& tensors,
                      const WriteOptions& opts);

// All tensors of ModelTensorSpecs(c), random as described by `r`.
Status WriteRandomHfModel(const std::string& dir, const ModelConfig& c, const RandomWeights& r,
                          const WriteOptions& opts);
Status WriteRandomGgufModel(const std::string& path, const ModelConfig& c, const RandomWeights& r,
                            const WriteOptions& opts);
// The values WriteRandom* writes, materialised (small models only; for tests).
std::vector<NamedTensor> RandomTensors(const ModelConfig& c, const RandomWeights& r);

// GGUF tokenizer data from an HF tokenizer.json (BPE), as llama.cpp's converter makes it:
// byte-level BPE -> model "gpt2" with merges; SentencePiece-style BPE (byte fallback,
// "▁" spaces) -> model "llama" with scores (-k for the k-th normal token, as SentencePiece
// scores pieces). bos/eos come from c, else from tokenizer_config.json (optional, may be
// ""), which also gives add_bos/add_eos and the chat template. Tokens are padded with
// "[PADi]" up to c.vocab_size. Unimplemented for non-BPE models; DataLoss for malformed
// JSON; InvalidArgument for ids >= c.vocab_size.
StatusOr<GgufTokenizerData> GgufTokenizerFromHfJson(const std::string& tokenizer_json_text,
                                                    const std::string& tokenizer_config_text, const ModelConfig& c,
                                                    const std::string& gguf_pre = "");

}  // namespace attic::model
