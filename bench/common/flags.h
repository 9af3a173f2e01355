// The command line of a standalone benchmark program (bench/*_bench.cc): "--name value"
// flags and "--name" switches, registered with where their values go. Numbers are parsed
// whole ("12x" is an error, not 12). Errors name the flag; ParseOrExit prints
// "<program>: error: <message>" and the usage to stderr and exits 2 (a usage error, as
// the attic command's), and --help / -h prints the usage to stdout and exits 0.
// Not thread-safe; used once, on the main thread, before the work starts.
//
//   FlagParser flags("attention_bench", "[--threads N] [--reps N] [--json-only]");
//   flags.Int("--threads", &threads);
//   flags.Switch("--json-only", &json_only);
//   flags.ParseOrExit(argc, argv);
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "attic/core/status.h"

namespace attic::bench {

// Whole-string number parsing (leading/trailing garbage or an empty string is an error).
StatusOr<int> ParseInt(const std::string& s);
StatusOr<double> ParseDouble(const std::string& s);
// "a,b,,c" -> {"a", "b", "c"}: the items between separators, empty ones dropped.
std::vector<std::string> SplitList(const std::string& s, char sep = ',');
// "1,2,4" -> {1, 2, 4}: SplitList's items as whole integers >= min (InvalidArgument
// naming the first that is not).
StatusOr<std::vector<int>> ParseIntList(const std::string& s, int min = 1);

class FlagParser {
 public:
  // `usage` is what follows "usage: <program> " (flags and their values).
  FlagParser(std::string program, std::string usage);

  // Flags that take a value. A flag given twice keeps the last value.
  void Int(const std::string& name, int* target);
  void Double(const std::string& name, double* target);
  void String(const std::string& name, std::string* target);
  // "1,2.5,10" -> {1, 2.5, 10} (replacing the list's previous contents).
  void DoubleList(const std::string& name, std::vector<double>* target);
  // A flag whose value `apply` checks and stores (lists, enums, flags that set two fields).
  void Custom(const std::string& name, std::function<Status(const std::string& value)> apply);
  // A flag without a value: sets *target to true.
  void Switch(const std::string& name, bool* target);

  // Parses argv[1..argc). Errors: an unknown flag, a missing value, a bad number, or what
  // a Custom flag returns. --help / -h sets help_requested() and stops parsing.
  Status Parse(int argc, const char* const* argv);
  bool help_requested() const { return help_; }

  // Parse, exiting as the header says on an error or --help.
  void ParseOrExit(int argc, char** argv);
  // For checks after parsing (ranges, required flags): prints the message as a parse
  // error does and exits 2.
  [[noreturn]] void UsageError(const std::string& message) const;

  std::string Usage() const { return "usage: " + program_ + " " + usage_ + "\n"; }

 private:
  struct Flag {
    std::string name;
    bool takes_value = true;
    std::function<Status(const std::string&)> apply;
  };
  const Flag* Find(const std::string& name) const;

  std::string program_, usage_;
  std::vector<Flag> flags_;
  bool help_ = false;
};

}  // namespace attic::bench
