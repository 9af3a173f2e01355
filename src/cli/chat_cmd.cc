// `attic chat`: an interactive multi-turn conversation in the terminal. The session's KV
// persists across turns, so each turn prefills only what it adds to the conversation.
#include <cstdio>
#include <iostream>

#include "cli/commands.h"

namespace attic::cli {

namespace {
struct ChatFlags {
  ModelFlags model;
  std::string system;
  engine::SamplingParams sampling;
  bool stats = false;
};
}  // namespace

void AddChatCommand(CLI::App& app, RunFn* run) {
  auto* cmd = app.add_subcommand("chat", "interactive multi-turn chat (reuses the KV of earlier turns)");
  auto f = std::make_shared<ChatFlags>();
  f->sampling.max_tokens = 256;
  AddModelFlags(cmd, &f->model);
  cmd->add_option("--system", f->system, "system message");
  cmd->add_option("-n,--max-tokens", f->sampling.max_tokens, "max tokens per reply")->capture_default_str();
  cmd->add_option("--temp,--temperature", f->sampling.temperature, "temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-p", f->sampling.top_p, "top-p")->capture_default_str();
  cmd->add_option("--seed", f->sampling.seed, "RNG seed")->capture_default_str();
  cmd->add_flag("--stats", f->stats, "print reused/prefilled tokens and speed after each reply");
  cmd->callback([run, f] {
    *run = [f]() -> int {
      auto eng = engine::Engine::Load(ToEngineOptions(f->model, true));
      if (!eng.ok()) return Fail(eng.status());
      engine::Engine& e = **eng;
      // A model without a chat template (a base model such as stories260K) chats in
      // completion mode: the transcript is plain text that the model continues.
      bool completion_mode = !e.RenderChat({{"user", "x"}}).ok();
      if (completion_mode) {
        std::fprintf(stderr,
                     "attic: this model has no chat template; chatting in completion mode "
                     "(each line continues the text; pass --chat-template to choose one)\n");
      }
      std::vector<tokenizer::ChatMessage> history;
      if (!f->system.empty()) history.push_back({"system", f->system});
      std::string transcript;
      engine::Session session(e);
      std::string line;
      while (true) {
        std::fprintf(stderr, "> ");
        if (!std::getline(std::cin, line)) break;
        if (line == "/exit" || line == "/quit") break;
        if (line == "/reset") {
          history.resize(f->system.empty() ? 0 : 1);
          transcript.clear();
          session.Reset();
          continue;
        }
        std::string prompt;
        if (completion_mode) {
          transcript += transcript.empty() ? line : " " + line;
          prompt = transcript;
        } else {
          history.push_back({"user", line});
          auto r = e.RenderChat(history);
          if (!r.ok()) return Fail(r.status());
          prompt = *r;
        }
        auto ids = e.Tokenize(prompt, completion_mode);
        if (!ids.ok()) {
          std::fprintf(stderr, "attic: %s\n", ids.status().message().c_str());
          if (!completion_mode) history.pop_back();
          continue;
        }
        auto res = session.Generate(*ids, f->sampling, [](const std::string& piece) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
          return true;
        });
        std::printf("\n");
        if (!res.ok()) {
          std::fprintf(stderr, "attic: %s\n", res.status().message().c_str());
          if (!completion_mode) history.pop_back();
          continue;
        }
        if (completion_mode) transcript += res->text;
        else history.push_back({"assistant", res->text});
        if (f->stats) {
          std::fprintf(stderr, "[reused %d of %d prompt tokens, prefilled %d in %.3fs | %zu tokens at %.1f tok/s]\n",
                       res->n_cached_tokens, res->n_prompt_tokens, res->n_prompt_tokens - res->n_cached_tokens,
                       res->prefill_seconds, res->tokens.size(),
                       res->tokens.size() / std::max(1e-9, res->decode_seconds));
        }
      }
      return 0;
    };
  });
}

}  // namespace attic::cli
