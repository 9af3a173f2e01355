// The `attic` command on bad input: a clear message on stderr and a non-zero exit code,
// never a crash (a signal) or a hang. Runs the real binary.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include "cli/cli_runner.h"
#include "test_util.h"

namespace {

using attic::testing::SharedDir;
using attic::testing::TempDir;

using attic::testing::Result;
using attic::testing::RunAttic;

std::string Stories() { return SharedDir() + "/models/stories260K-hf"; }

void ExpectCleanError(const Result& r, const std::string& needle) {
  EXPECT_FALSE(r.signaled) << r.out;
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("attic: error:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.out;
}

void Copy(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary);
  out << in.rdbuf();
}

TEST(Cli, GeneratesGoldenStory) {
  Result r = RunAttic("generate -m " + Stories() + " -p 'Once upon a time' -n 20");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(", there was a little girl named Lily."), std::string::npos) << r.out;
}

// The KV block size is layout only: greedy output is the same with one-token blocks,
// 16-token blocks (60 tokens cross several) and the default.
TEST(Cli, GreedyOutputDoesNotDependOnTheKvBlockSize) {
  const std::string args = "generate -m " + Stories() + " -p 'Once upon a time' -n 60";
  auto text = [](const Result& r) { return r.out.substr(0, r.out.find("[prompt")); };  // without the timings
  Result def = RunAttic(args);
  ASSERT_EQ(def.exit_code, 0) << def.out;
  EXPECT_NE(def.out.find(", there was a little girl named Lily."), std::string::npos) << def.out;
  for (const char* bs : {"1", "16"}) {
    Result r = RunAttic(args + " --kv-block-size " + bs);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(text(r), text(def)) << "--kv-block-size " << bs;
  }
}

TEST(Cli, MissingModelDirectory) { ExpectCleanError(RunAttic("generate -m /nonexistent/dir -p hi"), "/nonexistent/dir"); }

TEST(Cli, MissingSafetensors) {
  TempDir d;
  Copy(Stories() + "/config.json", d.File("config.json"));
  Copy(Stories() + "/tokenizer.json", d.File("tokenizer.json"));
  ExpectCleanError(RunAttic("generate -m " + d.path() + " -p hi"), "safetensors");
}

TEST(Cli, SafetensorsHeaderLengthPastEndOfFile) {
  TempDir d;
  Copy(Stories() + "/config.json", d.File("config.json"));
  Copy(Stories() + "/tokenizer.json", d.File("tokenizer.json"));
  std::ofstream f(d.File("model.safetensors"), std::ios::binary);
  uint64_t len = 1ull << 40;
  f.write(reinterpret_cast<const char*>(&len), 8);
  f << "{}";
  f.close();
  Result r = RunAttic("generate -m " + d.path() + " -p hi");
  EXPECT_FALSE(r.signaled);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("attic: error:"), std::string::npos) << r.out;
}

TEST(Cli, TruncatedSafetensors) {
  TempDir d;
  Copy(Stories() + "/config.json", d.File("config.json"));
  Copy(Stories() + "/tokenizer.json", d.File("tokenizer.json"));
  std::ifstream in(Stories() + "/model.safetensors", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(d.File("model.safetensors"), std::ios::binary) << all.substr(0, all.size() / 2);
  Result r = RunAttic("generate -m " + d.path() + " -p hi");
  EXPECT_FALSE(r.signaled);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("attic: error:"), std::string::npos) << r.out;
}

TEST(Cli, TruncatedGguf) {
  TempDir d;
  std::ifstream in(SharedDir() + "/models/stories260K-gguf/stories260K.gguf", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t cut : {size_t{3}, size_t{100}, all.size() / 3, all.size() - 10}) {
    std::ofstream(d.File("m.gguf"), std::ios::binary) << all.substr(0, cut);
    Result r = RunAttic("generate -m " + d.File("m.gguf") + " -p hi");
    EXPECT_FALSE(r.signaled) << "cut at " << cut;
    EXPECT_EQ(r.exit_code, 1) << "cut at " << cut << ": " << r.out;
    EXPECT_NE(r.out.find("attic: error:"), std::string::npos) << r.out;
  }
}

