// attic: the command-line front end (generate, chat, serve, bench, bench serve, bench sessions, make-model, ...).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attic/backend/cpu_features.h"
#include "attic/core/byte_size.h"
#include "attic/core/file.h"
#include "attic/core/huge_pages.h"
#include "attic_version.h"
#include "cli/commands.h"

namespace attic::cli {

void AddModelFlags(CLI::App* cmd, ModelFlags* f) {
  f->model = DefaultModelPath();
  cmd->add_option("-m,--model", f->model, "HF model directory or GGUF file ($ATTIC_MODEL)")->capture_default_str();
  cmd->add_option("-t,--threads", f->threads, "compute threads (0 = all CPUs)")->capture_default_str();
  cmd->add_option("-c,--ctx", f->ctx,
                  "context window in tokens (0 = the model's trained length; longer windows are allowed with a warning)")
      ->capture_default_str();
  cmd->add_option("-b,--batch", f->batch, "tokens per forward step (prefill chunk)")->capture_default_str();
  cmd->add_option("--chat-template", f->chat_template,
                  std::string("chat template family: ") + tokenizer::kChatTemplateNames +
                      " (default: detected from the model; a model without one Attic recognises chats in chatml)");
  cmd->add_option("--kv-dtype", f->kv_dtype,
                  "element type of the compute buffer's KV cache: f32 (exact: greedy output independent of "
                  "batching), f16 (half the memory per token), q8_0 (8-bit, one f16 scale per 32 values: "
                  "~0.27x f32's memory) or q4_0 (4-bit, one f16 scale per 32 values: ~0.14x; best for V alone, "
                  "--kv-dtype-v)")
      ->check(CLI::IsMember({"f16", "f32", "q8_0", "q4_0"}))
      ->capture_default_str();
  cmd->add_option("--kv-dtype-k", f->kv_dtype_k,
                  "K's element type in the compute buffer, when it differs from --kv-dtype's (f32, f16, q8_0, q4_0)")
      ->check(CLI::IsMember({"f16", "f32", "q8_0", "q4_0"}));
  cmd->add_option("--kv-dtype-v", f->kv_dtype_v,
                  "V's element type in the compute buffer, when it differs from --kv-dtype's (f32, f16, q8_0, q4_0)")
      ->check(CLI::IsMember({"f16", "f32", "q8_0", "q4_0"}));
  cmd->add_option("--kv-block-size", f->kv_block_size,
                  "tokens per block of the compute buffer's KV cache (longer blocks: faster decode attention, "
                  "more slots reserved per sequence)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_flag("--deterministic", f->deterministic,
                "every sequence's output independent of what shares its steps (batching, prefill chunks, "
                "reuse): seeded sampling is reproducible under any load; prefill and decode run slower");
}

engine::EngineOptions ToEngineOptions(const ModelFlags& f, bool progress) {
  engine::EngineOptions o;
  o.model_path = f.model;
  o.n_threads = f.threads;
  o.context_length = f.ctx;
  o.max_batch_tokens = f.batch;
  o.chat_template = f.chat_template;
  o.chat_template_fallback = "chatml";  // one behaviour in serve, chat and generate --chat
  o.kv_dtype = *ParseDType(f.kv_dtype);  // one of f32/f16/q8_0 (checked by the flags)
  if (!f.kv_dtype_k.empty()) o.kv_dtype_k = *ParseDType(f.kv_dtype_k);
  if (!f.kv_dtype_v.empty()) o.kv_dtype_v = *ParseDType(f.kv_dtype_v);
  o.kv_block_size = f.kv_block_size;
  o.deterministic = f.deterministic;
  o.show_progress = progress;
  // The Linear kernels are timed at the first load of a model's shapes on this CPU, and
  // that choice kept in $ATTIC_CACHE_DIR (default $XDG_CACHE_HOME/attic or
  // ~/.cache/attic) for later loads. ATTIC_KERNELS=static: the ISA's fixed choices;
  // ATTIC_KERNELS=recalibrate: time them again.
  const char* kernels = std::getenv("ATTIC_KERNELS");
  const std::string mode = kernels == nullptr ? "" : kernels;
  o.calibrate_kernels = mode != "static";
  o.recalibrate_kernels = mode == "recalibrate";
  if (const char* dir = std::getenv("ATTIC_CACHE_DIR"); dir != nullptr && *dir != '\0') {
    o.kernel_cache_dir = dir;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    o.kernel_cache_dir = std::string(xdg) + "/attic";
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    o.kernel_cache_dir = std::string(home) + "/.cache/attic";
  }
  return o;
}

void PrintChatTemplate(const engine::Engine& e) {
  using Origin = engine::Engine::ChatTemplateOrigin;
  if (!e.chat_template_kind().ok()) return;
  const char* name = tokenizer::ChatTemplateKindName(*e.chat_template_kind());
  switch (e.chat_template_origin()) {
    case Origin::kNamed: std::fprintf(stderr, "attic: chat template: %s (--chat-template)\n", name); break;
    case Origin::kModel: std::fprintf(stderr, "attic: chat template: %s (from the model)\n", name); break;
    case Origin::kFallback:
      std::fprintf(stderr,
                   "attic: chat template: %s (the model has none Attic recognises; --chat-template picks another)\n",
                   name);
      break;
    case Origin::kNone: break;
  }
}

int Fail(const Status& s) {
  std::fprintf(stderr, "attic: error: %s\n", s.message().c_str());
  return kExitError;
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "attic: error: %s\n", message.c_str());
  return kExitUsage;
}

