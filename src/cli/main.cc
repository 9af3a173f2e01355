// attic: the command-line front end (generate, chat, serve, bench, bench serve, bench sessions, make-model, ...).
#include <cstdio>

#include "attic/core/huge_pages.h"
#include "cli/commands.h"

namespace attic::cli {

std::string DefaultModelPath() {
  if (const char* env = std::getenv("ATTIC_MODEL")) return env;
  return "../shared/models/stories260K-hf";
}

void AddModelFlags(CLI::App* cmd, ModelFlags* f) {
  f->model = DefaultModelPath();
  cmd->add_option("-m,--model", f->model, "HF model directory or GGUF file ($ATTIC_MODEL)")->capture_default_str();
  cmd->add_option("-t,--threads", f->threads, "compute threads (0 = all CPUs)")->capture_default_str();
  cmd->add_option("-c,--ctx", f->ctx, "context window in tokens (0 = the model's maximum)")->capture_default_str();
  cmd->add_option("-b,--batch", f->batch, "tokens per forward step (prefill chunk)")->capture_default_str();
  cmd->add_option("--chat-template", f->chat_template, "chat template family: chatml, llama3, llama2 (default: detect)");
  cmd->add_option("--kv-dtype", f->kv_dtype,
                  "element type of the compute buffer's KV cache: f32 (exact: greedy output independent of "
                  "batching) or f16 (half the memory per token)")
      ->check(CLI::IsMember({"f16", "f32"}))
      ->capture_default_str();
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
  o.chat_template_fallback = "chatml";  // serve: a model without a template chats in ChatML
  o.kv_dtype = *ParseDType(f.kv_dtype);  // one of f32/f16 (checked by the flag)
  o.kv_block_size = f.kv_block_size;
  o.deterministic = f.deterministic;
  o.show_progress = progress;
  return o;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "attic: error: %s\n", s.message().c_str());
  return 1;
}

}  // namespace attic::cli

int main(int argc, char** argv) {
  attic::ReexecWithHugePageMalloc(argv);
  CLI::App app{"Attic: an LLM inference server whose core is a KV-cache store"};
  app.require_subcommand(1);
  attic::cli::RunFn run;
  attic::cli::AddGenerateCommand(app, &run);
  attic::cli::AddChatCommand(app, &run);
  attic::cli::AddBenchCommand(app, &run);
  attic::cli::AddMakeModelCommand(app, &run);
  attic::cli::AddServeCommand(app, &run);
  attic::cli::RunFn bench_serve_run;
  attic::cli::AddBenchServeCommand(app, &bench_serve_run);
  attic::cli::RunFn bench_sessions_run;
  attic::cli::AddBenchSessionsCommand(app, &bench_sessions_run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (bench_serve_run) return bench_serve_run();
  if (bench_sessions_run) return bench_sessions_run();
  return run ? run() : 0;
}
