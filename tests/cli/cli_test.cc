// The `attic` command on bad input: a clear message on stderr and a non-zero exit code,
// never a crash (a signal) or a hang. Runs the real binary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "test_util.h"

namespace {

using attic::testing::SharedDir;
using attic::testing::TempDir;

struct Result {
  int exit_code = -1;
  bool signaled = false;
  std::string out;  // stdout + stderr
};

Result RunAttic(const std::string& args) {
  std::string cmd = std::string("timeout 60 ") + ATTIC_BINARY + " " + args + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  if (WIFEXITED(st)) r.exit_code = WEXITSTATUS(st);
  r.signaled = WIFSIGNALED(st) || r.exit_code >= 124;
  return r;
}

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
  ExpectCleanError(RunAttic("generate -m " + Stories() + " --chat -p hi"), "--chat-template");
  ExpectCleanError(RunAttic("generate -m " + Stories() + " --chat-template nonsense -p hi"), "--chat-template");
}

TEST(Cli, BadSamplingValue) { ExpectCleanError(RunAttic("generate -m " + Stories() + " -p hi --top-p 0"), "top_p"); }

}  // namespace
