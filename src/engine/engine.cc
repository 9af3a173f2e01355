#include "attic/engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "attic/attention/kv_q4.h"
#include "attic/attention/kv_q8.h"
#include "attic/backend/kernels.h"
#include "attic/core/file.h"
#include "attic/core/log.h"
#include "attic/core/progress.h"
#include "engine/generation_stream.h"

namespace attic::engine {

namespace {

// Models whose weights stay in a CPU's caches (stories260K: 1 MB) decode at the same
// speed with any kernel, so they keep the ISA's fixed choices untimed.
constexpr uint64_t kCalibrateMinWeightBytes = 32ull << 20;

}  // namespace

Status Engine::CalibrateKernels() {
  std::string path;
  if (!options_.kernel_cache_dir.empty()) {
    path = JoinPath(options_.kernel_cache_dir,
                    "kernels-" + backend::LinearCalibrationKey(LinearsOf(*model_), *threads_) + ".txt");
    if (!options_.recalibrate_kernels) {
      if (auto text = ReadFileToString(path); text.ok()) {
        auto cal = backend::LinearCalibration::Parse(*text);
        if (cal.ok() && backend::InstallLinearCalibration(*cal, LinearsOf(*model_)).ok()) {
          calibration_ = std::move(*cal);
          calibration_->cached = true;
          return OkStatus();
        }
        Log(LogLevel::kWarn, "kernel calibration %s is not usable here; measuring again", path.c_str());
      }
    }
  }
  auto cal = backend::CalibrateLinear(LinearsOf(*model_), *threads_);
  if (!cal.ok()) return cal.status();
  calibration_ = std::move(*cal);
  if (!path.empty()) {
    Status st = MakeDirectories(options_.kernel_cache_dir);
    if (st.ok()) st = WriteFileAtomic(path, calibration_->Serialize());
    if (!st.ok()) Log(LogLevel::kWarn, "cannot keep the kernel calibration (%s)", st.ToString().c_str());
  }
  return OkStatus();
}

Status CheckKvDtype(DType dtype, int head_dim) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kQ8_0 && dtype != DType::kQ4_0)
    return InvalidArgumentError(std::string("the KV cache holds f32, f16, q8_0 or q4_0, not ") + DTypeName(dtype));
  if (dtype == DType::kQ8_0 && !attention::KvQ8Supports(head_dim)) {
    return InvalidArgumentError("q8_0 KV needs head_dim below 32 or a multiple of 32; this model's is " +
                                std::to_string(head_dim));
  }
  if (dtype == DType::kQ4_0 && !attention::KvQ4Supports(head_dim)) {
    return InvalidArgumentError("q4_0 KV needs an even head_dim below 32 or a multiple of 32; this model's is " +
                                std::to_string(head_dim));
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Engine>> Engine::Load(const EngineOptions& options) {
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  model::LoadOptions lo;
  ProgressReporter loading("loading model");
  if (options.show_progress) lo.progress = loading.Callback();
  ATTIC_ASSIGN_OR_RETURN(e->model_, model::Model::Load(options.model_path, lo));
  loading.Finish();
  const model::Model& m = *e->model_;
  if (m.gguf_tokenizer() != nullptr) {
    ATTIC_ASSIGN_OR_RETURN(e->tokenizer_, tokenizer::Tokenizer::FromGguf(*m.gguf_tokenizer()));
  } else {
    ATTIC_ASSIGN_OR_RETURN(e->tokenizer_, tokenizer::Tokenizer::FromDirectory(m.path()));
  }
  if (e->tokenizer_->vocab_size() > m.config().vocab_size) {
    return InvalidArgumentError("tokenizer has " + std::to_string(e->tokenizer_->vocab_size()) +
                                " tokens but the model's vocabulary is " + std::to_string(m.config().vocab_size));
  }
  const auto& cfg = m.config();
  e->context_length_ = options.context_length > 0 ? options.context_length : cfg.max_position_embeddings;
  if (e->context_length_ <= 0) return InvalidArgumentError("context length must be positive");
  // Like llama.cpp: allowed, with a warning (RoPE positions past the trained length are
  // ones the model never saw; quality may fall off there).
  if (cfg.max_position_embeddings > 0 && e->context_length_ > cfg.max_position_embeddings) {
    Log(LogLevel::kWarn,
        "context window of %d tokens exceeds the model's trained length of %d (max_position_embeddings): output "
        "past %d tokens may be poor",
        e->context_length_, cfg.max_position_embeddings, cfg.max_position_embeddings);
  }
  // Sliding-window models (Mistral) are exact as long as no token attends further back
  // than the window, so the context is capped at the window rather than approximated.
  if (cfg.sliding_window > 0 && e->context_length_ > cfg.sliding_window) {
    std::fprintf(stderr, "attic: context length capped at the model's sliding window of %d tokens\n",
                 cfg.sliding_window);
    e->context_length_ = cfg.sliding_window;
  }
  if (options.max_batch_tokens <= 0) return InvalidArgumentError("max_batch_tokens must be positive");
  if (options.kv_block_size <= 0) return InvalidArgumentError("kv_block_size must be positive");
  const DType kv_k = options.kv_dtype_k.value_or(options.kv_dtype);
  const DType kv_v = options.kv_dtype_v.value_or(options.kv_dtype);
  ATTIC_RETURN_IF_ERROR(CheckKvDtype(kv_k, cfg.head_dim).WithContext("K"));
  ATTIC_RETURN_IF_ERROR(CheckKvDtype(kv_v, cfg.head_dim).WithContext("V"));
  e->threads_ = std::make_unique<backend::ThreadPool>(options.n_threads);
  const int64_t prepack_max = options.prepack_max_bytes >= 0
                                  ? options.prepack_max_bytes
                                  : static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / 8;
  const backend::ModelLinears linears = LinearsOf(*e->model_);
  const uint64_t packed = backend::PrepackWeights(linears, *e->threads_, static_cast<uint64_t>(prepack_max));
  e->packed_weight_bytes_ = packed;
  if (packed > 0 && options.show_progress)
    std::fprintf(stderr, "attic: weight matrices packed for the CPU kernels (%.0f MiB)\n", packed / 1048576.0);
  // Block-quantized models keep the fixed table too (backend::CalibrationWorthTiming).
  if (options.calibrate_kernels && !options.deterministic &&
      e->model_->weight_bytes() >= kCalibrateMinWeightBytes && backend::CalibrationWorthTiming(linears)) {
    if (Status st = e->CalibrateKernels(); !st.ok()) return st;
    if (options.show_progress) std::fprintf(stderr, "attic: kernels: %s\n", e->calibration_->Summary().c_str());
  }
  e->transformer_ = std::make_unique<Transformer>(m, *e->threads_, options.max_batch_tokens, options.deterministic);
  kv::KvShape shape = e->transformer_->kv_shape(options.kv_block_size);
  shape.k_dtype = kv_k;
  shape.v_dtype = kv_v;
  int n_blocks = (e->context_length_ + options.kv_block_size - 1) / options.kv_block_size + 1;  // one context
  if (options.kv_cache_bytes > 0) {
    n_blocks = kv::BlockPool::BlocksForBudget(shape, options.kv_cache_bytes);
  } else if (options.kv_cache_contexts > 1 || options.kv_cache_auto_cap_bytes > 0) {
    const int64_t per_token = shape.block_bytes() / shape.block_size;
    const int64_t one_context = (static_cast<int64_t>(e->context_length_) + shape.block_size) * per_token;
    int64_t want = one_context * std::max(1, options.kv_cache_contexts);
    if (options.kv_cache_auto_cap_bytes > 0) want = std::min(want, options.kv_cache_auto_cap_bytes);
    // At least one context's blocks (n_blocks already): its bytes would map a block
    // short where the buffers end in partly used pages (q8_0, q4_0).
    n_blocks = std::max(n_blocks, kv::BlockPool::BlocksForBudget(shape, want));
  }
  e->kv_pool_ = e->NewKvPool(shape, n_blocks);

  // Chat template: the flag wins, else detect from the model, else the fallback.
  if (!options.chat_template.empty()) {
    e->chat_kind_ = tokenizer::ParseChatTemplateKind(options.chat_template);
    if (!e->chat_kind_.ok()) return e->chat_kind_.status();
    e->chat_origin_ = ChatTemplateOrigin::kNamed;
  } else {
    std::string text = m.chat_template().empty() ? e->tokenizer_->chat_template() : m.chat_template();
    e->chat_kind_ = tokenizer::DetectChatTemplate(text);
    if (e->chat_kind_.ok()) {
      e->chat_origin_ = ChatTemplateOrigin::kModel;
    } else if (!options.chat_template_fallback.empty()) {
      e->chat_kind_ = tokenizer::ParseChatTemplateKind(options.chat_template_fallback);
      if (!e->chat_kind_.ok()) return e->chat_kind_.status();
      e->chat_origin_ = ChatTemplateOrigin::kFallback;
    }
  }
  // Stop tokens.
  for (int id : cfg.eos_token_ids) e->stop_ids_.push_back(id);
  if (e->tokenizer_->eos_id() >= 0) e->stop_ids_.push_back(e->tokenizer_->eos_id());
  if (e->chat_kind_.ok()) {
    for (const auto& s : tokenizer::ChatStopTokens(*e->chat_kind_)) {
      int32_t id = e->tokenizer_->TokenId(s);
      if (id >= 0) e->stop_ids_.push_back(id);
    }
  }
  std::sort(e->stop_ids_.begin(), e->stop_ids_.end());
  e->stop_ids_.erase(std::unique(e->stop_ids_.begin(), e->stop_ids_.end()), e->stop_ids_.end());
  return e;
}

std::unique_ptr<kv::BlockPool> Engine::NewKvPool(const kv::KvShape& shape, int n_blocks) const {
  // Zeroing a pool of gigabytes faults in every page (seconds on some machines): on the
  // compute threads, with a progress bar on a terminal.
  constexpr int64_t kShowBytes = 256 << 20;
  const bool show = options_.show_progress && static_cast<int64_t>(n_blocks) * shape.block_bytes() >= kShowBytes;
  ProgressReporter progress("allocating KV cache");
  auto pool = std::make_unique<kv::BlockPool>(shape, n_blocks, threads_.get(),
                                              show ? progress.Callback() : nullptr);
  progress.Finish();
  return pool;
}

Status Engine::SetKvDtypes(DType k_dtype, DType v_dtype) {
  ATTIC_CHECK(kv_pool_->n_used() == 0);
  ATTIC_RETURN_IF_ERROR(CheckKvDtype(k_dtype, model_->config().head_dim));
  ATTIC_RETURN_IF_ERROR(CheckKvDtype(v_dtype, model_->config().head_dim));
  if (k_dtype == kv_pool_->shape().k_dtype && v_dtype == kv_pool_->shape().v_dtype) return OkStatus();
  kv::KvShape shape = kv_pool_->shape();
  shape.k_dtype = k_dtype;
  shape.v_dtype = v_dtype;
  const int n_blocks = kv_pool_->n_blocks();
  kv_pool_.reset();  // free the old pool before allocating the new one
  kv_pool_ = NewKvPool(shape, n_blocks);
  // options() in one form: kv_dtype is K's type, kv_dtype_v set only when V's differs
  // (so a copy whose kv_dtype is changed loads that type, as before the split).
  options_.kv_dtype = k_dtype;
  options_.kv_dtype_k.reset();
  if (v_dtype == k_dtype) {
    options_.kv_dtype_v.reset();
  } else {
    options_.kv_dtype_v = v_dtype;
  }
  return OkStatus();
}

void Engine::ResizeKvCache(int64_t bytes) {
  ATTIC_CHECK(kv_pool_->n_used() == 0);
  kv::KvShape shape = kv_pool_->shape();
  kv_pool_.reset();  // free the old pool before allocating the new one
  kv_pool_ = NewKvPool(shape, kv::BlockPool::BlocksForBudget(shape, bytes));
  options_.kv_cache_bytes = bytes;
}

StatusOr<std::vector<int32_t>> Engine::Tokenize(const std::string& text, bool add_bos) const {
  tokenizer::EncodeOptions eo;
  eo.add_bos = add_bos;
  return tokenizer_->Encode(text, eo);
}

StatusOr<std::string> Engine::RenderChat(const std::vector<tokenizer::ChatMessage>& messages,
                                         bool add_generation_prompt, const std::vector<std::string>& tools) const {
  if (!chat_kind_.ok()) return chat_kind_.status();
  tokenizer::ChatRenderOptions ro;
  ro.add_generation_prompt = add_generation_prompt;
  ro.tools = tools;
  if (tokenizer_->bos_id() >= 0) ro.bos_token = tokenizer_->TokenText(tokenizer_->bos_id());
  if (tokenizer_->eos_id() >= 0) ro.eos_token = tokenizer_->TokenText(tokenizer_->eos_id());
  std::string tmpl = model_->chat_template().empty() ? tokenizer_->chat_template() : model_->chat_template();
  ro.default_system_prompt = tokenizer::DefaultSystemPrompt(tmpl);
  return tokenizer::RenderChat(*chat_kind_, messages, ro);
}

Session::Session(Engine& engine) : engine_(engine), seq_(&engine.kv_pool()) {}

StatusOr<std::vector<float>> Session::Prefill(const std::vector<int32_t>& prompt, int* n_cached) {
  if (prompt.empty()) return InvalidArgumentError("prompt is empty");
  if (static_cast<int>(prompt.size()) > engine_.context_length()) {
    return OutOfRangeError("prompt of " + std::to_string(prompt.size()) + " tokens exceeds the context window of " +
                           std::to_string(engine_.context_length()) + " tokens");
  }
  // Longest common prefix with what is cached; at least the last prompt token is run so
  // that its logits exist.
  const auto& have = seq_.tokens();
  size_t lcp = 0;
  while (lcp < have.size() && lcp < prompt.size() && have[lcp] == prompt[lcp]) ++lcp;
  if (lcp == prompt.size()) --lcp;
  seq_.Truncate(static_cast<int>(lcp));
  if (n_cached) *n_cached = static_cast<int>(lcp);
  Transformer& tf = engine_.transformer();
  std::vector<float> logits;
  size_t pos = lcp;
  while (pos < prompt.size()) {
    size_t n = std::min<size_t>(prompt.size() - pos, tf.max_batch_tokens());
    std::vector<BatchEntry> batch(1);
    batch[0].seq = &seq_;
    batch[0].tokens.assign(prompt.begin() + pos, prompt.begin() + pos + n);
    batch[0].want_logits = pos + n == prompt.size();
    Status st = tf.Forward(batch, &logits);
    if (!st.ok()) {
      seq_.Truncate(static_cast<int>(lcp));
      return st;
    }
    pos += n;
  }
  return logits;
}

StatusOr<std::vector<float>> Session::Step(int32_t token) {
  if (seq_.n_slots() >= engine_.context_length()) {
    return OutOfRangeError("context window of " + std::to_string(engine_.context_length()) + " tokens is full");
  }
  std::vector<BatchEntry> batch(1);
  batch[0].seq = &seq_;
  batch[0].tokens = {token};
  std::vector<float> logits;
  ATTIC_RETURN_IF_ERROR(engine_.transformer().Forward(batch, &logits));
  return logits;
}

StatusOr<GenerationResult> Session::Generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                                             const TextCallback& on_text) {
  ATTIC_RETURN_IF_ERROR(params.Validate());
  using Clock = std::chrono::steady_clock;
  GenerationResult r;
  r.n_prompt_tokens = static_cast<int>(prompt.size());
  auto t0 = Clock::now();
  ATTIC_ASSIGN_OR_RETURN(std::vector<float> logits, Prefill(prompt, &r.n_cached_tokens));
  auto t1 = Clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  Sampler sampler(params);
  std::vector<int32_t> stops = engine_.stop_token_ids();
  stops.insert(stops.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
  GenerationStream stream(engine_.tokenizer(), std::move(stops), params.stop_strings);
  const int vocab = engine_.model().config().vocab_size;
  r.finish_reason = "length";
  bool cancelled = false;
  for (int i = 0; i < params.max_tokens; ++i) {
    int32_t tok = sampler.Sample(logits.data(), vocab);
    const GenerationStream::Step step = stream.Push(tok);
    if (step != GenerationStream::Step::kStopToken) r.tokens.push_back(tok);  // a stop token is not part of it
    if (step != GenerationStream::Step::kContinue) {
      r.finish_reason = "stop";
      break;
    }
    const std::string piece = stream.TakeReady();
    if (on_text && !piece.empty() && !on_text(piece)) {
      cancelled = true;
      break;
    }
    if (i + 1 == params.max_tokens) break;
    if (seq_.n_slots() >= engine_.context_length()) break;  // window full: "length"
    ATTIC_ASSIGN_OR_RETURN(logits, Step(tok));
  }
  if (!cancelled) {
    const std::string rest = stream.TakeRest(/*flush=*/r.finish_reason == "length");
    if (on_text && !rest.empty()) on_text(rest);
  }
  r.text = stream.text();
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  if (cancelled) r.finish_reason = "cancelled";
  return r;
}

}  // namespace attic::engine
