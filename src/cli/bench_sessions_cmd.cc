// `attic bench sessions`: multi-turn conversations replayed against the real server,
// once with the KV store (CA, CachedAttention, paper 001) and once with recomputation
// (RE, the paper's baseline), and the paper's section 4.2 metrics compared.
//
// Workload (paper 001 section 4.1 and ../shared/datasets/SOURCES.md):
//   * Sessions arrive as a Poisson process (--rate sessions/s; the paper uses 1.0/s).
//   * A session is a chat of several turns. Its user messages are real ones, in order:
//     the 8 ShareGPT conversations of sharegpt_multiturn_sample/sharegpt_test.json and
//     the 80 two-turn MT-Bench questions of fastchat_mtbench_and_dummy_conversations/
//     (the 500 "dummy" conversations there are synthetic identity chit-chat of ~10
//     tokens a message and are not used). Each session starts on its own conversation
//     (a seeded shuffle, so no two sessions share a first message while there are
//     enough) and, when it needs more turns than that conversation has, goes on with
//     the user messages of the next one (a new topic in the same chat).
//   * Turns per session: 1 + a geometric variable with mean --mean-turns - 1 (the
//     paper's ShareGPT mean is 5.75 turns), clamped to [--min-turns, --max-turns]
//     (default [3, 16], so the clamp barely moves the mean).
//   * The answer length of a turn (sent as max_tokens; with ignore_eos the random-weight
//     model produces exactly that many tokens) is the real answer's length in the
//     dataset (the ShareGPT reply, MT-Bench's GPT-4 reference answer; for MT-Bench
//     questions without one, a length drawn from the real answers) at ~4 characters a
//     token, clamped to [--min-answer, --max-answer] (default [16, 1024]: the real
//     lengths, bar a few outliers). User messages longer than --max-prompt-chars are cut
//     there.
//   * A session stops early when its estimated context (history + new message +
//     answer, ~4 characters a token and 8 template tokens a message) would pass
//     --max-context (default 90% of the servers' 4K window, the paper's LLaMA-2
//     context): the benchmark measures reuse, not context overflow/truncation. The
//     paper's sessions are long (47% over 2K tokens); these defaults let the real
//     conversations grow toward the window: with the default 12 sessions and seed, 3
//     end past 2K and the longest reaches 3.4K (the previous defaults, at most 6 turns
//     of at most 256 answer tokens in 2K, kept every session under 2K).
//   * After an answer has fully arrived the user "thinks" for an exponential time
//     (mean --think s) and sends the next turn.
//   * Every turn is a streaming POST /v1/chat/completions with messages = the whole
//     history + the new user message (the history holds what the server actually
//     answered, as a real client's does), session_id, max_tokens = the answer length,
//     temperature 0 and, unless --no-ignore-eos, ignore_eos.
//
// Servers: by default the benchmark starts `attic serve` (this same binary) twice, one
// after the other on a free port, waits for /health, replays the same trace, and stops
// it: CA = --kv-dram-bytes (+ --kv-ssd-dir in a fresh temporary directory unless
// --no-ssd) and --max-resident 0 (--ca-max-resident) so that every reused token comes
// from the store's DRAM or SSD tier, not from KV left in the compute buffer; RE = no
// store and --max-resident 0, so every turn recomputes its whole history. --ca-url /
// --re-url use already running servers instead (then no server CPU time is measured).
//
// Metrics (per mode; all from the replay, after one warm-up request per server):
//   * store hit rate: deltas of /metrics attic_kv_store_hits_total{tier} over
//     attic_kv_store_lookups_total (the server's own count: one lookup per admitted
//     request; a first turn can hit another session's entry through the shared system
//     prompt); also the token reuse: usage.prompt_tokens_details.cached_tokens over the
//     prompt tokens (all turns) and over the history tokens (later turns).
//   * TTFT (client side: request sent -> first non-empty content chunk) p50 / p90 over
//     all turns, and over the turns whose prompt is >= 90% history, where a turn's
//     history = min(prompt tokens, previous turn's prompt + completion tokens).
//   * prefill throughput: prompt tokens / prefill busy time, where the prefill busy time
//     is the wall time during which at least one turn was waiting for its first token
//     (the union of the turns' [sent, first token] intervals; = the sum of TTFTs when no
//     two overlap). "served" counts every prompt token (the paper's definition: CA's is
//     high because history is not recomputed), "computed" only prompt - cached tokens.
//   * compute time: the server process's CPU time (user + system) during the replay
//     (the analogue of the paper's GPU time: prefill, decode, store copies, HTTP), and
//     the sum of TTFTs.
// Output: a table, the JSON summary as the last stdout line, --json FILE (the summary
// plus every turn), --plot FILE.svg (TTFT CDF and median TTFT by turn index).
//
// Default run (a few minutes on 2 cores; the model is random-weight, answers are
// gibberish, which does not matter for KV reuse):
//   build/attic make-model --config ../shared/models/smollm2-135m-instruct-tokenizer/config.json
//     --tokenizer ../shared/models/smollm2-135m-instruct-tokenizer --dtype bf16
//     --out-gguf out/models/smollm2-135m-bf16.gguf
//   build/attic bench sessions --json out/bench-sessions/sessions.json --plot out/bench-sessions/sessions.svg
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "attic/core/byte_size.h"
#include "attic/core/file.h"
#include "cli/commands.h"
#include "cli/openai_client.h"

