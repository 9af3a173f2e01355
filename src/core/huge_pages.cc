#include "attic/core/huge_pages.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace attic {

void ReexecWithHugePageMalloc(char** argv) {
  const char* off = std::getenv("ATTIC_HUGE_PAGES");
  if (off != nullptr && std::strcmp(off, "0") == 0) return;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const std::string current = tunables != nullptr ? tunables : "";
  if (current.find("glibc.malloc.hugetlb") != std::string::npos) return;  // set (by us or the user)
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(mode, line) || line.find("[never]") != std::string::npos) return;
  const std::string value = current.empty() ? "glibc.malloc.hugetlb=1" : current + ":glibc.malloc.hugetlb=1";
  if (::setenv("GLIBC_TUNABLES", value.c_str(), 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  // exec failed: go on with the default malloc, and keep the environment as it was.
  if (tunables != nullptr) ::setenv("GLIBC_TUNABLES", current.c_str(), 1);
  else ::unsetenv("GLIBC_TUNABLES");
}

}  // namespace attic
