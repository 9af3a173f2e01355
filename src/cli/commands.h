// Subcommands of the `attic` CLI. Each Add*Command registers its options on `app` and
// sets `run` to the function that executes it (returning the process exit code).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

#include "attic/engine/engine.h"

namespace attic::cli {

using RunFn = std::function<int()>;

// Options every command that loads a model shares.
struct ModelFlags {
  std::string model;
  int threads = 0;
  int ctx = 0;
  int batch = 512;
  std::string chat_template;
  std::string kv_dtype = "f32";
  std::string kv_dtype_k, kv_dtype_v;  // K's / V's own type ("" = kv_dtype's)
  int kv_block_size = kv::kDefaultBlockSize;
  bool deterministic = false;
};

// Exit codes of every command (README.md, "The attic command").
constexpr int kExitOk = 0;
constexpr int kExitError = 1;  // the command could not do its work (model, files, server)
constexpr int kExitUsage = 2;  // the command line was wrong (unknown command, flag or value)

// Paths resolved from the executable's place (defaults.cc), never from the current
// directory: the project checkout the binary was built in (<project>/build/attic), and
// the shared folder beside it ($ATTIC_SHARED_DIR overrides).
std::string ProjectDir();
std::string SharedDir();
// The default model: $ATTIC_MODEL, else <shared>/models/stories260K-hf.
std::string DefaultModelPath();
void AddModelFlags(CLI::App* cmd, ModelFlags* f);
engine::EngineOptions ToEngineOptions(const ModelFlags& f, bool progress);
// Prints "attic: error: <message>" to stderr; returns kExitError.
int Fail(const Status& s);
// Prints "attic: error: <message>" to stderr; returns kExitUsage.
int UsageError(const std::string& message);

// A size flag ("512M", "16G", "4GiB", or bytes; core/byte_size.h) named `name`, with
// its older spelling `old_name` (hidden from --help, still accepted) whose bare numbers
// count `old_unit` bytes (e.g. 1 << 20 for "--kv-budget-mib"). `help` should give the
// default in the same units.
void AddSizeOption(CLI::App* cmd, const std::string& name, const std::string& old_name, uint64_t old_unit,
                   uint64_t* target, const std::string& help);
// The same for a flag whose absence means something of its own (e.g. --kv-dram: not
// given = sized automatically, 0 = off): `target` stays empty unless the flag is given.
void AddSizeOption(CLI::App* cmd, const std::string& name, const std::string& old_name, uint64_t old_unit,
                   std::optional<uint64_t>* target, const std::string& help);

// --json / --plot outputs: PrepareOutput before the work starts (creates the parent
// folders, fails early when the path cannot be written), WriteOutput at the end.
Status PrepareOutput(const std::string& path, const char* flag);
Status WriteOutput(const std::string& path, const std::string& contents, const char* flag);

// The chat template the model's chats use, printed once at start-up by the commands
// that render chats (serve, chat, generate --chat).
void PrintChatTemplate(const engine::Engine& e);

void AddGenerateCommand(CLI::App& app, RunFn* run);
void AddChatCommand(CLI::App& app, RunFn* run);
void AddBenchCommand(CLI::App& app, RunFn* run);
void AddMakeModelCommand(CLI::App& app, RunFn* run);
void AddQuantizeCommand(CLI::App& app, RunFn* run);
void AddServeCommand(CLI::App& app, RunFn* run);
void AddEvalCommand(CLI::App& app, RunFn* run);  // `eval perplexity`, `eval needle`, `eval link`
// `eval link` (eval_link_cmd.cc), added to `eval` by AddEvalCommand.
void AddEvalLinkCommand(CLI::App* ev, RunFn* run);
// `bench serve`, a subcommand of `bench` (call after AddBenchCommand). It has its own
// RunFn because `bench`'s callback runs after its subcommand's and would replace it.
void AddBenchServeCommand(CLI::App& app, RunFn* run);
// `bench sessions` (multi-turn CA vs RE over the server), likewise with its own RunFn.
void AddBenchSessionsCommand(CLI::App& app, RunFn* run);
// `bench soak` (bench_soak_cmd.cc): a stability run against a started server.
void AddBenchSoakCommand(CLI::App& app, RunFn* run);

}  // namespace attic::cli