TEST(Cli, UnsupportedArchitecture) {
  TempDir d;
  std::ifstream in(Stories() + "/config.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  cfg.replace(cfg.find("LlamaForCausalLM"), 16, "GPT2LMHeadModel");
  std::ofstream(d.File("config.json")) << cfg;
  Copy(Stories() + "/model.safetensors", d.File("model.safetensors"));
  Copy(Stories() + "/tokenizer.json", d.File("tokenizer.json"));
  ExpectCleanError(RunAttic("generate -m " + d.path() + " -p hi"), "GPT2LMHeadModel");
}

TEST(Cli, PromptLongerThanContextWindow) {
  std::string prompt;
  for (int i = 0; i < 400; ++i) prompt += "Once upon a time ";
  TempDir d;
  std::ofstream(d.File("p.txt")) << prompt;
  ExpectCleanError(RunAttic("generate -m " + Stories() + " -f " + d.File("p.txt")), "context window");
}

TEST(Cli, InvalidUtf8Prompt) {
  TempDir d;
  std::ofstream(d.File("p.txt"), std::ios::binary) << "Once upon \xff\xfe a time";
  ExpectCleanError(RunAttic("generate -m " + Stories() + " -f " + d.File("p.txt")), "UTF-8");
}

TEST(Cli, UnknownChatTemplateNamesTheFlag) {
  ExpectCleanError(RunAttic("generate -m " + Stories() + " --chat-template nonsense -p hi"), "--chat-template");
}

// A model without a chat template Attic recognises (stories260K) chats in ChatML in
// serve, chat and generate --chat alike, and each says so once at start-up; --help
// names every family the flag accepts.
TEST(Cli, AModelWithoutAChatTemplateChatsInChatMlEverywhereAndSaysSo) {
  const std::string said = "attic: chat template: chatml (the model has none Attic recognises";
  auto count = [](const std::string& text, const std::string& needle) {
    int n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  Result gen = RunAttic("generate -m " + Stories() + " --chat -p 'Tell me a story.' -n 8 --temp 0");
  EXPECT_EQ(gen.exit_code, 0) << gen.out;
  EXPECT_EQ(count(gen.out, said), 1) << gen.out;
  TempDir d;
  std::ofstream(d.File("in.txt")) << "Tell me a story.\n";
  Result chat = RunAttic("chat -m " + Stories() + " -n 8 --temp 0 < " + d.File("in.txt"));
  EXPECT_EQ(chat.exit_code, 0) << chat.out;
  EXPECT_EQ(count(chat.out, said), 1) << chat.out;
  // The same reply: both render the user message with ChatML's template.
  const std::string gen_text = gen.out.substr(0, gen.out.find("\n[prompt"));
  EXPECT_NE(chat.out.find(gen_text.substr(gen_text.find('\n') + 1)), std::string::npos)
      << "generate --chat:\n" << gen.out << "\nchat:\n" << chat.out;
  // serve says it at start-up too (here the start fails later, at an address it cannot bind).
  Result serve = RunAttic("serve -m " + Stories() + " --host 256.0.0.1 --port 0");
  EXPECT_EQ(count(serve.out, said), 1) << serve.out;
  Result plain = RunAttic("generate -m " + Stories() + " -p hi -n 4");
  EXPECT_EQ(count(plain.out, "chat template"), 0) << "printed without --chat: " << plain.out;
  for (const char* cmd : {"serve", "chat", "generate"}) {
    Result help = RunAttic(std::string(cmd) + " --help");
    EXPECT_NE(help.out.find("chatml, llama3, llama2, mistral"), std::string::npos) << cmd << ": " << help.out;
  }
}

// A port another server listens on is an error, even when that server allowed port sharing
// (SO_REUSEPORT, as httplib's defaults do): two servers splitting one port's connections
// would serve each conversation's turns from different KV stores.
TEST(Cli, ServeOnAPortInUseIsAnError) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  int yes = 1;
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof(yes)), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  ExpectCleanError(RunAttic("serve -m " + Stories() + " --port " + std::to_string(port)), "address in use");
  ::close(fd);
}

TEST(Cli, BadSamplingValue) { ExpectCleanError(RunAttic("generate -m " + Stories() + " -p hi --top-p 0"), "top_p"); }

// The last line of `r.out` parsed as JSON (discarded if it is not).
nlohmann::json LastJsonLine(const Result& r) {
  std::string s = r.out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return nlohmann::json::parse(s.substr(s.rfind('\n') + 1), nullptr, false);
}

TEST(Cli, BenchSessionsTraceIsSeededAndBounded) {
  const std::string args = "bench sessions --trace-only --datasets " + SharedDir() +
                           "/datasets -s 20 --min-turns 2 --max-turns 5 --min-answer 10 --max-answer 50 --max-context 900";
  Result a = RunAttic(args + " --seed 3"), b = RunAttic(args + " --seed 3"), c = RunAttic(args + " --seed 4");
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  nlohmann::json w = LastJsonLine(a);
  ASSERT_FALSE(w.is_discarded()) << a.out;
  ASSERT_EQ(w["trace"].size(), 20u);
  double prev_arrival = 0;
  int turns = 0;
  for (const auto& s : w["trace"]) {
    EXPECT_GE(s["arrival_s"].get<double>(), prev_arrival);
    prev_arrival = s["arrival_s"].get<double>();
    ASSERT_GE(s["turns"].size(), 1u);
    EXPECT_LE(s["turns"].size(), 5u);
    int prev_prompt = 0;
    for (const auto& t : s["turns"]) {
      EXPECT_GE(t["answer_tokens"].get<int>(), 10);
      EXPECT_LE(t["answer_tokens"].get<int>(), 50);
      EXPECT_FALSE(t["user"].get<std::string>().empty());
      EXPECT_GT(t["est_prompt_tokens"].get<int>(), prev_prompt);  // the history grows
      EXPECT_LE(t["est_prompt_tokens"].get<int>() + t["answer_tokens"].get<int>(), 900);
      prev_prompt = t["est_prompt_tokens"].get<int>();
      ++turns;
    }
  }
  EXPECT_EQ(w["turns"].get<int>(), turns);
}