namespace attic::cli {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kDefaultModel[] = "out/models/smollm2-135m-bf16.gguf";  // in the project folder
constexpr double kCharsPerToken = 4.0;
constexpr int kTemplateTokensPerMessage = 8;
constexpr double kHistoryShare = 0.9;  // "turns whose prompt is >= 90% history"

struct SessionsFlags {
  std::string model;  // "" = <project>/out/models/smollm2-135m-bf16.gguf
  std::string datasets;
  std::string ca_url, re_url;
  std::string only = "both";  // both, ca, re
  std::string api_key;
  // Workload.
  int sessions = 12;
  double rate = 0.5;
  double think = 2.0;
  int min_turns = 3, max_turns = 16;
  double mean_turns = 5.75;
  int max_prompt_chars = 1600;
  int min_answer = 16, max_answer = 1024;
  int max_context = 0;  // 0: 90% of --ctx (the estimate is ~4 characters a token)
  uint64_t seed = 1;
  bool no_ignore_eos = false;
  // Servers started by the benchmark.
  int threads = 2;
  int ctx = 4096;
  uint64_t kv_budget = 4ull << 30;
  int max_running = 16;
  uint64_t kv_dram = 512ull << 20;
  uint64_t kv_ssd = 8ull << 30;
  bool no_ssd = false;
  std::string ssd_parent;
  int ca_max_resident = 0;
  std::string serve_args;
  // Output.
  std::string json_out, plot_out;
  bool trace_only = false;
  bool quiet = false;
};

// --- Workload --------------------------------------------------------------------------

struct SourceTurn {
  std::string user;
  int answer_chars = -1;  // -1: unknown (drawn from the real answers)
};
using Conversation = std::vector<SourceTurn>;

struct TurnSpec {
  std::string user;
  int answer_tokens = 0;
  int est_prompt_tokens = 0;  // estimated, whole prompt (history + this message)
  double think_s = 0;         // pause after this turn's answer before the next turn
};

struct SessionSpec {
  int index = 0;
  double arrival_s = 0;
  std::vector<TurnSpec> turns;
};

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

// The real conversations: ShareGPT multi-turn sample + MT-Bench two-turn questions.
StatusOr<std::vector<Conversation>> LoadConversations(const std::string& dir, std::vector<int>* answer_chars) {
  std::vector<Conversation> convs;
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
  return convs;
}

// Cuts `s` to at most `max_bytes` bytes without splitting a UTF-8 sequence.
std::string CutUtf8(const std::string& s, int max_bytes) {
  if (static_cast<int>(s.size()) <= max_bytes) return s;
  size_t n = static_cast<size_t>(std::max(0, max_bytes));
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

int EstTokens(size_t chars) { return static_cast<int>(std::ceil(chars / kCharsPerToken)); }

std::vector<SessionSpec> GenerateWorkload(const std::vector<Conversation>& convs, const std::vector<int>& answer_chars,
                                          const SessionsFlags& f) {
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

json WorkloadJson(const std::vector<SessionSpec>& w, bool with_text) {
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

// --- Servers ---------------------------------------------------------------------------

// Ctrl-C / SIGTERM: stop the child servers and remove the temporary directory (SSD
// tier files) before exiting. The handler only writes to a pipe; a thread does the work.
struct Interrupt {
  static inline int pipe_fds[2] = {-1, -1};
  static inline std::atomic<pid_t> children[2] = {-1, -1};
  static inline std::mutex mu;
  static inline std::string tmp_dir;

  static void Install(const std::string& dir) {
    {
      std::lock_guard<std::mutex> lock(mu);
      tmp_dir = dir;
    }
    if (pipe(pipe_fds) != 0) return;
    struct sigaction sa {};
    sa.sa_handler = [](int sig) {
      unsigned char b = static_cast<unsigned char>(sig);
      ssize_t ignored = write(pipe_fds[1], &b, 1);
      (void)ignored;
    };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    std::thread([] {
      unsigned char sig = 0;
      while (read(pipe_fds[0], &sig, 1) < 0 && errno == EINTR) {
      }
      std::fprintf(stderr, "attic: interrupted, stopping the servers\n");
      for (auto& c : children) {
        pid_t pid = c.load();
        if (pid > 0) kill(pid, SIGTERM);
      }
      for (auto& c : children) {
        pid_t pid = c.load();
        if (pid > 0) waitpid(pid, nullptr, 0);
      }
      std::lock_guard<std::mutex> lock(mu);
      std::error_code ec;
      if (!tmp_dir.empty()) std::filesystem::remove_all(tmp_dir, ec);
      std::_Exit(128 + sig);
    }).detach();
  }
};

// An `attic serve` child process on a free port, stopped (SIGTERM, then SIGKILL) when
// destroyed. Its output goes to a log file, shown when it fails to start.
class ServerProcess {
 public:
  ~ServerProcess() { Stop(); }

  Status Start(const std::string& label, std::vector<std::string> args, const std::string& log_path) {
    label_ = label;
    log_path_ = log_path;
    std::vector<char*> argv;
    static const std::string exe = "/proc/self/exe";
    std::string self = std::filesystem::read_symlink(exe).string();
    args.insert(args.begin(), {self, "serve"});
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) return InternalError("fork failed");
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the benchmark
      if (getppid() != parent) _exit(1);
      int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    Interrupt::children[slot_ = label == "CA" ? 0 : 1].store(pid_);
    // Wait for "listening on http://HOST:PORT" in the log.
    const auto deadline = Clock::now() + std::chrono::seconds(300);
    while (Clock::now() < deadline) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        Interrupt::children[slot_].store(-1);
        pid_ = -1;
        return UnavailableError(label + " server exited during start-up:\n" + LogTail());
      }
      std::ifstream in(log_path);
      std::string line;
      while (std::getline(in, line)) {
        size_t at = line.find("listening on http://");
        if (at == std::string::npos) continue;
        url_ = line.substr(at + 13);
        while (!url_.empty() && (url_.back() == '\r' || url_.back() == ' ')) url_.pop_back();
        return OkStatus();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return Status(StatusCode::kDeadlineExceeded, label + " server did not start within 300 s:\n" + LogTail());
  }

  void Stop() {
    if (pid_ <= 0) return;
    Interrupt::children[slot_].store(-1);
    kill(pid_, SIGTERM);
    int st = 0;
    for (int i = 0; i < 200; ++i) {  // 10 s
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &st, 0);
    pid_ = -1;
  }

  // User + system CPU seconds of the server so far (-1 if unknown).
  double CpuSeconds() const {
    if (pid_ <= 0) return -1;
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t p = s.rfind(')');
    if (p == std::string::npos) return -1;
    std::istringstream fields(s.substr(p + 1));
    std::string tok;
    std::vector<std::string> v;
    while (fields >> tok) v.push_back(tok);
    if (v.size() < 13) return -1;  // v[0] is field 3 (state); utime = field 14, stime = 15
    return (std::stod(v[11]) + std::stod(v[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }

  std::string LogTail() const {
    std::ifstream in(log_path_);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
  }

  const std::string& url() const { return url_; }

 private:
  std::string label_, log_path_, url_;
  pid_t pid_ = -1;
  int slot_ = 0;
};

std::vector<std::string> SplitWords(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

// --- Client ----------------------------------------------------------------------------

// Prometheus text -> {"name{labels}": value}.
std::map<std::string, double> ScrapeMetrics(const std::string& url) {
  std::map<std::string, double> m;
  httplib::Client cli(url);
  cli.set_read_timeout(30, 0);
  auto res = cli.Get("/metrics");
  if (!res || res->status != 200) return m;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    try {
      m[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
    } catch (...) {
    }
  }
  return m;
}

struct TurnResult {
  int session = 0, turn = 0;
  bool ok = false;
  std::string error;
  double sent_s = 0;   // from the start of the replay
  double ttft_s = 0;   // sent -> first non-empty content chunk
  double total_s = 0;  // sent -> last byte
  int prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  int history_tokens = 0;  // min(prompt, previous prompt + completion); 0 for first turns
  std::string answer;
};

TurnResult SendTurn(httplib::Client& cli, const std::string& model, const std::string& api_key, const json& messages,
                    const std::string& session_id, int max_tokens, bool ignore_eos, Clock::time_point run_start) {
  TurnResult r;
  json body{{"model", model},
            {"messages", messages},
            {"session_id", session_id},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}}};
  if (ignore_eos) body["ignore_eos"] = true;
  StreamedCompletion c = StreamCompletion(cli, "/v1/chat/completions", api_key, body);
  r.sent_s = std::chrono::duration<double>(c.sent - run_start).count();
  r.total_s = std::chrono::duration<double>(Clock::now() - c.sent).count();
  r.error = c.error;
  r.prompt_tokens = c.prompt_tokens;
  r.completion_tokens = c.completion_tokens;
  r.cached_tokens = c.cached_tokens;
  r.answer = std::move(c.text);
  if (!c.ok) return r;
  r.ok = true;
  r.ttft_s = std::chrono::duration<double>(c.first - c.sent).count();
  return r;
}

struct RunResult {
  std::string mode, url;
  std::vector<TurnResult> turns;
  std::map<std::string, double> metrics_delta;
  double cpu_s = -1;
  double wall_s = 0;
};

StatusOr<RunResult> Replay(const std::string& mode, const std::string& url, const ServerProcess* proc,
                           const std::vector<SessionSpec>& work, const SessionsFlags& f, const std::string& nonce) {
  auto model = ServedModelId(url, f.api_key);
  if (!model.ok()) return model.status();
  const bool ignore_eos = !f.no_ignore_eos;
  {  // Warm-up (first-use costs are not the workload); its stored session is deleted.
    httplib::Client cli(url);
    cli.set_read_timeout(600, 0);
    const std::string sid = "warmup-" + nonce;
    TurnResult w = SendTurn(cli, *model, f.api_key, json::array({{{"role", "user"}, {"content", "Hello there."}}}),
                            sid, 8, ignore_eos, Clock::now());
    if (!w.ok) return InternalError(mode + " warm-up request failed: " + w.error);
    if (mode == "CA") {
      // The turn is saved when it retires, maybe just after the reply: wait for it (2 s
      // at most) so that the delete finds it.
      for (int i = 0; i < 40; ++i) {
        auto g = cli.Get("/v1/sessions/" + sid, AuthHeaders(f.api_key));
        if (g && g->status == 200) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      cli.Delete("/v1/sessions/" + sid, AuthHeaders(f.api_key));
    }
  }
  RunResult out;
  out.mode = mode;
  out.url = url;
  const auto before = ScrapeMetrics(url);
  const double cpu0 = proc != nullptr ? proc->CpuSeconds() : -1;
  int total_turns = 0;
  for (const auto& s : work) total_turns += static_cast<int>(s.turns.size());
  std::mutex mu;
  std::atomic<int> done{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (const auto& s : work) {
    threads.emplace_back([&, s] {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(s.arrival_s)));
      httplib::Client cli(url);
      cli.set_read_timeout(900, 0);
      cli.set_keep_alive(true);
      const std::string sid = "bench-" + nonce + "-s" + std::to_string(s.index);
      json messages = json::array();
      int prev_prompt = 0, prev_completion = 0;
      for (size_t k = 0; k < s.turns.size(); ++k) {
        const TurnSpec& t = s.turns[k];
        messages.push_back({{"role", "user"}, {"content", t.user}});
        TurnResult r = SendTurn(cli, *model, f.api_key, messages, sid, t.answer_tokens, ignore_eos, start);
        r.session = s.index;
        r.turn = static_cast<int>(k);
        if (r.ok && k > 0) r.history_tokens = std::min(r.prompt_tokens, prev_prompt + prev_completion);
        const int n = done.fetch_add(1) + 1;
        if (!f.quiet) {
          std::lock_guard<std::mutex> lock(mu);
          if (r.ok) {
            std::fprintf(stderr, "attic: %s %3d/%d  session %2d turn %zu: prompt %5d (history %5d, cached %5d)  TTFT %7.1f ms\n",
                         mode.c_str(), n, total_turns, s.index, k + 1, r.prompt_tokens, r.history_tokens,
                         r.cached_tokens, r.ttft_s * 1e3);
          } else {
            std::fprintf(stderr, "attic: %s %3d/%d  session %2d turn %zu: error: %s\n", mode.c_str(), n, total_turns,
                         s.index, k + 1, r.error.c_str());
          }
        }
        const bool ok = r.ok;
        messages.push_back({{"role", "assistant"}, {"content", r.answer}});
        prev_prompt = r.prompt_tokens;
        prev_completion = r.completion_tokens;
        r.answer.clear();
        r.answer.shrink_to_fit();
        {
          std::lock_guard<std::mutex> lock(mu);
          out.turns.push_back(std::move(r));
        }
        if (!ok) {  // the conversation cannot go on faithfully
          done.fetch_add(static_cast<int>(s.turns.size() - k - 1));
          break;
        }
        if (k + 1 < s.turns.size())
          std::this_thread::sleep_for(std::chrono::duration<double>(t.think_s));
      }
    });
  }
  for (auto& t : threads) t.join();
  out.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (proc != nullptr && cpu0 >= 0) out.cpu_s = proc->CpuSeconds() - cpu0;
  const auto after = ScrapeMetrics(url);
  for (const auto& [k, v] : after) {
    auto b = before.find(k);
    out.metrics_delta[k] = v - (b == before.end() ? 0.0 : b->second);
  }
  std::sort(out.turns.begin(), out.turns.end(),
            [](const TurnResult& a, const TurnResult& b) { return std::tie(a.session, a.turn) < std::tie(b.session, b.turn); });
  return out;
}

// --- Analysis --------------------------------------------------------------------------

// Total length of the union of [start, end) intervals.
double UnionLength(std::vector<std::pair<double, double>> iv) {
  std::sort(iv.begin(), iv.end());
  double total = 0, cur_s = 0, cur_e = -1;
  bool open = false;
  for (const auto& [s, e] : iv) {
    if (!open || s > cur_e) {
      if (open) total += cur_e - cur_s;
      cur_s = s, cur_e = e, open = true;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (open) total += cur_e - cur_s;
  return total;
}

bool HistoryHeavy(const TurnResult& t) {
  return t.ok && t.turn > 0 && t.prompt_tokens > 0 && t.history_tokens >= kHistoryShare * t.prompt_tokens;
}

json Summarize(const RunResult& r) {
  std::vector<double> ttft_all, ttft_heavy;
  std::vector<std::pair<double, double>> prefill;
  double prompt = 0, cached = 0, completion = 0, history = 0, cached_later = 0, sum_ttft = 0;
  int ok = 0, errors = 0;
  std::string first_error;
  std::map<int, std::vector<double>> by_turn;
  for (const auto& t : r.turns) {
    if (!t.ok) {
      ++errors;
      if (first_error.empty()) first_error = t.error;
      continue;
    }
    ++ok;
    ttft_all.push_back(t.ttft_s * 1e3);
    if (HistoryHeavy(t)) ttft_heavy.push_back(t.ttft_s * 1e3);
    by_turn[t.turn + 1].push_back(t.ttft_s * 1e3);
    prefill.emplace_back(t.sent_s, t.sent_s + t.ttft_s);
    sum_ttft += t.ttft_s;
    prompt += t.prompt_tokens;
    cached += t.cached_tokens;
    completion += t.completion_tokens;
    if (t.turn > 0) {
      history += t.history_tokens;
      cached_later += t.cached_tokens;
    }
  }
  const double busy = UnionLength(prefill);
  auto metric = [&](const std::string& k) {
    auto it = r.metrics_delta.find(k);
    return it == r.metrics_delta.end() ? 0.0 : it->second;
  };
  const double lookups = metric("attic_kv_store_lookups_total");
  const double ttft_count = metric("attic_time_to_first_token_seconds_count");
  const double hits_dram = metric("attic_kv_store_hits_total{tier=\"dram\"}");
  const double hits_ssd = metric("attic_kv_store_hits_total{tier=\"ssd\"}");
  json turn_p50 = json::object();
  for (const auto& [k, v] : by_turn) turn_p50[std::to_string(k)] = Percentile(v, 50);
  json s{{"mode", r.mode},
         {"url", r.url},
         {"turns_ok", ok},
         {"turns_failed", errors},
         {"wall_s", r.wall_s},
         {"prompt_tokens", prompt},
         {"cached_tokens", cached},
         {"computed_prompt_tokens", prompt - cached},
         {"completion_tokens", completion},
         {"token_reuse", prompt > 0 ? cached / prompt : 0.0},
         {"history_tokens_later_turns", history},
         {"history_reuse_later_turns", history > 0 ? cached_later / history : 0.0},
         {"store",
          {{"lookups", lookups},
           {"hits_dram", hits_dram},
           {"hits_ssd", hits_ssd},
           {"misses", metric("attic_kv_store_misses_total")},
           {"hit_rate", lookups > 0 ? (hits_dram + hits_ssd) / lookups : 0.0},
           {"hit_rate_dram", lookups > 0 ? hits_dram / lookups : 0.0},
           {"hit_rate_ssd", lookups > 0 ? hits_ssd / lookups : 0.0},
           {"reused_tokens", metric("attic_kv_store_reused_tokens_total")},
           {"bytes_loaded", metric("attic_kv_store_bytes_total{direction=\"load\"}")},
           {"bytes_saved", metric("attic_kv_store_bytes_total{direction=\"save\"}")},
           {"bytes_dram_to_ssd", metric("attic_kv_store_bytes_total{direction=\"dram_to_ssd\"}")},
           {"bytes_ssd_to_dram", metric("attic_kv_store_bytes_total{direction=\"ssd_to_dram\"}")},
           {"prefetches", metric("attic_kv_store_prefetches_total")},
           {"evictions_dram", metric("attic_kv_store_evictions_total{tier=\"dram\"}")},
           {"evictions_ssd", metric("attic_kv_store_evictions_total{tier=\"ssd\"}")},
           {"save_waits", metric("attic_kv_store_save_waits_total")},
           {"lookup_waits", metric("attic_kv_store_lookup_waits_total")},
           {"lookup_wait_s", metric("attic_kv_store_lookup_wait_seconds_total")},
           {"write_buffer_hits", metric("attic_kv_store_write_buffer_hits_total")},
           {"admissions_deferred_for_save", metric("attic_kv_admissions_deferred_total")}}},
         // Where loading stored KV spent its time (servers that export it).
         {"kv_load",
          {{"loads_layerwise", metric("attic_kv_load_total{mode=\"layerwise\"}")},
           {"loads_sync", metric("attic_kv_load_total{mode=\"sync\"}")},
           {"fetch_s", metric("attic_kv_load_seconds_total{phase=\"fetch\"}")},
           {"enter_s", metric("attic_kv_load_seconds_total{phase=\"enter\"}")},
           {"wait_s", metric("attic_kv_load_seconds_total{phase=\"wait\"}")}}},
         {"scheduler_steps", metric("attic_scheduler_steps_total")},
         {"server_cached_tokens", metric("attic_prompt_tokens_reused_total")},
         {"server_ttft_ms_mean", ttft_count > 0 ? metric("attic_time_to_first_token_seconds_sum") * 1e3 / ttft_count : 0.0},
         {"server_queue_wait_ms_mean",
          ttft_count > 0 ? metric("attic_queue_wait_seconds_sum") * 1e3 / ttft_count : 0.0},
         {"ttft_ms_p50", Percentile(ttft_all, 50)},
         {"ttft_ms_p90", Percentile(ttft_all, 90)},
         {"ttft_ms_mean", ttft_all.empty() ? 0.0 : sum_ttft * 1e3 / ttft_all.size()},
         {"history_heavy_turns", ttft_heavy.size()},
         {"ttft_ms_p50_history_heavy", Percentile(ttft_heavy, 50)},
         {"ttft_ms_p90_history_heavy", Percentile(ttft_heavy, 90)},
         {"ttft_ms_p50_by_turn", turn_p50},
         {"prefill_busy_s", busy},
         {"sum_ttft_s", sum_ttft},
         {"prefill_tokens_per_s_served", busy > 0 ? prompt / busy : 0.0},
         {"prefill_tokens_per_s_computed", busy > 0 ? (prompt - cached) / busy : 0.0},
         {"server_cpu_s", r.cpu_s >= 0 ? json(r.cpu_s) : json(nullptr)}};
  if (!first_error.empty()) s["first_error"] = first_error;
  return s;
}

json TurnsJson(const RunResult& r) {
  json a = json::array();
  for (const auto& t : r.turns) {
    json j{{"session", t.session},         {"turn", t.turn + 1},
           {"ok", t.ok},                   {"sent_s", t.sent_s},
           {"ttft_ms", t.ttft_s * 1e3},    {"total_ms", t.total_s * 1e3},
           {"prompt_tokens", t.prompt_tokens}, {"history_tokens", t.history_tokens},
           {"cached_tokens", t.cached_tokens}, {"completion_tokens", t.completion_tokens}};
    if (!t.ok) j["error"] = t.error;
    a.push_back(j);
  }
  return a;
}

double Num(const json& j, const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0.0; }

// "x / y" as a ratio a/b, or "-" when undefined.
std::string Ratio(double a, double b) {
  if (!(b > 0) || !(a >= 0)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3fx", a / b);
  return buf;
}

std::string Fmt(const char* fmt, double a, double b = 0, double c = 0) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), fmt, a, b, c);
  return buf;
}

// --- Plot ------------------------------------------------------------------------------

std::string SvgEscape(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return o;
}

// Two panels: TTFT CDF (log x) and median TTFT by turn index, CA vs RE.
std::string PlotSvg(const std::vector<const RunResult*>& runs, const std::string& title) {
  const double W = 1000, H = 420, top = 50, bottom = 60, panel_w = 400, gap = 100, left = 70;
  const char* colors[] = {"#1f77b4", "#d62728"};
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << SvgEscape(title) << "</text>\n";
  const double ph = H - top - bottom;
  // Data ranges.
  double tmin = 1e18, tmax = 0, ymax = 0;
  int max_turn = 1;
  std::vector<std::vector<double>> ttfts;
  std::vector<std::map<int, double>> medians;
  for (const RunResult* r : runs) {
    std::vector<double> v;
    std::map<int, std::vector<double>> bt;
    for (const auto& t : r->turns)
      if (t.ok) {
        v.push_back(std::max(0.1, t.ttft_s * 1e3));
        bt[t.turn + 1].push_back(t.ttft_s * 1e3);
      }
    std::sort(v.begin(), v.end());
    if (!v.empty()) tmin = std::min(tmin, v.front()), tmax = std::max(tmax, v.back());
    std::map<int, double> med;
    for (const auto& [k, x] : bt) {
      med[k] = Percentile(x, 50);
      ymax = std::max(ymax, med[k]);
      max_turn = std::max(max_turn, k);
    }
    ttfts.push_back(std::move(v));
    medians.push_back(std::move(med));
  }
  if (tmax <= 0) tmin = 1, tmax = 10;
  const double lx0 = std::floor(std::log10(tmin)), lx1 = std::max(lx0 + 1, std::ceil(std::log10(tmax)));
  auto axes = [&](double x0, const std::string& xl, const std::string& yl) {
    o << "<rect x=\"" << x0 << "\" y=\"" << top << "\" width=\"" << panel_w << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#333\"/>\n";
    o << "<text x=\"" << x0 + panel_w / 2 << "\" y=\"" << H - 15 << "\" text-anchor=\"middle\">" << xl << "</text>\n";
    o << "<text transform=\"translate(" << x0 - 50 << "," << top + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
      << yl << "</text>\n";
  };
  // Left: CDF.
  axes(left, "TTFT (ms, log scale)", "fraction of turns");
  for (double e = lx0; e <= lx1; e += 1) {
    double x = left + (e - lx0) / (lx1 - lx0) * panel_w;
    o << "<line x1=\"" << x << "\" y1=\"" << top << "\" x2=\"" << x << "\" y2=\"" << top + ph
      << "\" stroke=\"#ddd\"/><text x=\"" << x << "\" y=\"" << top + ph + 16 << "\" text-anchor=\"middle\">"
      << Fmt("%g", std::pow(10.0, e)) << "</text>\n";
  }
  for (int i = 0; i <= 4; ++i) {
    double y = top + ph - i / 4.0 * ph;
    o << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + panel_w << "\" y2=\"" << y
      << "\" stroke=\"#ddd\"/><text x=\"" << left - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">"
      << Fmt("%.2f", i / 4.0) << "</text>\n";
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto& v = ttfts[r];
    if (v.empty()) continue;
    o << "<polyline fill=\"none\" stroke=\"" << colors[r % 2] << "\" stroke-width=\"2\" points=\"";
    double prev_y = top + ph;
    for (size_t i = 0; i < v.size(); ++i) {
      double x = left + (std::log10(v[i]) - lx0) / (lx1 - lx0) * panel_w;
      double y = top + ph - (i + 1.0) / v.size() * ph;
      o << x << "," << prev_y << " " << x << "," << y << " ";
      prev_y = y;
    }
    o << "\"/>\n";
  }
  // Right: median TTFT by turn index.
  const double rx = left + panel_w + gap;
  axes(rx, "turn of the session", "median TTFT (ms)");
  if (ymax <= 0) ymax = 1;
  const double ystep = std::pow(10.0, std::floor(std::log10(ymax)));
  const double ytop = std::ceil(ymax / ystep) * ystep;
  for (double yv = 0; yv <= ytop + 1e-9; yv += ystep) {
    double y = top + ph - yv / ytop * ph;
    o << "<line x1=\"" << rx << "\" y1=\"" << y << "\" x2=\"" << rx + panel_w << "\" y2=\"" << y
      << "\" stroke=\"#ddd\"/><text x=\"" << rx - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << Fmt("%g", yv)
      << "</text>\n";
  }
  auto tx = [&](int k) { return rx + (max_turn > 1 ? (k - 1.0) / (max_turn - 1) : 0.5) * panel_w; };
  for (int k = 1; k <= max_turn; ++k)
    o << "<text x=\"" << tx(k) << "\" y=\"" << top + ph + 16 << "\" text-anchor=\"middle\">" << k << "</text>\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    o << "<polyline fill=\"none\" stroke=\"" << colors[r % 2] << "\" stroke-width=\"2\" points=\"";
    for (const auto& [k, m] : medians[r]) o << tx(k) << "," << top + ph - m / ytop * ph << " ";
    o << "\"/>\n";
    for (const auto& [k, m] : medians[r])
      o << "<circle cx=\"" << tx(k) << "\" cy=\"" << top + ph - m / ytop * ph << "\" r=\"3.5\" fill=\"" << colors[r % 2]
        << "\"/>\n";
  }
  // Legend.
  for (size_t r = 0; r < runs.size(); ++r) {
    double y = top + 16 + r * 18;
    o << "<line x1=\"" << left + 12 << "\" y1=\"" << y - 4 << "\" x2=\"" << left + 36 << "\" y2=\"" << y - 4
      << "\" stroke=\"" << colors[r % 2] << "\" stroke-width=\"3\"/><text x=\"" << left + 42 << "\" y=\"" << y << "\">"
      << (runs[r]->mode == "CA" ? "CA (KV store)" : "RE (recompute)") << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

// --- Command ---------------------------------------------------------------------------

std::string DefaultDatasets() { return JoinPath(SharedDir(), "datasets"); }

std::vector<std::string> CommonServeArgs(const SessionsFlags& f) {
  std::vector<std::string> a{"-m",           f.model,
                             "-t",           std::to_string(f.threads),
                             "--ctx",        std::to_string(f.ctx),
                             "--host",       "127.0.0.1",
                             "--port",       "0",
                             "--kv-budget", FormatByteSize(f.kv_budget),
                             "--max-running", std::to_string(f.max_running)};
  for (auto& w : SplitWords(f.serve_args)) a.push_back(w);
  return a;
}

int RunBenchSessions(SessionsFlags f) {
  if (f.sessions < 1) return Fail(InvalidArgumentError("--sessions must be >= 1"));
  if (f.rate < 0 || f.think < 0) return Fail(InvalidArgumentError("--rate and --think must be >= 0"));
  if (f.min_turns < 1 || f.max_turns < f.min_turns)
    return Fail(InvalidArgumentError("--min-turns must be >= 1 and <= --max-turns"));
  if (f.min_answer < 1 || f.max_answer < f.min_answer)
    return Fail(InvalidArgumentError("--min-answer must be >= 1 and <= --max-answer"));
  if (f.max_context == 0) f.max_context = f.ctx * 9 / 10;
  if (f.max_prompt_chars < 1 || f.max_context < 1 || f.mean_turns < 1)
    return Fail(InvalidArgumentError("--max-prompt-chars, --max-context and --mean-turns must be >= 1"));
  if (f.only != "both" && f.only != "ca" && f.only != "re")
    return Fail(InvalidArgumentError("--only must be both, ca or re"));
  if (f.datasets.empty()) f.datasets = DefaultDatasets();
  if (f.model.empty()) f.model = JoinPath(ProjectDir(), kDefaultModel);
  if (Status st = PrepareOutput(f.json_out, "--json"); !st.ok()) return Fail(st);
  if (Status st = PrepareOutput(f.plot_out, "--plot"); !st.ok()) return Fail(st);
  std::vector<int> answer_chars;
  StatusOr<std::vector<Conversation>> convs = InternalError("not loaded");
  try {
    convs = LoadConversations(f.datasets, &answer_chars);
  } catch (const json::exception& e) {
    convs = InvalidArgumentError("unexpected dataset layout under '" + f.datasets + "': " + e.what());
  }
  if (!convs.ok()) return Fail(convs.status());
  const std::vector<SessionSpec> work = GenerateWorkload(*convs, answer_chars, f);
  int n_turns = 0;
  for (const auto& s : work) n_turns += static_cast<int>(s.turns.size());
  json workload{{"sessions", f.sessions},
                {"turns", n_turns},
                {"rate_per_s", f.rate},
                {"think_mean_s", f.think},
                {"turns_min_max_mean", {f.min_turns, f.max_turns, f.mean_turns}},
                {"answer_tokens_min_max", {f.min_answer, f.max_answer}},
                {"max_prompt_chars", f.max_prompt_chars},
                {"max_context_est", f.max_context},
                {"ignore_eos", !f.no_ignore_eos},
                {"seed", f.seed},
                {"conversations_in_pool", convs->size()}};
  if (f.trace_only) {
    workload["trace"] = WorkloadJson(work, true);
    std::printf("%s\n", workload.dump().c_str());
    return 0;
  }
  const bool need_spawn = (f.only != "re" && f.ca_url.empty()) || (f.only != "ca" && f.re_url.empty());
  if (need_spawn && !std::filesystem::exists(f.model)) {
    return Fail(NotFoundError(
        "model '" + f.model +
        "' not found (pass --model, or make it, from " + ProjectDir() +
        ", with: build/attic make-model --config ../shared/models/smollm2-135m-instruct-tokenizer/config.json "
        "--tokenizer ../shared/models/smollm2-135m-instruct-tokenizer --dtype bf16 --out-gguf " +
        kDefaultModel + ")"));
  }
  signal(SIGPIPE, SIG_IGN);
  std::string tmpl = (std::filesystem::temp_directory_path() / "attic-bench-sessions-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) return Fail(InternalError("cannot create a temporary directory"));
  const std::string tmp = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmp};
  Interrupt::Install(tmp);
  const std::string nonce = std::to_string(std::chrono::system_clock::now().time_since_epoch().count() % 100000000);
  if (!f.quiet) {
    std::fprintf(stderr, "attic: workload: %d sessions, %d turns, Poisson arrivals %.2f/s, think %.1f s (seed %llu)\n",
                 f.sessions, n_turns, f.rate, f.think, static_cast<unsigned long long>(f.seed));
  }
  std::vector<RunResult> runs;
  for (const std::string mode : {"CA", "RE"}) {
    const bool ca = mode == "CA";
    if ((ca && f.only == "re") || (!ca && f.only == "ca")) continue;
    std::string url = ca ? f.ca_url : f.re_url;
    ServerProcess proc;
    bool spawned = false;
    if (url.empty()) {
      std::vector<std::string> args = CommonServeArgs(f);
      if (ca) {
        args.insert(args.end(), {"--kv-dram", FormatByteSize(f.kv_dram), "--max-resident",
                                 std::to_string(f.ca_max_resident)});
        if (!f.no_ssd) {
          std::string parent = f.ssd_parent.empty() ? tmp : f.ssd_parent;
          std::string dir = parent + "/ssd-" + nonce;
          std::error_code ec;
          std::filesystem::create_directories(dir, ec);
          args.insert(args.end(), {"--kv-ssd-dir", dir, "--kv-ssd", FormatByteSize(f.kv_ssd)});
        }
      } else {
        args.insert(args.end(), {"--max-resident", "0"});
      }
      if (!f.quiet) {
        std::string cmd = "attic serve";
        for (const auto& a : args) cmd += " " + a;
        std::fprintf(stderr, "attic: %s: starting %s\n", mode.c_str(), cmd.c_str());
      }
      Status st = proc.Start(mode, args, tmp + "/" + mode + ".log");
      if (!st.ok()) return Fail(st);
      url = proc.url();
      spawned = true;
      if (!f.quiet) std::fprintf(stderr, "attic: %s: server on %s\n", mode.c_str(), url.c_str());
    }
    auto r = Replay(mode, url, spawned ? &proc : nullptr, work, f, nonce);
    if (spawned) proc.Stop();
    if (!r.ok()) return Fail(r.status());
    // With the store on, make sure the server was really configured as asked.
    if (ca && r->metrics_delta.count("attic_kv_store_lookups_total") == 0)
      std::fprintf(stderr, "attic: warning: the CA server reports no attic_kv_store_* metrics (is its KV store on?)\n");
    runs.push_back(std::move(*r));
  }

  // Report.
  std::vector<json> sums;
  for (const auto& r : runs) sums.push_back(Summarize(r));
  const json* ca = nullptr;
  const json* re = nullptr;
  for (const auto& s : sums) (s["mode"] == "CA" ? ca : re) = &s;
  auto row = [&](const std::string& name, auto cell, const std::string& ratio) {
    std::printf("| %s |", name.c_str());
    for (const auto& s : sums) std::printf(" %s |", cell(s).c_str());
    std::printf(" %s |\n", ratio.c_str());
  };
  auto both = [&](const char* k) -> std::pair<double, double> {
    return {ca ? Num(*ca, k) : -1, re ? Num(*re, k) : -1};
  };
  std::printf("| metric |");
  for (const auto& s : sums) std::printf(" %s |", s["mode"].get<std::string>().c_str());
  std::printf(" CA / RE |\n|---|");
  for (size_t i = 0; i < sums.size(); ++i) std::printf("---|");
  std::printf("---|\n");
  row("turns ok (failed)", [](const json& s) { return Fmt("%.0f (%.0f)", Num(s, "turns_ok"), Num(s, "turns_failed")); }, "");
  {
    auto [a, b] = both("prompt_tokens");
    row("prompt tokens served", [](const json& s) { return Fmt("%.0f", Num(s, "prompt_tokens")); }, Ratio(a, b));
  }
  {
    auto [a, b] = both("computed_prompt_tokens");
    row("prompt tokens computed (served - cached)",
        [](const json& s) { return Fmt("%.0f", Num(s, "computed_prompt_tokens")); }, Ratio(a, b));
  }
  row("store hit rate: all (DRAM / SSD)",
      [](const json& s) {
        const json& st = s["store"];
        return Num(st, "lookups") > 0 ? Fmt("%.1f%% (%.1f%% / %.1f%%)", 100 * Num(st, "hit_rate"),
                                             100 * Num(st, "hit_rate_dram"), 100 * Num(st, "hit_rate_ssd"))
                                      : std::string("- (no store)");
      },
      "");
  row("DRAM hits read from the write buffer (save still queued)",
      [](const json& s) {
        const json& st = s["store"];
        return Num(st, "lookups") > 0 ? Fmt("%.0f", Num(st, "write_buffer_hits")) : std::string("-");
      },
      "");
  row("history tokens reused (later turns)",
      [](const json& s) { return Fmt("%.1f%%", 100 * Num(s, "history_reuse_later_turns")); }, "");
  {
    auto [a, b] = both("ttft_ms_p50");
    auto [c, d] = both("ttft_ms_p90");
    row("TTFT p50 / p90 ms, all turns",
        [](const json& s) { return Fmt("%.1f / %.1f", Num(s, "ttft_ms_p50"), Num(s, "ttft_ms_p90")); },
        Ratio(a, b) + " / " + Ratio(c, d));
  }
  {
    auto [a, b] = both("ttft_ms_p50_history_heavy");
    auto [c, d] = both("ttft_ms_p90_history_heavy");
    row("TTFT p50 / p90 ms, turns >= 90% history (n)",
        [](const json& s) {
          return Fmt("%.1f / %.1f (%.0f)", Num(s, "ttft_ms_p50_history_heavy"), Num(s, "ttft_ms_p90_history_heavy"),
                     Num(s, "history_heavy_turns"));
        },
        Ratio(a, b) + " / " + Ratio(c, d));
  }
  {
    auto [a, b] = both("server_ttft_ms_mean");
    row("server-side TTFT mean ms (of which queue wait)",
        [](const json& s) { return Fmt("%.1f (%.1f)", Num(s, "server_ttft_ms_mean"), Num(s, "server_queue_wait_ms_mean")); },
        Ratio(a, b));
  }
  {
    auto [a, b] = both("prefill_tokens_per_s_served");
    row("prefill throughput, served tok/s", [](const json& s) { return Fmt("%.0f", Num(s, "prefill_tokens_per_s_served")); },
        Ratio(a, b));
  }
  {
    auto [a, b] = both("prefill_tokens_per_s_computed");
    row("prefill throughput, computed tok/s",
        [](const json& s) { return Fmt("%.0f", Num(s, "prefill_tokens_per_s_computed")); }, Ratio(a, b));
  }
  {
    auto [a, b] = both("prefill_busy_s");
    auto [c, d] = both("sum_ttft_s");
    row("prefill busy s / sum of TTFT s",
        [](const json& s) { return Fmt("%.2f / %.2f", Num(s, "prefill_busy_s"), Num(s, "sum_ttft_s")); },
        Ratio(a, b) + " / " + Ratio(c, d));
  }
  if (ca != nullptr && Num((*ca)["kv_load"], "loads_layerwise") + Num((*ca)["kv_load"], "loads_sync") > 0) {
    row("CA stored-KV loads: layer-wise / sync; fetch / enter / wait s",
        [](const json& s) {
          const json& k = s["kv_load"];
          return Fmt("%.0f / %.0f; ", Num(k, "loads_layerwise"), Num(k, "loads_sync")) +
                 Fmt("%.2f / %.2f / %.2f", Num(k, "fetch_s"), Num(k, "enter_s"), Num(k, "wait_s"));
        },
        "");
  }
  {
    auto [a, b] = both("server_cpu_s");
    row("server CPU time s (compute)",
        [](const json& s) { return s["server_cpu_s"].is_number() ? Fmt("%.1f", Num(s, "server_cpu_s")) : std::string("-"); },
        Ratio(a, b));
  }
  {
    auto [a, b] = both("wall_s");
    row("replay wall time s", [](const json& s) { return Fmt("%.1f", Num(s, "wall_s")); }, Ratio(a, b));
  }
  if (ca && re) {
    std::printf("\nmedian TTFT (ms) by turn of the session:\n\n| turn |");
    for (const auto& s : sums) std::printf(" %s |", s["mode"].get<std::string>().c_str());
    std::printf(" CA / RE |\n|---|---|---|---|\n");
    const json& cb = (*ca)["ttft_ms_p50_by_turn"];
    const json& rb = (*re)["ttft_ms_p50_by_turn"];
    for (int k = 1;; ++k) {  // keys are "1", "2", ...: numeric order
      const std::string key = std::to_string(k);
      if (!cb.contains(key) && !rb.contains(key)) break;
      double c = cb.value(key, -1.0), r = rb.value(key, -1.0);
      std::printf("| %d | %s | %s | %s |\n", k, c >= 0 ? Fmt("%.1f", c).c_str() : "-",
                  r >= 0 ? Fmt("%.1f", r).c_str() : "-", Ratio(c, r).c_str());
    }
  }
  json servers{{"threads", f.threads},
               {"ctx", f.ctx},
               {"kv_budget_bytes", f.kv_budget},
               {"max_running", f.max_running},
               {"ca_kv_dram_bytes", f.kv_dram},
               {"ca_kv_ssd_bytes", f.no_ssd ? json(nullptr) : json(f.kv_ssd)},
               {"ca_max_resident", f.ca_max_resident},
               {"re_max_resident", 0},
               {"serve_args", f.serve_args},
               {"ca_url", f.ca_url.empty() ? json("started by the benchmark") : json(f.ca_url)},
               {"re_url", f.re_url.empty() ? json("started by the benchmark") : json(f.re_url)}};
  json out{{"benchmark", "sessions"}, {"model", f.model}, {"workload", workload}, {"servers", servers}};
  for (const auto& s : sums) out[s["mode"] == "CA" ? "ca" : "re"] = s;
  if (ca && re) {
    auto ratio = [&](const char* k) -> json {
      double a = Num(*ca, k), b = Num(*re, k);
      return b > 0 ? json(a / b) : json(nullptr);
    };
    json ratios{{"ttft_p50", ratio("ttft_ms_p50")},
                {"ttft_p90", ratio("ttft_ms_p90")},
                {"ttft_p50_history_heavy", ratio("ttft_ms_p50_history_heavy")},
                {"ttft_p90_history_heavy", ratio("ttft_ms_p90_history_heavy")},
                {"prefill_throughput_served", ratio("prefill_tokens_per_s_served")},
                {"prefill_busy", ratio("prefill_busy_s")},
                {"sum_ttft", ratio("sum_ttft_s")},
                {"server_cpu", ratio("server_cpu_s")},
                {"computed_prompt_tokens", ratio("computed_prompt_tokens")}};
    out["ca_over_re"] = ratios;
    std::printf("\nCA/RE: TTFT p50 on turns >= 90%% history %s; prefill throughput %s\n",
                ratios["ttft_p50_history_heavy"].is_number()
                    ? Fmt("%.3fx", ratios["ttft_p50_history_heavy"].get<double>()).c_str()
                    : "-",
                ratios["prefill_throughput_served"].is_number()
                    ? Fmt("%.2fx", ratios["prefill_throughput_served"].get<double>()).c_str()
                    : "-");
  }
  if (!f.json_out.empty()) {
    json full = out;
    full["workload"]["trace"] = WorkloadJson(work, false);
    for (const auto& r : runs) full[r.mode == "CA" ? "ca_turns" : "re_turns"] = TurnsJson(r);
    if (Status st = WriteOutput(f.json_out, full.dump(2) + "\n", "--json"); !st.ok()) return Fail(st);
  }
  if (!f.plot_out.empty()) {
    std::vector<const RunResult*> rp;
    for (const auto& r : runs) rp.push_back(&r);
    const std::string svg = PlotSvg(rp, "attic bench sessions: " + std::to_string(f.sessions) + " sessions, " +
                                            std::to_string(n_turns) + " turns, " +
                                            std::filesystem::path(f.model).filename().string());
    if (Status st = WriteOutput(f.plot_out, svg, "--plot"); !st.ok()) return Fail(st);
  }
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  for (const auto& s : sums)
    if (Num(s, "turns_failed") > 0) return 1;
  return 0;
}

}  // namespace

void AddBenchSessionsCommand(CLI::App& app, RunFn* run) {
  CLI::App* bench = app.get_subcommand("bench");
  auto* cmd = bench->add_subcommand(
      "sessions", "multi-turn conversations against the server: KV store (CA) vs recomputation (RE)");
  auto f = std::make_shared<SessionsFlags>();
  cmd->add_option("-m,--model", f->model,
                  std::string("model the benchmark's servers load (default: ") + kDefaultModel +
                      " in the project folder, " + ProjectDir() + ")");
  cmd->add_option("--datasets", f->datasets, "datasets folder (default: " + DefaultDatasets() + ")");
  cmd->add_option("--ca-url", f->ca_url, "use this running server (KV store on) for CA instead of starting one");
  cmd->add_option("--re-url", f->re_url, "use this running server (no store, --max-resident 0) for RE");
  cmd->add_option("--only", f->only, "run both modes, or only ca / re")->capture_default_str();
  cmd->add_option("--api-key", f->api_key, "API key for --ca-url / --re-url servers");
  cmd->add_option("-s,--sessions", f->sessions, "conversation sessions")->capture_default_str();
  cmd->add_option("--rate", f->rate, "session arrivals per second (Poisson)")->capture_default_str();
  cmd->add_option("--think", f->think, "mean think time between an answer and the next turn, s (exponential)")
      ->capture_default_str();
  cmd->add_option("--min-turns", f->min_turns, "fewest turns per session")->capture_default_str();
  cmd->add_option("--max-turns", f->max_turns, "most turns per session")->capture_default_str();
  cmd->add_option("--mean-turns", f->mean_turns, "mean of the (clamped) turn-count distribution (ShareGPT: 5.75)")
      ->capture_default_str();
  cmd->add_option("--max-prompt-chars", f->max_prompt_chars, "user messages are cut to this many bytes")
      ->capture_default_str();
  cmd->add_option("--min-answer", f->min_answer, "fewest answer tokens")->capture_default_str();
  cmd->add_option("--max-answer", f->max_answer, "most answer tokens")->capture_default_str();
  cmd->add_option("--max-context", f->max_context,
                  "a session ends before its estimated context passes this (0 = 90% of --ctx)")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "workload seed")->capture_default_str();
  cmd->add_flag("--no-ignore-eos", f->no_ignore_eos, "let answers end at EOS instead of at max_tokens");
  cmd->add_option("-t,--threads", f->threads, "compute threads of the servers")->capture_default_str();
  cmd->add_option("-c,--ctx", f->ctx, "context window of the servers")->capture_default_str();
  AddSizeOption(cmd, "--kv-budget", "--kv-budget-mib", 1 << 20, &f->kv_budget,
                "compute-buffer KV cache of the servers (default 4G)");
  cmd->add_option("--max-running", f->max_running, "sequences batched together")->capture_default_str();
  AddSizeOption(cmd, "--kv-dram", "--kv-dram-mib", 1 << 20, &f->kv_dram, "CA: DRAM tier of the KV store (default 512M)");
  AddSizeOption(cmd, "--kv-ssd", "--kv-ssd-mib", 1 << 20, &f->kv_ssd, "CA: SSD tier of the KV store (default 8G)");
  cmd->add_flag("--no-ssd", f->no_ssd, "CA: no SSD tier");
  cmd->add_option("--ssd-dir", f->ssd_parent, "CA: parent of the SSD tier's fresh directory (default: a temp dir)");
  cmd->add_option("--ca-max-resident", f->ca_max_resident,
                  "CA: finished sequences kept in the compute buffer (0: all reuse goes through the store)")
      ->capture_default_str();
  cmd->add_option("--serve-args", f->serve_args, "extra `attic serve` flags for both servers (one string)");
  cmd->add_option("--json", f->json_out, "write the summary and every turn as JSON to this file");
  cmd->add_option("--plot", f->plot_out, "write an SVG plot (TTFT CDF, median TTFT by turn) to this file");
  cmd->add_flag("--trace-only", f->trace_only, "print the generated workload as JSON and exit (no servers)");
  cmd->add_flag("-q,--quiet", f->quiet, "no per-turn progress on stderr");
  cmd->callback([run, f] { *run = [f] { return RunBenchSessions(*f); }; });
}

}  // namespace attic::cli
