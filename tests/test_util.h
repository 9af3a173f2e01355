// Helpers shared by tests: where ../shared is, and temporary directories.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
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

// The mapping of /proc/self/smaps that contains `addr`: where it starts and ends, its
// resident KiB and its VmFlags line (all 0 / "" if none). What the kernel says a piece of
// memory takes, independently of the code that allocated it.
struct Mapping {
  uintptr_t start = 0, end = 0;
  size_t rss_kib = 0;
  std::string vm_flags;
};
inline Mapping MappingOf(const void* addr) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  Mapping found;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      if (inside) break;
      inside = lo <= a && a < hi;
      if (inside) found.start = lo, found.end = hi;
      continue;
    }
    if (!inside) continue;
    if (line.rfind("Rss:", 0) == 0) found.rss_kib = std::stoul(line.substr(4));
    if (line.rfind("VmFlags:", 0) == 0) found.vm_flags = line;
  }
  return found;
}

}  // namespace attic::testing
