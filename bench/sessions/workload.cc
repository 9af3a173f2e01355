#include "bench/sessions/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>

namespace attic::bench::sessions {

namespace {

using json = nlohmann::json;

constexpr double kCharsPerToken = 4.0;
constexpr int kTemplateTokensPerMessage = 8;

StatusOr<json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read dataset file '" + path + "'");
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) return InvalidArgumentError("dataset file '" + path + "' is not valid JSON");
  return j;
}

StatusOr<std::vector<json>> ReadJsonLines(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read dataset file '" + path + "'");
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) return InvalidArgumentError("dataset file '" + path + "' has an invalid JSON line");
    out.push_back(std::move(j));
  }
  return out;
}

StatusOr<ConversationPool> LoadConversationsOrThrow(const std::string& dir) {
  ConversationPool pool;
  std::vector<Conversation>& convs = pool.conversations;
  std::vector<int>* answer_chars = &pool.answer_chars;
  auto sg = ReadJsonFile(dir + "/sharegpt_multiturn_sample/sharegpt_test.json");
  if (!sg.ok()) return sg.status();
  for (const json& c : *sg) {
    if (!c.contains("conversations") || !c["conversations"].is_array()) continue;
    Conversation conv;
    for (const json& m : c["conversations"]) {
      std::string from = m.value("from", ""), value = m.value("value", "");
      if (from == "human") {
        conv.push_back({value, -1});
      } else if (from == "gpt" && !conv.empty() && conv.back().answer_chars < 0) {
        conv.back().answer_chars = static_cast<int>(value.size());
        answer_chars->push_back(static_cast<int>(value.size()));
      }
    }
    if (!conv.empty()) convs.push_back(std::move(conv));
  }
  const std::string mt = dir + "/fastchat_mtbench_and_dummy_conversations/";
  auto qs = ReadJsonLines(mt + "fastchat_llm_judge_data_mt_bench_question.jsonl");
  if (!qs.ok()) return qs.status();
  auto refs = ReadJsonLines(mt + "fastchat_llm_judge_data_mt_bench_reference_answer_gpt-4.jsonl");
  if (!refs.ok()) return refs.status();
  std::map<int, std::vector<int>> ref_chars;
  for (const json& r : *refs) {
    if (!r.contains("choices") || !r["choices"].is_array() || r["choices"].empty()) continue;
    const json& t = r["choices"][0].value("turns", json::array());
    for (const json& a : t)
      if (a.is_string()) ref_chars[r.value("question_id", -1)].push_back(static_cast<int>(a.get<std::string>().size()));
  }
  for (const json& q : *qs) {
    const json& turns = q.value("turns", json::array());
    const auto ref = ref_chars.find(q.value("question_id", -1));
    Conversation conv;
    for (size_t i = 0; i < turns.size(); ++i) {
      if (!turns[i].is_string()) continue;
      int chars = ref != ref_chars.end() && i < ref->second.size() ? ref->second[i] : -1;
      if (chars >= 0) answer_chars->push_back(chars);
      conv.push_back({turns[i].get<std::string>(), chars});
    }
    if (!conv.empty()) convs.push_back(std::move(conv));
  }
  if (convs.empty() || answer_chars->empty()) return InvalidArgumentError("no conversations found under '" + dir + "'");
  return pool;
}

int EstTokens(size_t chars) { return static_cast<int>(std::ceil(chars / kCharsPerToken)); }

}  // namespace

StatusOr<ConversationPool> LoadConversations(const std::string& datasets_dir) {
  try {
    return LoadConversationsOrThrow(datasets_dir);
  } catch (const json::exception& e) {
    return InvalidArgumentError("unexpected dataset layout under '" + datasets_dir + "': " + e.what());
  }
}

std::string CutUtf8(const std::string& s, int max_bytes) {
  if (static_cast<int>(s.size()) <= max_bytes) return s;
  size_t n = static_cast<size_t>(std::max(0, max_bytes));
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

std::vector<SessionSpec> GenerateWorkload(const ConversationPool& pool, const WorkloadOptions& f) {
  const std::vector<Conversation>& convs = pool.conversations;
  const std::vector<int>& answer_chars = pool.answer_chars;
  std::mt19937_64 rng(f.seed);
  std::vector<size_t> order(convs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::exponential_distribution<double> gap(f.rate > 0 ? f.rate : 1.0);
  std::exponential_distribution<double> think(f.think > 0 ? 1.0 / f.think : 1.0);
  // 1 + geometric(p) with mean (1 - p) / p = mean_turns - 1.
  const double extra_mean = std::max(0.0, f.mean_turns - 1);
  std::geometric_distribution<int> extra(1.0 / (1.0 + extra_mean));
  std::uniform_int_distribution<size_t> pick_answer(0, answer_chars.size() - 1);
  std::vector<SessionSpec> out;
  double t = 0;
  size_t cursor = 0;
  for (int s = 0; s < f.sessions; ++s) {
    SessionSpec spec;
    spec.index = s;
    if (s > 0 && f.rate > 0) t += gap(rng);
    spec.arrival_s = t;
    int n_turns = std::clamp(1 + (extra_mean > 0 ? extra(rng) : 0), std::max(1, f.min_turns),
                             std::max(1, std::max(f.min_turns, f.max_turns)));
    // This session's conversation, then the following ones as new topics.
    size_t conv = order[cursor++ % order.size()];
    size_t in_conv = 0;
    int ctx = kTemplateTokensPerMessage * 2;  // system prompt
    for (int k = 0; k < n_turns; ++k) {
      if (in_conv >= convs[conv].size()) {
        conv = order[cursor++ % order.size()];
        in_conv = 0;
      }
      const SourceTurn& src = convs[conv][in_conv++];
      int chars = src.answer_chars >= 0 ? src.answer_chars : answer_chars[pick_answer(rng)];
      TurnSpec turn;
      turn.user = CutUtf8(src.user, f.max_prompt_chars);
      if (turn.user.empty()) turn.user = "Go on.";
      turn.answer_tokens = std::clamp(EstTokens(chars), std::max(1, f.min_answer), std::max(1, f.max_answer));
      const int user_tokens = EstTokens(turn.user.size()) + kTemplateTokensPerMessage;
      if (k > 0 && ctx + user_tokens + turn.answer_tokens + kTemplateTokensPerMessage > f.max_context) break;
      turn.est_prompt_tokens = ctx + user_tokens;
      ctx += user_tokens + turn.answer_tokens + kTemplateTokensPerMessage;
      turn.think_s = f.think > 0 ? think(rng) : 0;
      spec.turns.push_back(std::move(turn));
    }
    out.push_back(std::move(spec));
  }
  return out;
}

nlohmann::json WorkloadJson(const std::vector<SessionSpec>& w, bool with_text) {
  json sessions = json::array();
  for (const auto& s : w) {
    json turns = json::array();
    for (const auto& t : s.turns) {
      json jt{{"user_chars", t.user.size()},
              {"answer_tokens", t.answer_tokens},
              {"est_prompt_tokens", t.est_prompt_tokens},
              {"think_s", t.think_s}};
      if (with_text) jt["user"] = t.user;
      turns.push_back(jt);
    }
    sessions.push_back({{"session", s.index}, {"arrival_s", s.arrival_s}, {"turns", turns}});
  }
  return sessions;
}

}  // namespace attic::bench::sessions
