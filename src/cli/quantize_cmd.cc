// `attic quantize IN.gguf OUT.gguf TYPE`: Attic's own quantizer (attic/model/gguf_quantize.h).
#include "attic/core/file.h"
#include "attic/core/progress.h"
#include "attic/model/gguf_quantize.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {

struct QuantizeFlags {
  std::string in, out, type;
};

int RunQuantize(const QuantizeFlags& f) {
  auto preset = model::ParseQuantPreset(f.type);
  if (!preset.ok()) return UsageError(preset.status().message());
  if (!FileExists(f.in)) return Fail(NotFoundError("'" + f.in + "' does not exist"));
  if (Status st = PrepareOutput(f.out, "OUT"); !st.ok()) return Fail(st);
  ProgressReporter progress("quantizing to " + preset->name);
  Status st = model::QuantizeGgufFile(f.in, f.out, *preset, progress.Callback());
  progress.Finish();
  if (!st.ok()) return Fail(st);
  std::fprintf(stderr, "wrote %s (%s)\n", f.out.c_str(), preset->name.c_str());
  return kExitOk;
}

}  // namespace

void AddQuantizeCommand(CLI::App& app, RunFn* run) {
  auto* cmd = app.add_subcommand("quantize", "rewrite a GGUF model with its matrices in block types (llama.cpp's presets)");
  auto f = std::make_shared<QuantizeFlags>();
  cmd->add_option("IN", f->in, "GGUF file to read (any type Attic loads)")->required();
  cmd->add_option("OUT", f->out, "GGUF file to write")->required();
  cmd->add_option("TYPE", f->type, "q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q6_k, or q4_k_m")->required();
  cmd->callback([run, f] { *run = [f] { return RunQuantize(*f); }; });
}

}  // namespace attic::cli
