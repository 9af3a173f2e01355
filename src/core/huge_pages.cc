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
  // The mapping ends at the request's last 4 KiB page, not at a 2 MiB boundary: the kernel
  // puts a huge page only where the mapping covers all of one, so a request's partial
  // last 2 MiB stays in small pages and never takes more than was asked for (the KV block
  // pool is sized to --kv-budget through here).
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t len = (bytes + page - 1) / page * page;
  // Over-map by one huge page, then trim the front to a 2 MiB boundary and the back to len.
  void* raw = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    void* p = std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
    if (p == nullptr) std::abort();
    std::memset(p, 0, bytes);
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
