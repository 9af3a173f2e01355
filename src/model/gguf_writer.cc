// GGUF header assembly and WriteGgufModel / WriteRandomGgufModel: a llama-architecture
// GGUF v3 file with the keys llama.cpp's loader reads (see shared/tools/llamacpp-anchor/
// make_gguf.py), q/k rows permuted to GGUF's interleaved RoPE order.
#include "model/gguf_writer.h"

#include "attic/core/file.h"
#include "model/weight_source.h"

namespace attic::model {

void AppendGgufString(std::string* out, const std::string& s) {
  AppendPod(out, static_cast<uint64_t>(s.size()));
  out->append(s);
}

void GgufHeaderBuilder::Key(const std::string& key, GgufType type) {
  AppendGgufString(&kv_, key);
  AppendPod(&kv_, static_cast<uint32_t>(type));
  ++n_kv_;
}

void GgufHeaderBuilder::Str(const std::string& key, const std::string& v) {
  Key(key, GgufType::kString);
  AppendGgufString(&kv_, v);
}
void GgufHeaderBuilder::U32(const std::string& key, uint32_t v) {
  Key(key, GgufType::kU32);
  AppendPod(&kv_, v);
}
void GgufHeaderBuilder::I32(const std::string& key, int32_t v) {
  Key(key, GgufType::kI32);
  AppendPod(&kv_, v);
}
void GgufHeaderBuilder::F32(const std::string& key, float v) {
  Key(key, GgufType::kF32);
  AppendPod(&kv_, v);
}
void GgufHeaderBuilder::Bool(const std::string& key, bool v) {
  Key(key, GgufType::kBool);
  AppendPod(&kv_, static_cast<uint8_t>(v ? 1 : 0));
}
void GgufHeaderBuilder::StrArray(const std::string& key, const std::vector<std::string>& v) {
  Key(key, GgufType::kArray);
  AppendPod(&kv_, static_cast<uint32_t>(GgufType::kString));
  AppendPod(&kv_, static_cast<uint64_t>(v.size()));
  for (const std::string& s : v) AppendGgufString(&kv_, s);
}
void GgufHeaderBuilder::I32Array(const std::string& key, const std::vector<int32_t>& v) {
  Key(key, GgufType::kArray);
  AppendPod(&kv_, static_cast<uint32_t>(GgufType::kI32));
  AppendPod(&kv_, static_cast<uint64_t>(v.size()));
  kv_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
}
void GgufHeaderBuilder::F32Array(const std::string& key, const std::vector<float>& v) {
  Key(key, GgufType::kArray);
  AppendPod(&kv_, static_cast<uint32_t>(GgufType::kF32));
  AppendPod(&kv_, static_cast<uint64_t>(v.size()));
  kv_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

void GgufHeaderBuilder::Tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t ggml_type,
                               uint64_t nbytes) {
  AppendGgufString(&infos_, name);
  AppendPod(&infos_, static_cast<uint32_t>(ne.size()));
  for (uint64_t d : ne) AppendPod(&infos_, d);
  AppendPod(&infos_, ggml_type);
  AppendPod(&infos_, next_offset_);
  next_offset_ += nbytes + Padding(nbytes, alignment_);
  ++n_tensors_;
}

std::string GgufHeaderBuilder::Build() const {
  std::string out = "GGUF";
  AppendPod(&out, static_cast<uint32_t>(3));
  AppendPod(&out, n_tensors_);
  AppendPod(&out, n_kv_);
  out += kv_;
  out += infos_;
  out.append(Padding(out.size(), alignment_), '\0');
  return out;
}

namespace {

constexpr uint64_t kAlignment = 32;

uint32_t GgmlType(DType d) { return GgmlTypeOf(d); }

void AddModelKeys(const ModelConfig& c, const WriteOptions& opts, GgufHeaderBuilder* h) {
  h->Str("general.architecture", "llama");
  h->Str("general.type", "model");
  h->Str("general.name", opts.name);
  // llama_ftype: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7, MOSTLY_BF16 32.
  const uint32_t ftype = opts.file_type != UINT32_MAX ? opts.file_type
                         : opts.dtype == DType::kF16    ? 1
                         : opts.dtype == DType::kQ8_0 ? 7
                         : opts.dtype == DType::kBF16 ? 32
                                                      : 0;
  h->U32("general.file_type", ftype);
  h->U32("general.alignment", static_cast<uint32_t>(kAlignment));
  h->U32("llama.vocab_size", static_cast<uint32_t>(c.vocab_size));
  h->U32("llama.context_length", static_cast<uint32_t>(c.max_position_embeddings));
  h->U32("llama.embedding_length", static_cast<uint32_t>(c.hidden_size));
  h->U32("llama.block_count", static_cast<uint32_t>(c.n_layers));
  h->U32("llama.feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  h->U32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  h->U32("llama.attention.head_count", static_cast<uint32_t>(c.n_heads));
  h->U32("llama.attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
  if (c.head_dim * c.n_heads != c.hidden_size) {
    h->U32("llama.attention.key_length", static_cast<uint32_t>(c.head_dim));
    h->U32("llama.attention.value_length", static_cast<uint32_t>(c.head_dim));
  }
  h->F32("llama.rope.freq_base", c.rope_theta);
  h->F32("llama.attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  const RopeScaling& r = c.rope_scaling;
  if (r.type == RopeScalingType::kLinear) {
    h->Str("llama.rope.scaling.type", "linear");
    h->F32("llama.rope.scaling.factor", r.factor);
  } else if (r.type == RopeScalingType::kLlama3) {
    // llama.cpp reads the rope_freqs.weight tensor; these keys make Attic's reading exact.
    h->F32("attic.rope_scaling.factor", r.factor);
    h->F32("attic.rope_scaling.low_freq_factor", r.low_freq_factor);
    h->F32("attic.rope_scaling.high_freq_factor", r.high_freq_factor);
    h->U32("attic.rope_scaling.original_max_position_embeddings",
           static_cast<uint32_t>(r.original_max_position_embeddings));
  }
}

Status AddTokenizerKeys(const ModelConfig& c, const TokenizerSource& src, GgufHeaderBuilder* h) {
  if (src.tokenizer_json_path.empty()) return OkStatus();
  ATTIC_ASSIGN_OR_RETURN(std::string tj, ReadFileToString(src.tokenizer_json_path));
  std::string tc;
  if (!src.tokenizer_config_json_path.empty()) {
    ATTIC_ASSIGN_OR_RETURN(tc, ReadFileToString(src.tokenizer_config_json_path));
  }
  auto data = GgufTokenizerFromHfJson(tj, tc, c, src.gguf_pre);
  if (!data.ok()) return data.status().WithContext(src.tokenizer_json_path);
  const GgufTokenizerData& t = *data;
  h->Str("tokenizer.ggml.model", t.model);
  h->Str("tokenizer.ggml.pre", t.pre);
  h->StrArray("tokenizer.ggml.tokens", t.tokens);
  if (!t.scores.empty()) h->F32Array("tokenizer.ggml.scores", t.scores);
  h->I32Array("tokenizer.ggml.token_type", t.token_types);
  if (!t.merges.empty()) h->StrArray("tokenizer.ggml.merges", t.merges);
  if (t.bos_id >= 0) h->U32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(t.bos_id));
  if (t.eos_id >= 0) h->U32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(t.eos_id));
  if (t.unk_id >= 0) h->U32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(t.unk_id));
  if (t.pad_id >= 0) h->U32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(t.pad_id));
  h->Bool("tokenizer.ggml.add_bos_token", t.add_bos);
  h->Bool("tokenizer.ggml.add_eos_token", t.add_eos);
  if (t.model == "llama") h->Bool("tokenizer.ggml.add_space_prefix", t.add_space_prefix);
  const std::string& tmpl = !src.chat_template.empty() ? src.chat_template : t.chat_template;
  if (!tmpl.empty()) h->Str("tokenizer.chat_template", tmpl);
  return OkStatus();
}

Status WriteGguf(const std::string& path, const ModelConfig& c, std::vector<TensorJob> jobs, const WriteOptions& opts) {
  ATTIC_RETURN_IF_ERROR(c.Validate());
  if (c.attention_bias) return UnimplementedError("GGUF llama architecture cannot hold q/k/v biases (Qwen2)");
  if (c.sliding_window > 0) return UnimplementedError("GGUF llama architecture cannot express a sliding window");

  GgufHeaderBuilder h(kAlignment);
  AddModelKeys(c, opts, &h);
  ATTIC_RETURN_IF_ERROR(AddTokenizerKeys(c, opts.tokenizer, &h));

  std::vector<std::string> gguf_names;
  for (const TensorJob& j : jobs) {
    std::string g = HfToGgufName(j.spec.name);
    if (g.empty()) return InvalidArgumentError("tensor '" + j.spec.name + "' has no GGUF name");
    gguf_names.push_back(std::move(g));
  }
  if (c.rope_scaling.type == RopeScalingType::kLlama3) {
    // Per-frequency factors as llama.cpp's converter writes them: base / scaled frequency.
    ModelConfig plain = c;
    plain.rope_scaling = RopeScaling();
    std::vector<float> base = RopeInvFrequencies(plain), scaled = RopeInvFrequencies(c);
    auto factors = std::make_shared<std::vector<float>>(base.size());
    for (size_t i = 0; i < base.size(); ++i) (*factors)[i] = base[i] / scaled[i];
    TensorJob j;
    j.spec = {"rope_freqs.weight", {static_cast<int64_t>(factors->size())}, TensorKind::kNorm, -1};
    j.produce = [factors](int64_t, int64_t, float* out) { std::copy(factors->begin(), factors->end(), out); };
    jobs.push_back(std::move(j));
    gguf_names.push_back("rope_freqs.weight");
  }

  std::vector<DType> dtypes;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const TensorJob& j = jobs[i];
    DType d = j.spec.kind != TensorKind::kMatrix ? DType::kF32
              : opts.matrix_dtype                ? opts.matrix_dtype(j.spec)
                                                 : opts.dtype;
    dtypes.push_back(d);
    std::vector<uint64_t> ne(j.spec.shape.rbegin(), j.spec.shape.rend());
    h.Tensor(gguf_names[i], ne, GgmlType(d), DTypeBytes(d, static_cast<size_t>(j.spec.numel())));
  }
  const std::string header = h.Build();
  WriteProgress progress{opts.progress, 0, h.data_bytes()};
  ATTIC_ASSIGN_OR_RETURN(auto sink, FileSink::Create(path));
  ATTIC_RETURN_IF_ERROR(sink->Write(header.data(), header.size()));
  static const char kZeros[kAlignment] = {};
  StreamBuffers buffers;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const int permute = IsRopePermuted(jobs[i].spec.name) ? c.head_dim : 0;
    const uint64_t before = sink->written();
    ATTIC_RETURN_IF_ERROR(StreamTensor(jobs[i], dtypes[i], permute, sink.get(), &progress, &buffers));
    const uint64_t pad = GgufHeaderBuilder::Padding(sink->written() - before, kAlignment);
    ATTIC_RETURN_IF_ERROR(sink->Write(kZeros, pad));
    progress.Add(pad);
  }
  return sink->Commit(opts.fsync);
}

}  // namespace

Status WriteGgufModel(const std::string& path, const ModelConfig& c, const std::vector<NamedTensor>& tensors,
                      const WriteOptions& opts) {
  ATTIC_ASSIGN_OR_RETURN(std::vector<TensorJob> jobs, ExplicitJobs(tensors));
  return WriteGguf(path, c, std::move(jobs), opts);
}

Status WriteRandomGgufModel(const std::string& path, const ModelConfig& c, const RandomWeights& r,
                            const WriteOptions& opts) {
  ATTIC_RETURN_IF_ERROR(c.Validate());
  return WriteGguf(path, c, RandomJobs(c, r), opts);
}

}  // namespace attic::model
