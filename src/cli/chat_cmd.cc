// `attic chat`: an interactive multi-turn conversation in the terminal. The session's KV
// persists across turns, so each turn prefills only what it adds to the conversation.
// Ctrl-C stops the reply being written (the conversation and its KV stay); at the prompt
// it quits, as Ctrl-D and /exit do.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"

namespace attic::cli {

namespace {

constexpr char kCommands[] =
    "  /help   this list\n"
    "  /reset  start a new conversation (forgets the history and its KV)\n"
    "  /exit   quit (also /quit, Ctrl-D, or Ctrl-C at the prompt)\n"
    "  Ctrl-C while a reply is written stops the reply; the conversation goes on.\n";

std::atomic<bool> g_interrupted{false};

// SIGINT sets a flag instead of ending the process; without SA_RESTART a read at the
// prompt returns EINTR, so getline fails and the loop sees the flag.
void InstallInterruptHandler() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_interrupted.store(true); };
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

struct ChatFlags {
  ModelFlags model;
  std::string system;
  engine::SamplingParams sampling;
  bool stats = false;
};

// The conversation rendered and tokenized; when it does not fit the window (with room
// for one reply token), the oldest exchanges are dropped, as the server's truncation
// does, and the user is told. Fails only when the newest message alone does not fit.
StatusOr<std::vector<int32_t>> FitConversation(const engine::Engine& e, std::vector<tokenizer::ChatMessage>* history,
                                               size_t first_droppable) {
  int dropped = 0;
  while (true) {
    ATTIC_ASSIGN_OR_RETURN(std::string text, e.RenderChat(*history));
    ATTIC_ASSIGN_OR_RETURN(std::vector<int32_t> ids, e.Tokenize(text, false));
    if (static_cast<int>(ids.size()) < e.context_length()) {
      if (dropped > 0) {
        std::fprintf(stderr,
                     "attic: the conversation filled the context window (%d tokens): dropped its %d oldest "
                     "message%s (/reset starts over)\n",
                     e.context_length(), dropped, dropped == 1 ? "" : "s");
      }
      return ids;
    }
    if (history->size() <= first_droppable + 1) {  // only the new message is left
      return OutOfRangeError("this message alone (" + std::to_string(ids.size()) +
                             " tokens with the template) does not fit the context window of " +
                             std::to_string(e.context_length()) + " tokens");
    }
    history->erase(history->begin() + static_cast<std::ptrdiff_t>(first_droppable));
    ++dropped;
  }
}

int RunChat(const ChatFlags& f) {
  auto eng = engine::Engine::Load(ToEngineOptions(f.model, true));
  if (!eng.ok()) return Fail(eng.status());
  engine::Engine& e = **eng;
  PrintChatTemplate(e);
  std::fprintf(stderr, "attic: type a message; /help lists the commands\n");
  InstallInterruptHandler();
  std::vector<tokenizer::ChatMessage> history;
  if (!f.system.empty()) history.push_back({"system", f.system, {}, {}});
  const size_t first_droppable = history.size();
  engine::Session session(e);
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    g_interrupted.store(false);
    if (!std::getline(std::cin, line)) {
      if (g_interrupted.load()) std::fprintf(stderr, "\n");
      break;  // Ctrl-D or Ctrl-C at the prompt
    }
    if (line == "/exit" || line == "/quit") break;
    if (line == "/help") {
      std::fprintf(stderr, "%s", kCommands);
      continue;
    }
    if (line == "/reset") {
      history.resize(first_droppable);
      session.Reset();
      std::fprintf(stderr, "attic: new conversation\n");
      continue;
    }
    if (!line.empty() && line[0] == '/') {
      std::fprintf(stderr, "attic: unknown command '%s' (/help lists them)\n", line.c_str());
      continue;
    }
    history.push_back({"user", line, {}, {}});
    auto ids = FitConversation(e, &history, first_droppable);
    if (!ids.ok()) {
      std::fprintf(stderr, "attic: %s\n", ids.status().message().c_str());
      history.pop_back();
      continue;
    }
    auto res = session.Generate(*ids, f.sampling, [](const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return !g_interrupted.load();
    });
    std::printf("\n");
    std::fflush(stdout);
    if (!res.ok()) {
      std::fprintf(stderr, "attic: %s\n", res.status().message().c_str());
      history.pop_back();
      continue;
    }
    if (res->finish_reason == "cancelled") std::fprintf(stderr, "attic: reply stopped\n");
    history.push_back({"assistant", res->text, {}, {}});
    if (f.stats) {
      std::fprintf(stderr, "[reused %d of %d prompt tokens, prefilled %d in %.3fs | %zu tokens at %.1f tok/s]\n",
                   res->n_cached_tokens, res->n_prompt_tokens, res->n_prompt_tokens - res->n_cached_tokens,
                   res->prefill_seconds, res->tokens.size(), res->tokens.size() / std::max(1e-9, res->decode_seconds));
    }
    if (res->finish_reason == "length" && session.kv().n_slots() >= e.context_length()) {
      std::fprintf(stderr,
                   "attic: the context window (%d tokens) is full; the next message drops the oldest ones "
                   "(/reset starts over)\n",
                   e.context_length());
    }
  }
  return kExitOk;
}

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
  cmd->footer(std::string("In the chat:\n") + kCommands);
  cmd->callback([run, f] { *run = [f] { return RunChat(*f); }; });
}

}  // namespace attic::cli
