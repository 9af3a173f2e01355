#include "attic/core/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
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

std::shared_ptr<std::byte> AllocateHugePageAligned(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes == 0) return nullptr;
  const size_t len = (bytes + kHuge - 1) / kHuge * kHuge;
  // Over-map by one huge page, then trim the ends to the 2 MiB boundaries.
  void* raw = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    void* p = std::aligned_alloc(kHuge, len);
    if (p == nullptr) std::abort();
    std::memset(p, 0, len);
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + kHuge - 1) / kHuge * kHuge;
  if (start > base) ::munmap(raw, start - base);
  const uintptr_t end = base + len + kHuge;
  if (end > start + len) ::munmap(reinterpret_cast<void*>(start + len), end - (start + len));
  const char* off = std::getenv("ATTIC_HUGE_PAGES");
  if (off == nullptr || std::strcmp(off, "0") != 0) ::madvise(reinterpret_cast<void*>(start), len, MADV_HUGEPAGE);
  return std::shared_ptr<std::byte>(reinterpret_cast<std::byte*>(start), [len](std::byte* p) { ::munmap(p, len); });
}

}  // namespace attic