namespace {

template <typename Target>
void AddSizeOptionTo(CLI::App* cmd, const std::string& name, const std::string& old_name, uint64_t old_unit,
                     Target* target, const std::string& help) {
  auto parse = [target, name](const std::string& text, uint64_t bare_unit) {
    auto v = ParseByteSize(text, bare_unit);
    if (!v.ok()) throw CLI::ValidationError(name, v.status().message());
    *target = *v;
  };
  cmd->add_option_function<std::string>(name, [parse](const std::string& t) { parse(t, 1); }, help)
      ->type_name("SIZE");
  if (!old_name.empty()) {
    cmd->add_option_function<std::string>(
           old_name, [parse, old_unit](const std::string& t) { parse(t, old_unit); },
           "old spelling of " + name)
        ->group("");  // hidden from --help
  }
}

}  // namespace

void AddSizeOption(CLI::App* cmd, const std::string& name, const std::string& old_name, uint64_t old_unit,
                   uint64_t* target, const std::string& help) {
  AddSizeOptionTo(cmd, name, old_name, old_unit, target, help);
}

void AddSizeOption(CLI::App* cmd, const std::string& name, const std::string& old_name, uint64_t old_unit,
                   std::optional<uint64_t>* target, const std::string& help) {
  AddSizeOptionTo(cmd, name, old_name, old_unit, target, help);
}

Status PrepareOutput(const std::string& path, const char* flag) {
  if (path.empty()) return OkStatus();
  Status st = PrepareOutputFile(path);
  return st.ok() ? st : st.WithContext(flag);
}

Status WriteOutput(const std::string& path, const std::string& contents, const char* flag) {
  if (path.empty()) return OkStatus();
  Status st = PrepareOutputFile(path);
  if (st.ok()) st = WriteFileAtomic(path, contents);
  return st.ok() ? st : st.WithContext(flag);
}

namespace {

std::string VersionText() {
  const backend::Isa isa = backend::ActiveIsa();
  return std::string("attic ") + ATTIC_VERSION + " (commit " + ATTIC_GIT_COMMIT + ", CPU kernels " +
         backend::IsaName(isa) + ")";
}

// The command a command line names, as deep as it names known subcommands ("attic
// bench serve"), and the first word after it that names none (or "").
struct NamedCommand {
  const CLI::App* app = nullptr;
  std::string path = "attic";
  std::string unknown;
};
NamedCommand FindCommand(const CLI::App& app, int argc, char** argv) {
  NamedCommand c;
  c.app = &app;
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : c.app->get_subcommands([](const CLI::App*) { return true; }))
      if (sub->get_name() == argv[i]) next = sub;
    if (next == nullptr) {
      c.unknown = argv[i];
      break;
    }
    c.app = next;
    c.path += " " + next->get_name();
  }
  return c;
}

std::string SubcommandNames(const CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

}  // namespace

}  // namespace attic::cli

int main(int argc, char** argv) {
  using namespace attic::cli;
  attic::ReexecWithHugePageMalloc(argv);
  CLI::App app{"Attic: an LLM inference server whose core is a KV-cache store"};
  app.require_subcommand(1);
  app.set_version_flag("--version", VersionText(), "print the version, the commit and the CPU kernels in use");
  app.footer(
      "Run 'attic COMMAND --help' for a command's flags. Exit status: 0 done, 1 the command failed (its message "
      "says why), 2 the command line is wrong.");
  RunFn run;
  AddGenerateCommand(app, &run);
  AddChatCommand(app, &run);
  AddBenchCommand(app, &run);
  AddMakeModelCommand(app, &run);
  AddQuantizeCommand(app, &run);
  AddServeCommand(app, &run);
  AddEvalCommand(app, &run);
  RunFn bench_serve_run;
  AddBenchServeCommand(app, &bench_serve_run);
  RunFn bench_sessions_run;
  AddBenchSessionsCommand(app, &bench_sessions_run);
  RunFn bench_soak_run;
  AddBenchSoakCommand(app, &bench_soak_run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const NamedCommand c = FindCommand(app, argc, argv);
    // A word where a command must follow (attic WORD, attic eval WORD) that names none.
    const bool wants_command = c.app->get_require_subcommand_min() > 0;
    if (wants_command && !c.unknown.empty()) {
      return UsageError("unknown command '" + c.unknown + "' (" + c.path + " takes: " + SubcommandNames(*c.app) +
                        "; see '" + c.path + " --help')");
    }
    std::string what = e.what();
    if (what.empty()) what = "invalid command line";
    if (wants_command && what.find("subcommand is required") != std::string::npos)
      what = c.path + " needs a subcommand: " + SubcommandNames(*c.app);
    return UsageError(what + " (see '" + c.path + " --help')");
  }
  if (bench_serve_run) return bench_serve_run();
  if (bench_sessions_run) return bench_sessions_run();
  if (bench_soak_run) return bench_soak_run();
  return run ? run() : kExitOk;
}
