// Defaults that name files: resolved from the `attic` executable's place, not from the
// current directory, so every command works from any folder.
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>

#include "attic/core/file.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {

namespace fs = std::filesystem;

std::string ExecutableDir() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  return fs::path(std::string(buf, static_cast<size_t>(n))).parent_path().string();
}

std::string Canonical(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  return ec ? p.string() : c.string();
}

}  // namespace

std::string ProjectDir() {
  // The executable is built in <project>/build (or any folder one level below it).
  return Canonical(fs::path(ExecutableDir()) / "..");
}

std::string SharedDir() {
  if (const char* env = std::getenv("ATTIC_SHARED_DIR"); env != nullptr && *env != '\0') return env;
  return Canonical(fs::path(ProjectDir()) / ".." / "shared");
}

std::string DefaultModelPath() {
  if (const char* env = std::getenv("ATTIC_MODEL"); env != nullptr && *env != '\0') return env;
  return JoinPath(SharedDir(), "models/stories260K-hf");
}

}  // namespace attic::cli
