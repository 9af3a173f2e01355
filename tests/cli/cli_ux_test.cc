// The `attic` command as a new user meets it: errors and exit codes, --version, size
// flags with units (and their old spellings), -c, the context-window warning, outputs
// (--json) that are written or fail early, `generate`'s output, `chat`'s commands and
// Ctrl-C. Runs the real binary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "attic/model/writer.h"
#include "cli/cli_runner.h"
#include "test_util.h"

namespace {

using attic::testing::Child;
using attic::testing::Result;
using attic::testing::RunAttic;
using attic::testing::SharedDir;
using attic::testing::TempDir;

std::string Stories() { return SharedDir() + "/models/stories260K-hf"; }

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

void ExpectUsageError(const Result& r, const std::string& needle) {
  EXPECT_FALSE(r.signaled) << r.out;
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(r.out.rfind("attic: error: ", 0), 0u) << "the first line is not an 'attic: error:' line: " << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.out;
}

TEST(CliUx, CommandLineMistakesAreUsageErrors) {
  ExpectUsageError(RunAttic("frobnicate"), "unknown command 'frobnicate'");
  ExpectUsageError(RunAttic("eval frobnicate"), "unknown command 'frobnicate' (attic eval takes: perplexity");
  ExpectUsageError(RunAttic("frobnicate"), "serve");  // lists the commands
  ExpectUsageError(RunAttic(""), "attic: error:");
  ExpectUsageError(RunAttic("generate --no-such-flag"), "--no-such-flag");
  ExpectUsageError(RunAttic("generate -n many"), "many");
  ExpectUsageError(RunAttic("serve --kv-dtype f64"), "f64");
  ExpectUsageError(RunAttic("generate --kv-dtype-v q4_1"), "--kv-dtype-v: q4_1");
  ExpectUsageError(RunAttic("serve --kv-dtype-k bf16"), "--kv-dtype-k: bf16");
  ExpectUsageError(RunAttic("serve --kv-dram 12X"), "invalid size '12X'");
  // The remote tier's flags (checked before the model loads; nothing connects).
  // The remote tier goes below the DRAM tier, which is on by default: not with --kv-dram 0.
  ExpectUsageError(RunAttic("serve --kv-dram 0 --kv-remote redis://127.0.0.1:1"),
                   "--kv-remote needs the DRAM tier above it: not --kv-dram 0");
  ExpectUsageError(RunAttic("serve --kv-dram 1M --kv-remote rediss://h:1"), "only redis:// is supported");
  ExpectUsageError(RunAttic("serve --kv-dram 1M --kv-remote redis://h"), "not host:port");
  ExpectUsageError(RunAttic("serve --kv-dram 1M --kv-remote redis://h:1 --kv-remote-write sideways"),
                   "--kv-remote-write must be 'through'");
  ExpectUsageError(RunAttic("serve --kv-dram 1M --kv-remote redis://h:1 --kv-remote-timeout 0"),
                   "--kv-remote-timeout must be at least 1 ms");
  ExpectUsageError(RunAttic("make-model --shape smollm2-135m"), "--out-hf");
  // --help is not an error.
  Result help = RunAttic("serve --help");
  EXPECT_EQ(help.exit_code, 0) << help.out;
  EXPECT_NE(help.out.find("--kv-dram"), std::string::npos);
}

TEST(CliUx, VersionNamesTheCommitAndTheKernels) {
  Result r = RunAttic("--version");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("attic 0.", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("commit "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("commit unknown"), std::string::npos) << r.out;  // built from a git checkout
  const bool isa = r.out.find("avx512") != std::string::npos || r.out.find("avx2") != std::string::npos ||
                   r.out.find("generic") != std::string::npos;
  EXPECT_TRUE(isa) << r.out;
}

// Defaults that name files (the default model, the datasets of bench sessions) are found
// from the executable's place: the commands work from any folder, with no environment.
TEST(CliUx, DefaultsDoNotDependOnTheCurrentFolder) {
  const std::string bin = attic::testing::AtticBinary();
  auto run = [&](const std::string& args) {
    Result r;
    const std::string cmd = "cd / && env -u ATTIC_SHARED_DIR -u ATTIC_MODEL timeout 60 " + bin + " " + args + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
    const int st = pclose(p);
    r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
  };
  Result gen = run("generate -p 'Once upon a time' -n 8");
  EXPECT_EQ(gen.exit_code, 0) << gen.out;
  EXPECT_NE(gen.out.find("there was a little girl"), std::string::npos) << gen.out;
  Result trace = run("bench sessions --trace-only -s 2");
  EXPECT_EQ(trace.exit_code, 0) << trace.out;
  EXPECT_NE(trace.out.find("\"conversations_in_pool\""), std::string::npos) << trace.out.substr(0, 400);
}

TEST(CliUx, SizeFlagsTakeUnitsAndTheOldSpellingsStillWork) {
  // The KV pool the server reports: stories260K's KV is 1280 bytes a token, 64-token blocks.
  auto kv_mib = [](const std::string& log) {
    const size_t at = log.find(" blocks = ");
    return at == std::string::npos ? std::string("?") : log.substr(at + 10, log.find(" MiB", at) - at - 10);
  };
  Child a({"serve", "-m", Stories(), "--port", "0", "--kv-budget", "48M"});
  ASSERT_TRUE(a.WaitFor(true, "listening", 0, 30)) << a.err();
  EXPECT_EQ(kv_mib(a.err()), "48") << a.err();
  a.Signal(SIGINT);
  EXPECT_EQ(a.Wait(30), 0);
  Child b({"serve", "-m", Stories(), "--port", "0", "--kv-budget-mib", "48"});
  ASSERT_TRUE(b.WaitFor(true, "listening", 0, 30)) << b.err();
  EXPECT_EQ(kv_mib(b.err()), "48") << b.err();
  b.Signal(SIGINT);
  EXPECT_EQ(b.Wait(30), 0);
  Child c({"serve", "-m", Stories(), "--port", "0", "--kv-budget", "0.5GiB"});
  ASSERT_TRUE(c.WaitFor(true, "listening", 0, 30)) << c.err();
  EXPECT_EQ(kv_mib(c.err()), "512") << c.err();
  c.Signal(SIGINT);
  EXPECT_EQ(c.Wait(30), 0);
}

// The KV store is on by default (docs/store.md, "The DRAM tier by default"): a server
// started with no store flags names its automatic DRAM tier in the start-up line;
// --kv-dram 0 turns the store off and --kv-dram SIZE is taken as given. (The
// integration test store_default.test.mjs checks the tier the running server has.)
TEST(CliUx, ServeKeepsADramTierUnlessToldNotTo) {
  auto serving_line = [](const std::string& log) {
    const size_t at = log.find("attic: serving ");
    return at == std::string::npos ? std::string() : log.substr(at, log.find('\n', at) - at);
  };
  auto start = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"serve", "-m", Stories(), "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    Child s(args);
    EXPECT_TRUE(s.WaitFor(true, "listening", 0, 30)) << s.err();
    const std::string line = serving_line(s.err());
    s.Signal(SIGINT);
    EXPECT_EQ(s.Wait(30), 0) << s.err();
    return line;
  };
  const std::string bare = start({});
  EXPECT_NE(bare.find("KV store: DRAM "), std::string::npos) << "no DRAM tier without store flags: " << bare;
  EXPECT_NE(bare.find(" (automatic)"), std::string::npos) << bare;
  const std::string off = start({"--kv-dram", "0"});
  EXPECT_NE(off.find("no KV store (--kv-dram 0)"), std::string::npos) << off;
  EXPECT_EQ(off.find("KV store: DRAM"), std::string::npos) << off;
  const std::string set = start({"--kv-dram", "48M"});
  EXPECT_NE(set.find("KV store: DRAM 48M,"), std::string::npos) << set;
}

// The store's entry type (docs/store.md "Which dtype is stored"): the compute buffer's
// by default, the more exact of K's and V's when they differ, or --kv-store-dtype; a type
// the store has not is a usage error naming the ones it has.
TEST(CliUx, TheStoresEntryTypeFollowsTheBufferUnlessGiven) {
  auto entries = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"serve", "-m", Stories(), "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    Child s(args);
    EXPECT_TRUE(s.WaitFor(true, "listening", 0, 30)) << s.err();
    const std::string log = s.err();
    s.Signal(SIGINT);
    EXPECT_EQ(s.Wait(30), 0) << log;
    const size_t at = log.find("entries hold ");
    return at == std::string::npos ? log : log.substr(at + 13, log.find(' ', at + 13) - at - 13);
  };
  EXPECT_EQ(entries({}), "f32");
  EXPECT_EQ(entries({"--kv-dtype", "q4_0"}), "q4_0");
  EXPECT_EQ(entries({"--kv-dtype-k", "q8_0", "--kv-dtype-v", "q4_0"}), "q8_0/q4_0");
  EXPECT_EQ(entries({"--kv-dtype-k", "q4_0", "--kv-dtype-v", "q8_0"}), "q8_0");
  EXPECT_EQ(entries({"--kv-dtype-k", "f16", "--kv-dtype-v", "q4_0"}), "f16");
  EXPECT_EQ(entries({"--kv-store-dtype", "q4_0"}), "q4_0");
  EXPECT_EQ(entries({"--kv-dtype", "q4_0", "--kv-store-dtype", "q8_0"}), "q8_0");
  EXPECT_EQ(entries({"--kv-store-dtype", "q8_0/q4_0"}), "q8_0/q4_0");
  // kivi4 (K per channel) is a store type only: chosen by name, never by the buffer.
  EXPECT_EQ(entries({"--kv-store-dtype", "kivi4"}), "kivi4");
  EXPECT_EQ(entries({"--kv-dtype", "q4_0", "--kv-store-dtype", "kivi4"}), "kivi4");
  Result bad = RunAttic("serve -m " + Stories() + " --port 0 --kv-store-dtype q4_1");
  EXPECT_NE(bad.exit_code, 0) << bad.out;
  EXPECT_NE(bad.out.find("--kv-store-dtype"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("q4_0"), std::string::npos) << "the accepted types are named: " << bad.out;
}

// SIGINT as soon as the server says it listens stops it gracefully (exit 0), never a
// hang or 130: the race window is small, so a few rounds.
TEST(CliUx, ServeStopsGracefullyOnASignalAsSoonAsItListens) {
  for (int round = 0; round < 8; ++round) {
    Child s({"serve", "-m", Stories(), "--port", "0"});
    ASSERT_TRUE(s.WaitFor(true, "listening", 0, 30)) << s.err();
    s.Signal(SIGINT);
    EXPECT_EQ(s.Wait(30), 0) << "round " << round << ": " << s.err();
  }
}

TEST(CliUx, DashCMeansTheContextWindowEverywhere) {
  // bench serve has no context window: its concurrency is --concurrency only.
  ExpectUsageError(RunAttic("bench serve --url http://127.0.0.1:9 -c 1 2"), "--concurrency");
  Result r = RunAttic("generate -m " + Stories() + " -c 64 -p 'Once upon a time' -n 100");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  // 5 prompt tokens and 59 generated fill the 64 slots; the 60th is sampled, never stored.
  EXPECT_NE(r.out.find("generated 60 tokens"), std::string::npos) << "-c 64 should end at the window: " << r.out;
}

TEST(CliUx, AContextBeyondTheTrainedLengthWarns) {
  Result r = RunAttic("generate -m " + Stories() + " --ctx 1024 -p hi -n 2");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("attic: warning: context window of 1024 tokens exceeds the model's trained length of 512"),
            std::string::npos)
      << r.out;
  Result ok = RunAttic("generate -m " + Stories() + " --ctx 512 -p hi -n 2");
  EXPECT_EQ(ok.out.find("warning"), std::string::npos) << ok.out;
}

