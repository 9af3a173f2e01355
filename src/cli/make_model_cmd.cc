// `attic make-model`: writes a random-weight checkpoint of a real model's shape, as a
// Hugging Face directory and/or a GGUF file holding the same weights, with a real
// tokenizer. Benchmarks use these (no trained model of that size exists on the machine).
#include <cstdio>

#include "attic/core/file.h"
#include "attic/core/progress.h"
#include "attic/model/quant_preset.h"
#include "attic/model/writer.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {

struct MakeModelFlags {
  std::string config;
  std::string shape;
  std::string tokenizer_dir;
  std::string dtype = "bf16";
  uint64_t seed = 1234;
  std::string out_hf;
  std::string out_gguf;
  uint64_t shard_size = 0;
};

// Built-in shapes (config.json fields) for benchmarks.
StatusOr<model::ModelConfig> ShapeConfig(const std::string& shape) {
  model::ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 49152;
  c.max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-5f;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.tie_word_embeddings = true;
  if (shape == "smollm2-135m") {
    c.hidden_size = 576, c.intermediate_size = 1536, c.n_layers = 30, c.n_heads = 9, c.n_kv_heads = 3;
    c.rope_theta = 100000.0f;
  } else if (shape == "llama-1b") {
    c.hidden_size = 2048, c.intermediate_size = 8192, c.n_layers = 16, c.n_heads = 32, c.n_kv_heads = 8;
    c.rope_theta = 500000.0f;
  } else {
    return InvalidArgumentError("unknown --shape '" + shape + "' (expected smollm2-135m or llama-1b)");
  }
  c.head_dim = c.hidden_size / c.n_heads;
  return c;
}

int RunMakeModel(const MakeModelFlags& f) {
  if (f.out_hf.empty() && f.out_gguf.empty()) {
    return UsageError("give --out-hf DIR and/or --out-gguf FILE");
  }
  model::ModelConfig c;
  if (!f.config.empty()) {
    auto text = ReadFileToString(f.config);
    if (!text.ok()) return Fail(text.status());
    auto parsed = model::ParseHfConfig(*text);
    if (!parsed.ok()) return Fail(parsed.status().WithContext(f.config));
    c = *parsed;
  } else {
    auto sc = ShapeConfig(f.shape.empty() ? "smollm2-135m" : f.shape);
    if (!sc.ok()) return Fail(sc.status());
    c = *sc;
  }
  model::WriteOptions wo;
  if (model::IsQuantPresetName(f.dtype)) {  // GGUF only: matrices quantized as the preset says
    if (!f.out_hf.empty()) return Fail(InvalidArgumentError("--dtype " + f.dtype + " is written as GGUF only (--out-gguf)"));
    auto preset = model::ParseQuantPreset(f.dtype);
    c.torch_dtype = DType::kF32;
    wo.dtype = DType::kF32;
    wo.file_type = preset->file_type;
    wo.matrix_dtype = [p = *preset, c](const model::TensorSpec& s) { return model::PresetMatrixType(p, s, c); };
  } else {
    auto dt = ParseDType(f.dtype);
    if (!dt.ok() || DTypeIsBlock(*dt)) {
      return Fail(InvalidArgumentError("--dtype '" + f.dtype +
                                       "': expected f32, f16, bf16, or for GGUF q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, "
                                       "q6_k, q4_k_m"));
    }
    c.torch_dtype = *dt;
    wo.dtype = *dt;
  }
  wo.max_shard_bytes = f.shard_size;
  if (!f.tokenizer_dir.empty()) {
    wo.tokenizer.tokenizer_json_path = JoinPath(f.tokenizer_dir, "tokenizer.json");
    if (!FileExists(wo.tokenizer.tokenizer_json_path)) {
      return Fail(NotFoundError("no tokenizer.json in '" + f.tokenizer_dir + "'"));
    }
    std::string tc = JoinPath(f.tokenizer_dir, "tokenizer_config.json");
    if (FileExists(tc)) wo.tokenizer.tokenizer_config_json_path = tc;
    auto tmpl = ReadFileToString(JoinPath(f.tokenizer_dir, "chat_template.jinja"));
    if (tmpl.ok()) wo.tokenizer.chat_template = *tmpl;
  }
  // The outputs' folders are made (a fresh clone has no out/); an unwritable path fails
  // before any weight is generated.
  if (!f.out_hf.empty()) {
    if (Status st = MakeDirectories(f.out_hf); !st.ok()) return Fail(st.WithContext("--out-hf"));
  }
  if (Status st = PrepareOutput(f.out_gguf, "--out-gguf"); !st.ok()) return Fail(st);
  model::RandomWeights rw;
  rw.seed = f.seed;
  if (!f.out_hf.empty()) {
    ProgressReporter progress("writing " + f.out_hf);
    wo.progress = progress.Callback();
    Status st = model::WriteRandomHfModel(f.out_hf, c, rw, wo);
    progress.Finish();
    if (!st.ok()) return Fail(st);
    std::fprintf(stderr, "wrote %s\n", f.out_hf.c_str());
  }
  if (!f.out_gguf.empty()) {
    ProgressReporter progress("writing " + f.out_gguf);
    wo.progress = progress.Callback();
    Status st = model::WriteRandomGgufModel(f.out_gguf, c, rw, wo);
    progress.Finish();
    if (!st.ok()) return Fail(st);
    std::fprintf(stderr, "wrote %s\n", f.out_gguf.c_str());
  }
  return 0;
}

}  // namespace

void AddMakeModelCommand(CLI::App& app, RunFn* run) {
  auto* cmd = app.add_subcommand("make-model", "write a seeded random-weight checkpoint (HF dir and/or GGUF) of a given shape");
  auto f = std::make_shared<MakeModelFlags>();
  cmd->add_option("--config", f->config, "config.json giving the shape (e.g. SmolLM2-135M's)");
  cmd->add_option("--shape", f->shape, "built-in shape instead of --config: smollm2-135m, llama-1b");
  cmd->add_option("--tokenizer", f->tokenizer_dir, "directory with tokenizer.json (+ tokenizer_config.json, chat_template.jinja)");
  cmd->add_option("--dtype", f->dtype, "f32, f16, bf16; GGUF also q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q6_k, q4_k_m")->capture_default_str();
  cmd->add_option("--seed", f->seed, "RNG seed (same seed = same weights in HF and GGUF)")->capture_default_str();
  cmd->add_option("--out-hf", f->out_hf, "write a Hugging Face directory here");
  cmd->add_option("--out-gguf", f->out_gguf, "write a GGUF file here");
  AddSizeOption(cmd, "--shard-size", "--shard-mib", 1 << 20, &f->shard_size,
                "HF: shard safetensors above this size (default 0 = one file)");
  cmd->callback([run, f] { *run = [f] { return RunMakeModel(*f); }; });
}

}  // namespace attic::cli
