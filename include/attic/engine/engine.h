// Engine: a loaded model with its tokenizer, thread pool, KV block pool and forward
// pass; Session: one conversation on it, whose KV persists across turns so a new turn
// prefills only the tokens its prompt does not share with what is already cached.
//
// Thread-safety: an Engine and its Sessions are driven from one thread at a time (the
// server's step loop, or the CLI).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attic/backend/kernels.h"
#include "attic/backend/thread_pool.h"
#include "attic/core/status.h"
#include "attic/engine/sampler.h"
#include "attic/engine/transformer.h"
#include "attic/kv/block_pool.h"
#include "attic/model/model.h"
#include "attic/tokenizer/chat_template.h"
#include "attic/tokenizer/tokenizer.h"

namespace attic::engine {

struct EngineOptions {
  std::string model_path;
  int n_threads = 0;            // 0 = every online CPU
  int context_length = 0;       // 0 = the model's max_position_embeddings
  int max_batch_tokens = 512;   // tokens per forward step (prefill chunk size)
  int kv_block_size = kv::kDefaultBlockSize;  // tokens per KV block
  int64_t kv_cache_bytes = 0;   // compute-buffer KV budget; 0 = automatic (below)
  // Automatic budget: room for this many full contexts, at most kv_cache_auto_cap_bytes
  // (0 = no cap), never less than one context (`attic serve`: --max-running, --kv-budget-cap).
  int kv_cache_contexts = 1;
  int64_t kv_cache_auto_cap_bytes = 0;
  DType kv_dtype = DType::kF32; // compute-buffer KV elements: kF32, kF16 (half the bytes) or kQ8_0
  // K's and V's own types, when they differ from kv_dtype (--kv-dtype-k / --kv-dtype-v).
  std::optional<DType> kv_dtype_k, kv_dtype_v;
  std::string chat_template;    // "" = detect from the model; else chatml|llama3|llama2
  // The family chats use when the model has no template Attic recognises and none is
  // named ("" = none: RenderChat then fails, naming --chat-template). serve, chat and
  // generate --chat all pass "chatml".
  std::string chat_template_fallback;
  bool show_progress = false;   // progress bar on stderr while loading
  // Every sequence's output independent of what shares its steps (Transformer's
  // row_invariant): seeded sampling reproducible under any load; slower.
  bool deterministic = false;
  // A second copy of the bf16 matrices in the prefill GEMM's packed layout
  // (backend::PrepackWeights) when it takes at most this many bytes; -1 = an eighth of
  // physical memory, 0 = never.
  int64_t prepack_max_bytes = -1;
  // Time the Linear kernels on this model and CPU at load and use the fastest
  // (backend::CalibrateLinear, ~0.1-0.5 s); the CLI sets it. Off in deterministic mode,
  // so that a run's bits do not depend on a timing. Off: the ISA's fixed choices.
  bool calibrate_kernels = false;
  // Where calibrations are kept, one file per CPU model, ISA, thread count and matrix
  // shapes (backend::LinearCalibrationKey): a later load of the same shapes installs the
  // stored choice instead of timing again, so that runs on one machine compute alike.
  // "" = measure every time, keep nothing. recalibrate: measure and replace the file.
  std::string kernel_cache_dir;
  bool recalibrate_kernels = false;
};

// InvalidArgument unless the compute buffer can hold KV of `dtype` for heads of
// `head_dim` values: f32, f16, or q8_0 with head_dim below 32 or a multiple of 32.
Status CheckKvDtype(DType dtype, int head_dim);

class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Load(const EngineOptions& options);

