// Subcommands of the `attic` CLI. Each Add*Command registers its options on `app` and
// sets `run` to the function that executes it (returning the process exit code).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <functional>
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
  int kv_block_size = kv::kDefaultBlockSize;
  bool deterministic = false;
};

// The default model: $ATTIC_MODEL, else ../shared/models/stories260K-hf.
std::string DefaultModelPath();
void AddModelFlags(CLI::App* cmd, ModelFlags* f);
engine::EngineOptions ToEngineOptions(const ModelFlags& f, bool progress);
// Prints "attic: error: <message>" to stderr.
int Fail(const Status& s);

void AddGenerateCommand(CLI::App& app, RunFn* run);
void AddChatCommand(CLI::App& app, RunFn* run);
void AddBenchCommand(CLI::App& app, RunFn* run);
void AddMakeModelCommand(CLI::App& app, RunFn* run);
void AddServeCommand(CLI::App& app, RunFn* run);
// `bench serve`, a subcommand of `bench` (call after AddBenchCommand). It has its own
// RunFn because `bench`'s callback runs after its subcommand's and would replace it.
void AddBenchServeCommand(CLI::App& app, RunFn* run);
// `bench sessions` (multi-turn CA vs RE over the server), likewise with its own RunFn.
void AddBenchSessionsCommand(CLI::App& app, RunFn* run);

}  // namespace attic::cli
