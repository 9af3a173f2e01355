#include "bench/common/flags.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

namespace attic::bench {

StatusOr<int> ParseInt(const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size()) return InvalidArgumentError("'" + s + "' is not a whole number");
  if (errno == ERANGE || v < INT_MIN || v > INT_MAX) return InvalidArgumentError("'" + s + "' is out of range");
  return static_cast<int>(v);
}

StatusOr<double> ParseDouble(const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) return InvalidArgumentError("'" + s + "' is not a number");
  if (errno == ERANGE) return InvalidArgumentError("'" + s + "' is out of range");
  return v;
}

std::vector<std::string> SplitList(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= s.size()) {
    size_t end = s.find(sep, begin);
    if (end == std::string::npos) end = s.size();
    if (end > begin) out.push_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

StatusOr<std::vector<int>> ParseIntList(const std::string& s, int min) {
  std::vector<int> out;
  for (const std::string& item : SplitList(s)) {
    auto v = ParseInt(item);
    if (!v.ok() || *v < min) {
      return InvalidArgumentError("'" + item + "' is not an integer >= " + std::to_string(min));
    }
    out.push_back(*v);
  }
  return out;
}

FlagParser::FlagParser(std::string program, std::string usage) : program_(std::move(program)), usage_(std::move(usage)) {}

void FlagParser::Int(const std::string& name, int* target) {
  Custom(name, [target](const std::string& v) -> Status {
    StatusOr<int> x = ParseInt(v);
    if (!x.ok()) return x.status();
    *target = *x;
    return OkStatus();
  });
}

void FlagParser::Double(const std::string& name, double* target) {
  Custom(name, [target](const std::string& v) -> Status {
    StatusOr<double> x = ParseDouble(v);
    if (!x.ok()) return x.status();
    *target = *x;
    return OkStatus();
  });
}

void FlagParser::String(const std::string& name, std::string* target) {
  Custom(name, [target](const std::string& v) {
    *target = v;
    return OkStatus();
  });
}

void FlagParser::DoubleList(const std::string& name, std::vector<double>* target) {
  Custom(name, [target](const std::string& v) -> Status {
    std::vector<double> list;
    for (const std::string& item : SplitList(v)) {
      StatusOr<double> x = ParseDouble(item);
      if (!x.ok()) return x.status();
      list.push_back(*x);
    }
    *target = std::move(list);
    return OkStatus();
  });
}

void FlagParser::Custom(const std::string& name, std::function<Status(const std::string&)> apply) {
  flags_.push_back({name, true, std::move(apply)});
}

void FlagParser::Switch(const std::string& name, bool* target) {
  flags_.push_back({name, false, [target](const std::string&) {
                      *target = true;
                      return OkStatus();
                    }});
}

const FlagParser::Flag* FlagParser::Find(const std::string& name) const {
  for (const Flag& f : flags_)
    if (f.name == name) return &f;
  return nullptr;
}

Status FlagParser::Parse(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      return OkStatus();
    }
    const Flag* f = Find(arg);
    if (f == nullptr) return InvalidArgumentError("unknown flag " + arg);
    if (!f->takes_value) {
      Status st = f->apply("");
      if (!st.ok()) return st;
      continue;
    }
    if (i + 1 >= argc) return InvalidArgumentError(arg + " needs a value");
    Status st = f->apply(argv[++i]);
    if (!st.ok()) return InvalidArgumentError(arg + ": " + st.message());
  }
  return OkStatus();
}

void FlagParser::ParseOrExit(int argc, char** argv) {
  Status st = Parse(argc, argv);
  if (!st.ok()) UsageError(st.message());
  if (help_) {
    std::fputs(Usage().c_str(), stdout);
    std::exit(0);
  }
}

void FlagParser::UsageError(const std::string& message) const {
  std::fprintf(stderr, "%s: error: %s\n%s", program_.c_str(), message.c_str(), Usage().c_str());
  std::exit(2);
}

}  // namespace attic::bench