  const model::Model& model() const { return *model_; }
  // Bytes of the weights' packed copies for the CPU kernels (backend::PrepackWeights):
  // resident memory beside model().weight_bytes().
  uint64_t packed_weight_bytes() const { return packed_weight_bytes_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  Transformer& transformer() { return *transformer_; }
  kv::BlockPool& kv_pool() { return *kv_pool_; }
  backend::ThreadPool& threads() { return *threads_; }
  int context_length() const { return context_length_; }
  const EngineOptions& options() const { return options_; }
  // What calibrate_kernels chose, or nullptr (not calibrated: the ISA's fixed choices).
  const backend::LinearCalibration* kernel_calibration() const {
    return calibration_ ? &*calibration_ : nullptr;
  }
  // Replaces the KV pool with the largest one within `bytes` (at least one block).
  // REQUIRES: no SequenceKv holds blocks of the current pool (call before any Session).
  void ResizeKvCache(int64_t bytes);
  // Replaces the KV pool with one of as many blocks whose elements are `dtype` (what
  // `attic eval perplexity --kv-dtypes` compares on one loaded model). InvalidArgument
  // (the pool unchanged) for a type the compute buffer cannot hold (CheckKvDtype).
  // REQUIRES: no SequenceKv holds blocks of the current pool.
  Status SetKvDtype(DType dtype) { return SetKvDtypes(dtype, dtype); }
  // The same with K's and V's own types.
  Status SetKvDtypes(DType k_dtype, DType v_dtype);

  // Token ids of `text`; InvalidArgument for invalid UTF-8.
  StatusOr<std::vector<int32_t>> Tokenize(const std::string& text, bool add_bos = true) const;
  // Renders a conversation with the model's chat template (InvalidArgument naming
  // --chat-template when the model has none Attic recognises). Without
  // add_generation_prompt the text ends after the last message (no assistant header).
  // `tools`: the request's tool definitions as JSON texts (ChatRenderOptions::tools).
  StatusOr<std::string> RenderChat(const std::vector<tokenizer::ChatMessage>& messages,
                                   bool add_generation_prompt = true,
                                   const std::vector<std::string>& tools = {}) const;
  // Token ids that end generation: EOS plus the chat family's end-of-turn tokens.
  const std::vector<int32_t>& stop_token_ids() const { return stop_ids_; }
  // The chat template family RenderChat uses (InvalidArgument naming --chat-template
  // when the model has none Attic recognises and none was named).
  const StatusOr<tokenizer::ChatTemplateKind>& chat_template_kind() const { return chat_kind_; }
  // Where chat_template_kind() came from.
  enum class ChatTemplateOrigin { kNamed, kModel, kFallback, kNone };
  ChatTemplateOrigin chat_template_origin() const { return chat_origin_; }

 private:
  Engine() = default;
  std::unique_ptr<kv::BlockPool> NewKvPool(const kv::KvShape& shape, int n_blocks) const;
  // Installs the stored calibration for this model and CPU, or measures and stores one.
  Status CalibrateKernels();

  EngineOptions options_;
  std::optional<backend::LinearCalibration> calibration_;
  uint64_t packed_weight_bytes_ = 0;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<backend::ThreadPool> threads_;
  std::unique_ptr<Transformer> transformer_;
  std::unique_ptr<kv::BlockPool> kv_pool_;
  int context_length_ = 0;
  StatusOr<tokenizer::ChatTemplateKind> chat_kind_ = InvalidArgumentError("no chat template");
  ChatTemplateOrigin chat_origin_ = ChatTemplateOrigin::kNone;
  std::vector<int32_t> stop_ids_;
};

struct GenerationResult {
  std::vector<int32_t> tokens;     // generated ids (a stop token is not included)
  std::string text;                // their text, cut before any stop string
  std::string finish_reason;       // "stop", "length", or "cancelled" (the callback returned false)
  int n_prompt_tokens = 0;
  int n_cached_tokens = 0;         // prompt tokens whose KV was reused
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// Called with each new piece of text (valid UTF-8); return false to cancel.
using TextCallback = std::function<bool(const std::string& piece)>;

class Session {
 public:
  explicit Session(Engine& engine);

  // Generates a continuation of `prompt` (the whole context for this turn). KV already
  // held for a common prefix of `prompt` is reused; the rest is prefilled in chunks.
  // OutOfRange if the prompt does not fit the context window. A callback that returns
  // false ends the generation ("cancelled"); the KV of what was generated stays cached.
  StatusOr<GenerationResult> Generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                                      const TextCallback& on_text = nullptr);

  // Runs the prompt through the model (reusing cached KV) and returns the last token's
  // logits, without sampling. Used by tests and benchmarks.
  StatusOr<std::vector<float>> Prefill(const std::vector<int32_t>& prompt, int* n_cached = nullptr);
  // Feeds one token and returns its logits.
  StatusOr<std::vector<float>> Step(int32_t token);

  kv::SequenceKv& kv() { return seq_; }
  // Forgets the cached KV.
  void Reset() { seq_.Release(); }

 private:
  Engine& engine_;
  kv::SequenceKv seq_;
};

}  // namespace attic::engine
