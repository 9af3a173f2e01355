// What the benchmark programs share about their outputs and inputs: a --json file is
// checked before the work starts (its folders made) and written whole at the end, or
// the program exits 1 with "<program>: error: ..."; the shared folder is found from the
// executable's place ($ATTIC_SHARED_DIR overrides), not the current directory.
#pragma once

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "attic/core/file.h"

namespace attic::bench {

inline void DieOnError(const char* program, const Status& st) {
  if (st.ok()) return;
  std::fprintf(stderr, "%s: error: %s\n", program, st.message().c_str());
  std::exit(1);
}

// Call right after parsing the flags.
inline void CheckOutput(const char* program, const std::string& path) {
  if (!path.empty()) DieOnError(program, PrepareOutputFile(path).WithContext("--json"));
}

inline void WriteOutput(const char* program, const std::string& path, const std::string& text) {
  if (path.empty()) return;
  Status st = PrepareOutputFile(path);
  if (st.ok()) st = WriteFileAtomic(path, text);
  DieOnError(program, st.WithContext("--json"));
}

// <shared> beside the project the program was built in (<project>/build/<program>).
inline std::string SharedDir() {
  if (const char* env = std::getenv("ATTIC_SHARED_DIR"); env != nullptr && *env != '\0') return env;
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "../shared";
  std::error_code ec;
  const auto dir = std::filesystem::path(std::string(buf, static_cast<size_t>(n))).parent_path();
  const auto shared = std::filesystem::weakly_canonical(dir / ".." / ".." / "shared", ec);
  return ec ? "../shared" : shared.string();
}

}  // namespace attic::bench