// `attic bench`'s decode phases: every decode token timed, the phases in the forward's
// order within the step's wall time, and the bytes each reads from stories260K's shape
// (its config.json: hidden 64, kv_dim 4 x 8 = 32, intermediate 172, 5 layers, vocab 512,
// f32 weights, tied lm_head) and the f32 KV at the decode run's mean context.
TEST(Cli, BenchReportsWhereEachDecodeTokensTimeWent) {
  TempDir d;
  Result r = RunAttic("bench -m " + Stories() + " -t 1 -p 8 -n 6 --gen-after 10 -r 1 --json " + d.File("b.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("| attention |"), std::string::npos) << r.out;
  std::ifstream in(d.File("b.json"));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  const auto& p = j["decode_phases"];
  EXPECT_EQ(p["tokens"].get<int>(), 6);
  const std::vector<std::string> names = {"norm_qkv", "rope_kv", "attention", "out", "ffn_gate_up", "ffn_down", "logits"};
  ASSERT_EQ(p["phases"].size(), names.size());
  const double h = 64, kvd = 32, inter = 172, layers = 5, vocab = 512;
  const double mean_ctx = 10 + 6 / 2.0;
  const std::vector<double> bytes = {layers * (h * h + 2 * h * kvd) * 4, 0, layers * 2 * kvd * mean_ctx * 4,
                                     layers * h * h * 4, layers * 2 * h * inter * 4, layers * inter * h * 4,
                                     vocab * h * 4};
  double sum = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& ph = p["phases"][i];
    EXPECT_EQ(ph["phase"].get<std::string>(), names[i]);
    EXPECT_GE(ph["ms_per_token"].get<double>(), 0.0) << names[i];
    EXPECT_EQ(ph["bytes_per_token"].get<double>(), bytes[i]) << names[i];
    sum += ph["ms_per_token"].get<double>();
  }
  EXPECT_LE(sum, p["ms_per_token"].get<double>() * (1 + 1e-12));
  EXPECT_GE(p["other_ms_per_token"].get<double>(), -1e-12);
}

// Two sessions of two turns against real servers started by the benchmark: CA reuses
// stored KV (store hits, cached tokens), RE recomputes everything.
TEST(Cli, BenchSessionsCaReusesReRecomputes) {
  TempDir d;
  Result r = RunAttic("bench sessions -q -m " + Stories() + " --datasets " + SharedDir() +
                      "/datasets -s 2 --min-turns 2 --max-turns 2 --rate 0 --think 0 --max-prompt-chars 120"
                      " --min-answer 8 --max-answer 8 --max-context 450 -c 512 -t 1 --kv-budget-mib 16"
                      " --kv-dram-mib 64 --kv-ssd-mib 64 --ssd-dir " + d.path() + " --json " + d.File("s.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json j = LastJsonLine(r);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  const auto& ca = j["ca"];
  const auto& re = j["re"];
  EXPECT_EQ(ca["turns_ok"], 4);
  EXPECT_EQ(re["turns_ok"], 4);
  EXPECT_GT(ca["store"]["hits_dram"].get<double>() + ca["store"]["hits_ssd"].get<double>(), 0);
  EXPECT_GT(ca["cached_tokens"].get<double>(), 0);
  EXPECT_GT(ca["history_reuse_later_turns"].get<double>(), 0.5);
  EXPECT_EQ(re["cached_tokens"].get<double>(), 0);
  EXPECT_EQ(re["store"]["lookups"].get<double>(), 0);
  EXPECT_EQ(ca["prompt_tokens"].get<double>() > 0, true);
  EXPECT_TRUE(j["ca_over_re"]["prefill_throughput_served"].is_number());
  // Measured figures, not development targets.
  EXPECT_EQ(r.out.find("target"), std::string::npos) << r.out;
  EXPECT_FALSE(j.contains("targets"));
  std::ifstream in(d.File("s.json"));
  nlohmann::json full = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(full.is_discarded());
  EXPECT_EQ(full["ca_turns"].size(), 4u);
  EXPECT_EQ(full["re_turns"].size(), 4u);
}

}  // namespace
