// `attic eval` as a user runs it: the perplexity table and JSON (the figure is the one
// the float64 naive forward gives, see tests/eval/perplexity_test.cc), the needle grid's
// table, JSON and SVG, and command-line mistakes as usage errors. Runs the real binary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "cli/cli_runner.h"
#include "test_util.h"

namespace {

using attic::testing::Result;
using attic::testing::RunAttic;
using attic::testing::SharedDir;
using attic::testing::TempDir;

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void ExpectUsageError(const Result& r, const std::string& needle) {
  EXPECT_FALSE(r.signaled) << r.out;
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("attic: error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.out;
}

TEST(EvalCli, PerplexityOfStories260KOnHeldOutText) {
  TempDir d;
  const std::string json = d.File("out/ppl.json");  // its folder is created
  Result r = RunAttic("eval perplexity -m " + SharedDir() + "/models/stories260K-hf -l 64 --max-windows 2 --json " +
                      json);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("| 64 | full | 2 | 126 | 4.5817 |"), std::string::npos) << r.out;
  const auto js = nlohmann::json::parse(Read(json));
  ASSERT_EQ(js["results"].size(), 1u);
  const auto& row = js["results"][0];
  EXPECT_EQ(row["method"], "full");
  EXPECT_EQ(row["windows"], 2);
  EXPECT_EQ(row["scored_tokens"], 126);
  // The float64 naive forward's perplexity of these two windows (BOS + the first 2 x 63
  // tokens of TinyStories-valid-sample.txt, tokenized whole): 4.58173818.
  EXPECT_NEAR(row["perplexity"].get<double>(), 4.58173818, 1e-5 * 4.58173818);
  EXPECT_DOUBLE_EQ(row["kl_mean"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(row["top1_agreement"].get<double>(), 1.0);
}

TEST(EvalCli, KvTypesAxisComparesEachTypeWithTheFirst) {
  TempDir d;
  Result r = RunAttic("eval perplexity -m " + SharedDir() + "/models/stories260K-hf -l 64 --max-windows 2 " +
                      "--kv-dtypes f32,q8_0 --json " + d.File("ppl.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("| length | KV | method |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| 64 | f32 | full | 2 | 126 | 4.5817 |"), std::string::npos) << r.out;
  const auto js = nlohmann::json::parse(Read(d.File("ppl.json")));
  EXPECT_EQ(js["reference_kv_dtype"], "f32");
  ASSERT_EQ(js["results"].size(), 2u);
  const auto& f32 = js["results"][0];
  const auto& q8 = js["results"][1];
  EXPECT_EQ(f32["kv_dtype"], "f32");
  EXPECT_EQ(q8["kv_dtype"], "q8_0");
  // The reference row is the float64 naive forward's figure (as above), untouched by the axis.
  EXPECT_NEAR(f32["perplexity"].get<double>(), 4.58173818, 1e-5 * 4.58173818);
  EXPECT_DOUBLE_EQ(f32["kl_vs_reference_kv_mean"].get<double>(), 0.0);
  EXPECT_GT(q8["kl_vs_reference_kv_mean"].get<double>(), 0.0);
  EXPECT_NEAR(q8["perplexity_vs_reference_kv_pct"].get<double>(),
              100 * (q8["perplexity"].get<double>() / f32["perplexity"].get<double>() - 1), 1e-9);
}

// K's and V's types apart (--kv-dtype-k / --kv-dtype-v): each quantized tensor moves the
// output on its own, so a pool that stored either in the other's type would show a KL of
// exactly 0 on that row.
TEST(EvalCli, KvTypesAxisTakesKAndVTypesApart) {
  TempDir d;
  Result r = RunAttic("eval perplexity -m " + SharedDir() + "/models/stories260K-hf -l 64 --max-windows 2 " +
                      "--kv-dtypes f32,q8_0/f32,f32/q8_0,q8_0/q4_0 --json " + d.File("ppl.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("| 64 | f32/q8_0 | full | 2 | 126 |"), std::string::npos) << r.out;
  const auto js = nlohmann::json::parse(Read(d.File("ppl.json")));
  ASSERT_EQ(js["results"].size(), 4u);
  EXPECT_NEAR(js["results"][0]["perplexity"].get<double>(), 4.58173818, 1e-5 * 4.58173818);
  const char* names[] = {"q8_0/f32", "f32/q8_0", "q8_0/q4_0"};
  for (int i : {1, 2, 3}) {
    const auto& row = js["results"][i];
    EXPECT_EQ(row["kv_dtype"], names[i - 1]);
    EXPECT_GT(row["kl_vs_reference_kv_mean"].get<double>(), 0.0) << row["kv_dtype"];
  }
}

TEST(EvalCli, NeedleGridWritesTableJsonAndHeatmap) {
  TempDir d;
  Result r = RunAttic("eval needle -m " + SharedDir() + "/models/retriever-1m -l 128 200 --depths 0 1 --trials 2 " +
                      "--needles passkey --json " + d.File("n.json") + " --plot " + d.File("plots/n.svg"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("passkey, method full"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| depth \\ length | 128 | 200 | mean |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attic: eval needle: length 200: 4 prompts"), std::string::npos) << r.out;  // progress
  const auto js = nlohmann::json::parse(Read(d.File("n.json")));
  EXPECT_EQ(js["cells"].size(), 4u);
  EXPECT_EQ(js["results"].size(), 8u);
  for (const auto& t : js["results"]) EXPECT_LE(t["prompt_tokens"].get<int>(), t["length"].get<int>());
  const std::string svg = Read(d.File("plots/n.svg"));
  EXPECT_EQ(svg.rfind("<svg", 0), 0u) << svg.substr(0, 80);
  EXPECT_NE(svg.find("retriever-1m"), std::string::npos);
}

TEST(EvalCli, MistakesAreUsageErrors) {
  ExpectUsageError(RunAttic("eval"), "subcommand");
  ExpectUsageError(RunAttic("eval perplexity --methods nope"), "unknown method 'nope' (methods: full, naive[+bos], attnlink-K[+bos], cacheblend-R[@LAYER][+bos], pq-R|N[@OPTS], "
                   "oracle-R|N[@OPTS], streaming-R|N[@OPTS], h2o-R|N[@OPTS])");
  ExpectUsageError(RunAttic("eval perplexity -c 100 -l 128"), "-c 100");
  ExpectUsageError(RunAttic("eval perplexity -l 64 --score-from 64"), "--score-from");
  ExpectUsageError(RunAttic("eval perplexity --kv-dtypes f32,bf16"), "--kv-dtypes: 'bf16' is not a KV type");
  ExpectUsageError(RunAttic("eval perplexity --kv-dtypes f32 q8_0 f32"), "--kv-dtypes: f32 given twice");
  ExpectUsageError(RunAttic("eval perplexity --kv-dtypes f32,q8_0/bf16"), "--kv-dtypes: 'q8_0/bf16' is not a KV type");
  ExpectUsageError(RunAttic("eval perplexity --kv-dtypes q8_0/f16,q8_0/f16"), "--kv-dtypes: q8_0/f16 given twice");
  ExpectUsageError(RunAttic("eval perplexity --kv-dtype f16 --kv-dtypes f32,f16"), "excludes");
  ExpectUsageError(RunAttic("eval needle --depths 1.5"), "--depths");
  ExpectUsageError(RunAttic("eval needle --needles haystack"), "unknown needle 'haystack'");
  Result missing = RunAttic("eval perplexity --text /nonexistent/t.txt");
  EXPECT_EQ(missing.exit_code, 1) << missing.out;
  EXPECT_NE(missing.out.find("attic: error: --text: "), std::string::npos) << missing.out;
  Result unwritable = RunAttic("eval perplexity --json /proc/attic/p.json");
  EXPECT_EQ(unwritable.exit_code, 1) << unwritable.out;
  EXPECT_NE(unwritable.out.find("--json"), std::string::npos) << unwritable.out;
  EXPECT_EQ(unwritable.out.find("eval perplexity: length"), std::string::npos) << "failed after the work";
}

}  // namespace
