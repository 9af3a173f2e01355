// `attic bench sessions`' workload: loading the dataset files and generating sessions,
// checked against token estimates computed by hand (4 characters a token, rounded up; 8
// template tokens a message; a 16-token system prompt).
#include "bench/sessions/workload.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace attic::bench::sessions {
namespace {

using attic::testing::TempDir;

void WriteFile(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

// A datasets folder laid out as ../shared/datasets is.
void WriteDatasets(const std::string& dir, const std::string& sharegpt) {
  WriteFile(dir + "/sharegpt_multiturn_sample/sharegpt_test.json", sharegpt);
  const std::string mt = dir + "/fastchat_mtbench_and_dummy_conversations/";
  WriteFile(mt + "fastchat_llm_judge_data_mt_bench_question.jsonl",
            "{\"question_id\": 81, \"turns\": [\"q1 text\", \"q2\"]}\n\n{\"question_id\": 82, \"turns\": [\"only\"]}\n");
  WriteFile(mt + "fastchat_llm_judge_data_mt_bench_reference_answer_gpt-4.jsonl",
            "{\"question_id\": 81, \"choices\": [{\"turns\": [\"" + std::string(20, 'r') + "\", \"" +
                std::string(12, 's') + "\"]}]}\n");
}

TEST(SessionsWorkload, LoadsShareGptThenMtBench) {
  TempDir d;
  WriteDatasets(d.path(), "[{\"conversations\": [{\"from\": \"human\", \"value\": \"aaaa\"}, {\"from\": \"gpt\", \"value\": \"" +
                              std::string(40, 'x') +
                              "\"}, {\"from\": \"human\", \"value\": \"bbbbbbbb\"}, {\"from\": \"gpt\", \"value\": \"12345678\"}]},"
                              " {\"id\": \"no conversation\"}]");
  auto pool = LoadConversations(d.path());
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  ASSERT_EQ(pool->conversations.size(), 3u);
  const auto& c = pool->conversations;
  ASSERT_EQ(c[0].size(), 2u);
  EXPECT_EQ(c[0][0].user, "aaaa");
  EXPECT_EQ(c[0][0].answer_chars, 40);
  EXPECT_EQ(c[0][1].user, "bbbbbbbb");
  EXPECT_EQ(c[0][1].answer_chars, 8);
  ASSERT_EQ(c[1].size(), 2u);
  EXPECT_EQ(c[1][0].user, "q1 text");
  EXPECT_EQ(c[1][0].answer_chars, 20);
  EXPECT_EQ(c[1][1].answer_chars, 12);
  ASSERT_EQ(c[2].size(), 1u);
  EXPECT_EQ(c[2][0].answer_chars, -1);  // no reference answer
  EXPECT_EQ(pool->answer_chars, (std::vector<int>{40, 8, 20, 12}));
}

TEST(SessionsWorkload, DatasetErrors) {
  TempDir d;
  EXPECT_EQ(LoadConversations(d.path() + "/missing").status().code(), StatusCode::kNotFound);
  WriteDatasets(d.path(), "[{\"conversations\": ");
  EXPECT_EQ(LoadConversations(d.path()).status().code(), StatusCode::kInvalidArgument);
  WriteDatasets(d.path(), "[{\"conversations\": [1, 2]}]");  // messages that are not objects
  auto st = LoadConversations(d.path()).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("unexpected dataset layout"), std::string::npos) << st.message();
}

ConversationPool OneConversation() {
  ConversationPool pool;
  pool.conversations = {{{"abcdefgh", 40}, {"0123456789ab", 100}}};
  pool.answer_chars = {40, 100};
  return pool;
}

WorkloadOptions Fixed(int turns) {
  WorkloadOptions o;
  o.sessions = 2;
  o.rate = 0;
  o.think = 0;
  o.min_turns = o.max_turns = turns;
  o.min_answer = 1;
  o.max_answer = 20;
  o.max_prompt_chars = 10;
  o.max_context = 10000;
  return o;
}

TEST(SessionsWorkload, TokenEstimatesByHand) {
  const std::vector<SessionSpec> w = GenerateWorkload(OneConversation(), Fixed(3));
  ASSERT_EQ(w.size(), 2u);
  for (const SessionSpec& s : w) {
    EXPECT_EQ(s.arrival_s, 0);  // --rate 0: all at once
    ASSERT_EQ(s.turns.size(), 3u);
    // Turn 1: "abcdefgh" = 2 + 8 tokens after the 16-token system prompt; its answer of
    // 40 characters = 10 tokens.
    EXPECT_EQ(s.turns[0].user, "abcdefgh");
    EXPECT_EQ(s.turns[0].est_prompt_tokens, 26);
    EXPECT_EQ(s.turns[0].answer_tokens, 10);
    // Turn 2: the message is cut to 10 bytes (3 + 8 tokens) after 26 + 10 + 8 tokens of
    // history; 100 characters = 25 tokens, clamped to --max-answer 20.
    EXPECT_EQ(s.turns[1].user, "0123456789");
    EXPECT_EQ(s.turns[1].est_prompt_tokens, 55);
    EXPECT_EQ(s.turns[1].answer_tokens, 20);
    // Turn 3: the conversation is exhausted, the next one (the same, in a pool of one)
    // starts over: 55 + 20 + 8 history, then 10 tokens of message.
    EXPECT_EQ(s.turns[2].user, "abcdefgh");
    EXPECT_EQ(s.turns[2].est_prompt_tokens, 93);
    for (const TurnSpec& t : s.turns) EXPECT_EQ(t.think_s, 0);
  }
}

TEST(SessionsWorkload, StopsBeforeTheContextLimit) {
  WorkloadOptions o = Fixed(3);
  o.max_context = 110;  // turn 3 would reach 93 + 10 + 8 = 111
  const std::vector<SessionSpec> w = GenerateWorkload(OneConversation(), o);
  ASSERT_EQ(w[0].turns.size(), 2u);
  o.max_context = 111;
  EXPECT_EQ(GenerateWorkload(OneConversation(), o)[0].turns.size(), 3u);
}

TEST(SessionsWorkload, UnknownAnswerLengthsAreDrawnFromTheRealOnes) {
  ConversationPool pool;
  pool.conversations = {{{"x", -1}, {"y", -1}}};
  pool.answer_chars = {48};
  const std::vector<SessionSpec> w = GenerateWorkload(pool, Fixed(2));
  for (const TurnSpec& t : w[0].turns) EXPECT_EQ(t.answer_tokens, 12);
}

TEST(SessionsWorkload, SeededAndPoisson) {
  ConversationPool pool = OneConversation();
  WorkloadOptions o;
  o.sessions = 30;
  o.max_context = 3600;
  const auto a = GenerateWorkload(pool, o), b = GenerateWorkload(pool, o);
  o.seed = 2;
  const auto c = GenerateWorkload(pool, o);
  EXPECT_EQ(WorkloadJson(a, true), WorkloadJson(b, true));
  EXPECT_NE(WorkloadJson(a, true), WorkloadJson(c, true));
  double prev = 0;
  for (const SessionSpec& s : a) {
    EXPECT_GE(s.arrival_s, prev);
    prev = s.arrival_s;
    EXPECT_GE(s.turns.size(), 3u);   // --min-turns
    EXPECT_LE(s.turns.size(), 16u);  // --max-turns
  }
  EXPECT_GT(a.back().arrival_s, 0);
}

TEST(SessionsWorkload, Json) {
  const std::vector<SessionSpec> w = GenerateWorkload(OneConversation(), Fixed(1));
  const nlohmann::json j = WorkloadJson(w, false);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[1]["session"], 1);
  EXPECT_EQ(j[1]["arrival_s"], 0.0);
  ASSERT_EQ(j[1]["turns"].size(), 1u);
  EXPECT_EQ(j[1]["turns"][0], (nlohmann::json{{"user_chars", 8}, {"answer_tokens", 10}, {"est_prompt_tokens", 26},
                                              {"think_s", 0.0}}));
  EXPECT_EQ(WorkloadJson(w, true)[0]["turns"][0]["user"], "abcdefgh");
}

TEST(SessionsWorkload, CutUtf8KeepsWholeCharacters) {
  const std::string s = "h\xc3\xa9llo";  // "héllo": é is two bytes
  EXPECT_EQ(CutUtf8(s, 1), "h");
  EXPECT_EQ(CutUtf8(s, 2), "h");  // would split é
  EXPECT_EQ(CutUtf8(s, 3), "h\xc3\xa9");
  EXPECT_EQ(CutUtf8(s, 100), s);
  EXPECT_EQ(CutUtf8(s, 0), "");
}

}  // namespace
}  // namespace attic::bench::sessions
