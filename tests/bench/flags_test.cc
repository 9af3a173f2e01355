// The benchmark programs' command-line parser and the text helpers they share.
#include "bench/common/flags.h"

#include <gtest/gtest.h>

#include "bench/common/format.h"
#include "bench/common/measure.h"

namespace attic::bench {
namespace {

Status ParseArgs(FlagParser& p, std::vector<const char*> args) {
  args.insert(args.begin(), "prog");
  return p.Parse(static_cast<int>(args.size()), args.data());
}

TEST(FlagParser, StoresValuesOfEveryKind) {
  int n = 1;
  double x = 0;
  std::string s = "default";
  bool on = false;
  std::vector<double> list{9};
  FlagParser p("prog", "");
  p.Int("--n", &n);
  p.Double("--x", &x);
  p.String("--s", &s);
  p.Switch("--on", &on);
  p.DoubleList("--list", &list);
  ASSERT_TRUE(ParseArgs(p, {"--n", "-42", "--on", "--x", "2.5e-1", "--s", "hello world", "--list", "1,2.5,,10"}).ok());
  EXPECT_EQ(n, -42);
  EXPECT_EQ(x, 0.25);
  EXPECT_EQ(s, "hello world");
  EXPECT_TRUE(on);
  EXPECT_EQ(list, (std::vector<double>{1, 2.5, 10}));
  EXPECT_FALSE(p.help_requested());
}

TEST(FlagParser, LastValueWinsAndUnsetFlagsKeepTheirDefault) {
  int n = 7, m = 3;
  FlagParser p("prog", "");
  p.Int("--n", &n);
  p.Int("--m", &m);
  ASSERT_TRUE(ParseArgs(p, {"--n", "1", "--n", "2"}).ok());
  EXPECT_EQ(n, 2);
  EXPECT_EQ(m, 3);
}

TEST(FlagParser, ErrorsNameTheFlag) {
  int n = 0;
  double x = 0;
  FlagParser p("prog", "");
  p.Int("--n", &n);
  p.Double("--x", &x);
  p.Custom("--mode", [](const std::string& v) {
    return v == "a" || v == "b" ? OkStatus() : InvalidArgumentError("must be a or b");
  });
  Status st = ParseArgs(p, {"--bogus"});
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "unknown flag --bogus");
  st = ParseArgs(p, {"--n"});
  EXPECT_EQ(st.message(), "--n needs a value");
  st = ParseArgs(p, {"--n", "12x"});
  EXPECT_EQ(st.message(), "--n: '12x' is not a whole number");
  st = ParseArgs(p, {"--n", "99999999999"});
  EXPECT_EQ(st.message(), "--n: '99999999999' is out of range");
  st = ParseArgs(p, {"--x", ""});
  EXPECT_EQ(st.message(), "--x: '' is not a number");
  st = ParseArgs(p, {"--mode", "c"});
  EXPECT_EQ(st.message(), "--mode: must be a or b");
  EXPECT_TRUE(ParseArgs(p, {"--mode", "b"}).ok());
}

TEST(FlagParser, HelpStopsParsing) {
  int n = 0;
  FlagParser p("prog", "[--n N]");
  p.Int("--n", &n);
  ASSERT_TRUE(ParseArgs(p, {"-h", "--bogus"}).ok());
  EXPECT_TRUE(p.help_requested());
  EXPECT_EQ(p.Usage(), "usage: prog [--n N]\n");
}

TEST(SplitList, DropsEmptyItems) {
  EXPECT_EQ(SplitList(""), std::vector<std::string>{});
  EXPECT_EQ(SplitList("a,b,,c,"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(SplitList("x\n\ny", '\n'), (std::vector<std::string>{"x", "y"}));
}

TEST(ParseIntList, WholeIntegersAtLeastMin) {
  auto ok = ParseIntList("1,2,,40");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (std::vector<int>{1, 2, 40}));
  EXPECT_FALSE(ParseIntList("1,0").ok());        // below the default min, 1
  EXPECT_TRUE(ParseIntList("1,0", 0).ok());
  EXPECT_FALSE(ParseIntList("3,4x").ok());       // not whole
  EXPECT_TRUE(ParseIntList("").value().empty());
}

TEST(Format, MarkdownTablesAndPrintf) {
  EXPECT_EQ(TableHeader({"a", "bc"}), "| a | bc |\n|---|---|\n");
  EXPECT_EQ(TableRow({"1", "", "x y"}), "| 1 |  | x y |\n");
  EXPECT_EQ(Fmt("%.1f%% of %d", 12.345, 7), "12.3% of 7");
  const std::string long_text(1000, 'z');  // longer than any fixed buffer
  EXPECT_EQ(Fmt("<%s>", long_text.c_str()), "<" + long_text + ">");
}

TEST(RandomTokens, SeededMt19937_64) {
  // The C++ standard fixes the 10000th output of a default-seeded (5489) mt19937_64:
  // 9981545732273789042 ([rand.predef]).
  const std::vector<int32_t> t = RandomTokens(10000, 5489, 10, 500);
  ASSERT_EQ(t.size(), 10000u);
  EXPECT_EQ(t.back(), 10 + static_cast<int32_t>(9981545732273789042ull % 490));
  for (int32_t x : t) {
    ASSERT_GE(x, 10);
    ASSERT_LT(x, 500);
  }
  EXPECT_EQ(RandomTokens(50, 3, 0, 1000), RandomTokens(50, 3, 0, 1000));
  EXPECT_NE(RandomTokens(50, 3, 0, 1000), RandomTokens(50, 4, 0, 1000));
}

}  // namespace
}  // namespace attic::bench