TEST(CliUx, JsonOutputCreatesItsFolderOrFailsBeforeTheWork) {
  TempDir d;
  const std::string path = d.path() + "/new/deeper/bench.json";
  Result r = RunAttic("bench -m " + Stories() + " -p 16 -n 4 --gen-after 8 -r 1 --json " + path);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "no " << path << ": " << r.out;
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["results"].size(), 2u);
  // A path under a regular file cannot be written: an error, and no benchmark ran.
  std::ofstream(d.File("plain")) << "x";
  Result bad = RunAttic("bench -m " + Stories() + " -p 16 -n 4 --gen-after 8 -r 1 --json " + d.File("plain") + "/x.json");
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_NE(bad.out.find("attic: error: --json"), std::string::npos) << bad.out;
  EXPECT_EQ(bad.out.find("pp16"), std::string::npos) << "the benchmark ran before the check: " << bad.out;
}

TEST(CliUx, BenchJsonGivesParametersAndBytes) {
  TempDir d;
  Result r = RunAttic("bench -m " + Stories() + " -p 16 -n 0 -r 1 --json " + d.File("b.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(d.File("b.json")));
  // stories260K (config.json): embeddings 512x64 (tied), 5 layers of q 64x64, k and v
  // 32x64, o 64x64, gate/up/down 172x64 each and two norms of 64, a final norm of 64.
  const int64_t per_layer = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 172 * 64 + 2 * 64;
  const int64_t params = 512 * 64 + 5 * per_layer + 64;
  EXPECT_EQ(j["params"].get<int64_t>(), params);
  EXPECT_EQ(j["weight_bytes"].get<int64_t>(), params * 4);  // f32
}

TEST(CliUx, GenerateEndsItsTextWithANewlineAndReportsOnStderr) {
  Result both = RunAttic("generate -m " + Stories() + " -p 'Once upon a time' -n 12");
  ASSERT_EQ(both.exit_code, 0) << both.out;
  const size_t stats = both.out.find("[prompt ");
  ASSERT_NE(stats, std::string::npos) << both.out;
  EXPECT_EQ(both.out[stats - 1], '\n') << "statistics not on their own line: " << both.out;
  Result out_only = RunAttic("generate -m " + Stories() + " -p 'Once upon a time' -n 12 2>/dev/null | cat");
  EXPECT_EQ(out_only.out.find("[prompt"), std::string::npos) << out_only.out;
  ASSERT_FALSE(out_only.out.empty());
  EXPECT_EQ(out_only.out.back(), '\n');
}

// A random-weight model whose replies are long (random weights rarely pick an end
// token) and slow enough to interrupt: SmolLM2's 49,152-token vocabulary.
std::string WriteSlowChatModel(const TempDir& d) {
  attic::model::ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 256;
  c.intermediate_size = 688;
  c.n_layers = 4;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 49152;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.tie_word_embeddings = true;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  attic::model::WriteOptions wo;
  wo.dtype = attic::DType::kBF16;
  const std::string tok = SharedDir() + "/models/smollm2-135m-instruct-tokenizer";
  wo.tokenizer.tokenizer_json_path = tok + "/tokenizer.json";
  const std::string path = d.File("slow-chat");
  const attic::Status st = attic::model::WriteRandomHfModel(path, c, attic::model::RandomWeights{3, 0.5f}, wo);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return path;
}

TEST(CliUx, ChatCtrlCStopsTheReplyNotTheConversation) {
  TempDir d;
  const std::string model = WriteSlowChatModel(d);
  Child chat({"chat", "-m", model, "-n", "3000", "--temp", "0", "--stats", "-t", "1"});
  ASSERT_TRUE(chat.WaitFor(true, "> ", 0, 60)) << chat.err();
  chat.Write("/help\n");
  ASSERT_TRUE(chat.WaitFor(true, "/reset", 0, 10)) << chat.err();
  EXPECT_NE(chat.err().find("/exit"), std::string::npos) << chat.err();
  // A long reply, stopped as soon as it has started.
  chat.Write("Tell me everything about the sea.\n");
  ASSERT_TRUE(chat.WaitFor(false, " ", 0, 60)) << chat.err();
  chat.Signal(SIGINT);
  ASSERT_TRUE(chat.WaitFor(true, "reply stopped", 0, 30)) << chat.err();
  ASSERT_TRUE(chat.WaitFor(true, "[reused 0 of", 0, 10)) << chat.err();
  EXPECT_TRUE(chat.Alive());
  // The next turn reuses the KV of the first one (prompt and stopped reply).
  const size_t mark = chat.err().size();
  chat.Write("And about the sky?\n");
  const size_t out_mark = chat.out().size();
  ASSERT_TRUE(chat.WaitFor(false, " ", out_mark, 60)) << chat.err();
  chat.Signal(SIGINT);
  ASSERT_TRUE(chat.WaitFor(true, "[reused ", mark, 30)) << chat.err();
  const std::string second = chat.err().substr(chat.err().find("[reused ", mark));
  EXPECT_NE(second.rfind("[reused 0 of", 0), 0u) << "the second turn reused nothing: " << second;
  chat.Write("/exit\n");
  EXPECT_EQ(chat.Wait(30), 0) << chat.err();
}

// A conversation longer than the window drops its oldest messages (and says so) instead of
// failing every later turn.
TEST(CliUx, ChatDropsTheOldestMessagesWhenTheWindowIsFull) {
  TempDir d;
  std::ofstream in(d.File("in.txt"));
  for (int i = 0; i < 6; ++i) in << "Tell me a story about a dog and a cat who play in the park.\n";
  in.close();
  Result r = RunAttic("chat -m " + Stories() + " --ctx 128 -n 24 --temp 0 --stats < " + d.File("in.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("filled the context window (128 tokens): dropped its"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/reset starts over"), std::string::npos) << r.out;
  EXPECT_EQ(Count(r.out, "[reused "), 6) << "every turn answered: " << r.out;
  EXPECT_EQ(r.out.find("attic: error"), std::string::npos) << r.out;
}

TEST(CliUx, ChatHelpListsItsCommands) {
  Result r = RunAttic("chat --help");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* c : {"/help", "/reset", "/exit", "Ctrl-C"}) EXPECT_NE(r.out.find(c), std::string::npos) << c;
}

// The KV cache is allocated once at start-up, so its progress bar (on a terminal) is
// drawn once. `script` gives the server a terminal; a 262144-token window makes one
// context of stories260K's KV (320 MiB) big enough for a bar.
TEST(CliUx, TheKvCacheProgressBarAppearsOnce) {
  if (std::system("command -v script > /dev/null") != 0) GTEST_SKIP() << "no script(1)";
  TempDir d;
  // Interrupted once it says it is listening (script -f writes the typescript as output
  // comes; "o[n]" keeps the pattern from matching the command line that script writes
  // there), or once it has exited without: no guess at how long start-up takes.
  const std::string ts = d.File("typescript");
  const std::string cmd = std::string("script -qefc \"") + attic::testing::AtticBinary() + " serve -m " + Stories() +
                          " --ctx 262144 --kv-budget-cap 1G --port 0 & p=\\$!; until grep -q 'listening o[n]' '" + ts +
                          "' || ! kill -0 \\$p 2>/dev/null; do sleep 0.1; done; kill -INT \\$p; wait \\$p\" '" + ts +
                          "' > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(d.File("typescript"));
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_NE(log.find("listening"), std::string::npos) << log;
  int bars = 0;
  for (size_t at = 0; (at = log.find("allocating KV cache", at)) != std::string::npos; ++bars) {
    at = log.find('\n', at);  // a bar's redraws end at its one newline
    if (at == std::string::npos) break;
  }
  EXPECT_EQ(bars, 1) << log;
}

}  // namespace
