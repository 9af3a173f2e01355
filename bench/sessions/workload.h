// The workload of `attic bench sessions`: multi-turn chat sessions built from real user
// messages, as paper 001 section 4.1 describes its ShareGPT workload (and
// ../shared/datasets/SOURCES.md the files):
//   * Sessions arrive as a Poisson process (rate sessions/s; the paper uses 1.0/s).
//   * A session is a chat of several turns. Its user messages are real ones, in order:
//     the 8 ShareGPT conversations of sharegpt_multiturn_sample/sharegpt_test.json and
//     the 80 two-turn MT-Bench questions of fastchat_mtbench_and_dummy_conversations/
//     (the 500 "dummy" conversations there are synthetic identity chit-chat of ~10
//     tokens a message and are not used). Each session starts on its own conversation
//     (a seeded shuffle, so no two sessions share a first message while there are
//     enough) and, when it needs more turns than that conversation has, goes on with
//     the user messages of the next one (a new topic in the same chat).
//   * Turns per session: 1 + a geometric variable with mean mean_turns - 1 (the paper's
//     ShareGPT mean is 5.75 turns), clamped to [min_turns, max_turns].
//   * The answer length of a turn (sent as max_tokens) is the real answer's length in the
//     dataset (the ShareGPT reply, MT-Bench's GPT-4 reference answer; for MT-Bench
//     questions without one, a length drawn from the real answers) at ~4 characters a
//     token, clamped to [min_answer, max_answer]. User messages longer than
//     max_prompt_chars bytes are cut there.
//   * A session stops early when its estimated context (history + new message + answer,
//     ~4 characters a token and 8 template tokens a message) would pass max_context: the
//     benchmark measures reuse, not context overflow/truncation.
//   * After an answer the user "thinks" for an exponential time (mean think s).
// The same options and seed give the same workload on every machine. Pure functions
// apart from reading the dataset files; thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "attic/core/status.h"

namespace attic::bench::sessions {

// One user message of a dataset conversation and the length of its real answer.
struct SourceTurn {
  std::string user;
  int answer_chars = -1;  // -1: unknown (drawn from the real answers)
};
using Conversation = std::vector<SourceTurn>;

// The dataset conversations, and the lengths (characters) of every real answer in them.
struct ConversationPool {
  std::vector<Conversation> conversations;
  std::vector<int> answer_chars;
};

// Loads the ShareGPT multi-turn sample and the MT-Bench questions (with their GPT-4
// reference answers) under `datasets_dir`. NotFound when a file is missing,
// InvalidArgument when one is not the JSON expected or no conversation is found.
StatusOr<ConversationPool> LoadConversations(const std::string& datasets_dir);

struct WorkloadOptions {
  int sessions = 12;
  double rate = 0.5;         // session arrivals per second (Poisson); 0: all at time 0
  double think = 2.0;        // mean think time after an answer, s (exponential); 0: none
  int min_turns = 3, max_turns = 16;
  double mean_turns = 5.75;  // of the distribution before the clamp
  int max_prompt_chars = 1600;
  int min_answer = 16, max_answer = 1024;  // answer tokens
  int max_context = 0;       // estimated tokens a session may reach (the command's default: 90% of --ctx)
  uint64_t seed = 1;
};

struct TurnSpec {
  std::string user;
  int answer_tokens = 0;
  int est_prompt_tokens = 0;  // estimated, whole prompt (history + this message)
  double think_s = 0;         // pause after this turn's answer before the next turn
};

struct SessionSpec {
  int index = 0;
  double arrival_s = 0;  // from the start of the replay
  std::vector<TurnSpec> turns;
};

// The sessions of the workload, in arrival order. REQUIRES: `pool` is non-empty (as
// LoadConversations returns it).
std::vector<SessionSpec> GenerateWorkload(const ConversationPool& pool, const WorkloadOptions& o);

// The trace as JSON: per session {"session", "arrival_s", "turns": [{"user_chars",
// "answer_tokens", "est_prompt_tokens", "think_s"[, "user"]}]}; the message text only
// when `with_text`.
nlohmann::json WorkloadJson(const std::vector<SessionSpec>& w, bool with_text);

// `s` cut to at most `max_bytes` bytes without splitting a UTF-8 sequence.
std::string CutUtf8(const std::string& s, int max_bytes);

}  // namespace attic::bench::sessions
