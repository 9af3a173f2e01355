// `attic generate`: prompt -> streamed text on stdout.
#include <cstdio>
#include <iostream>
#include <iterator>

#include "attic/core/file.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {
struct GenerateFlags {
  ModelFlags model;
  std::string prompt;
  std::string prompt_file;
  bool chat = false;
  std::string system;
  bool no_bos = false;
  engine::SamplingParams sampling;
  bool show_ids = false;
};
}  // namespace

void AddGenerateCommand(CLI::App& app, RunFn* run) {
  auto* cmd = app.add_subcommand("generate", "generate a continuation of a prompt, streamed to stdout");
  auto f = std::make_shared<GenerateFlags>();
  f->sampling.max_tokens = 128;
  AddModelFlags(cmd, &f->model);
  cmd->add_option("-p,--prompt", f->prompt, "prompt text (or '-' to read stdin)");
  cmd->add_option("-f,--prompt-file", f->prompt_file, "read the prompt from a file");
  cmd->add_flag("--chat", f->chat, "wrap the prompt as a user message in the model's chat template");
  cmd->add_option("--system", f->system, "system message (with --chat)");
  cmd->add_flag("--no-bos", f->no_bos, "do not prepend BOS");
  cmd->add_option("-n,--max-tokens", f->sampling.max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temp,--temperature", f->sampling.temperature, "temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-k", f->sampling.top_k, "top-k (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", f->sampling.top_p, "top-p (1 = off)")->capture_default_str();
  cmd->add_option("--min-p", f->sampling.min_p, "min-p (0 = off)")->capture_default_str();
  cmd->add_option("--seed", f->sampling.seed, "RNG seed")->capture_default_str();
  cmd->add_option("--stop", f->sampling.stop_strings, "stop string (repeatable)");
  cmd->add_flag("--ids", f->show_ids, "print the generated token ids to stderr");
  cmd->callback([run, f] {
    *run = [f]() -> int {
      std::string prompt = f->prompt;
      if (!f->prompt_file.empty()) {
        auto text = ReadFileToString(f->prompt_file);
        if (!text.ok()) return Fail(text.status());
        prompt = *text;
      } else if (prompt == "-") {
        prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      }
      auto eng = engine::Engine::Load(ToEngineOptions(f->model, true));
      if (!eng.ok()) return Fail(eng.status());
      engine::Engine& e = **eng;
      bool add_bos = !f->no_bos;
      if (f->chat) {
        PrintChatTemplate(e);
        std::vector<tokenizer::ChatMessage> msgs;
        if (!f->system.empty()) msgs.push_back({"system", f->system, {}, {}});
        msgs.push_back({"user", prompt, {}, {}});
        auto rendered = e.RenderChat(msgs);
        if (!rendered.ok()) return Fail(rendered.status());
        prompt = *rendered;
        add_bos = false;  // templates that want BOS write it themselves
      }
      auto ids = e.Tokenize(prompt, add_bos);
      if (!ids.ok()) return Fail(ids.status());
      if (ids->empty()) return Fail(InvalidArgumentError("prompt is empty (and the model adds no BOS)"));
      engine::Session session(e);
      auto r = session.Generate(*ids, f->sampling, [](const std::string& piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        return true;
      });
      if (!r.ok()) return Fail(r.status());
      // The text ends with a newline, written before the statistics (stderr) even when
      // stdout is a pipe or a file.
      std::printf("\n");
      std::fflush(stdout);
      if (f->show_ids) {
        for (int32_t t : r->tokens) std::fprintf(stderr, "%d ", t);
        std::fprintf(stderr, "\n");
      }
      std::fprintf(stderr, "[prompt %d tokens, %.1f tok/s | generated %zu tokens, %.1f tok/s | finish: %s]\n",
                   r->n_prompt_tokens, r->n_prompt_tokens / std::max(1e-9, r->prefill_seconds), r->tokens.size(),
                   r->tokens.size() / std::max(1e-9, r->decode_seconds), r->finish_reason.c_str());
      return 0;
    };
  });
}

}  // namespace attic::cli
