#include "bench/common/output.h"

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "attic/core/file.h"

namespace attic::bench {

void DieOnError(const char* program, const Status& st) {
  if (st.ok()) return;
  std::fprintf(stderr, "%s: error: %s\n", program, st.message().c_str());
  std::exit(1);
}

void CheckOutput(const char* program, const std::string& path) {
  if (!path.empty()) DieOnError(program, PrepareOutputFile(path).WithContext("--json"));
}

void WriteOutput(const char* program, const std::string& path, const std::string& text) {
  if (path.empty()) return;
  Status st = PrepareOutputFile(path);
  if (st.ok()) st = WriteFileAtomic(path, text);
  DieOnError(program, st.WithContext("--json"));
}

std::string SharedDir() {
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
