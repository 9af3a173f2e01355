// Helpers shared by tests: where ../shared is, and temporary directories.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace attic::testing {

// The shared folder with models and datasets (ATTIC_SHARED_DIR overrides the build-time path).
inline std::string SharedDir() {
  if (const char* env = std::getenv("ATTIC_SHARED_DIR")) return env;
#ifdef ATTIC_SHARED_DIR
  return ATTIC_SHARED_DIR;
#else
  return "../shared";
#endif
}

inline std::string SourceDir() {
#ifdef ATTIC_SOURCE_DIR
  return ATTIC_SOURCE_DIR;
#else
  return ".";
#endif
}

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "attic-test-XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    path_ = p ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace attic::testing
