#include "attic/core/huge_pages.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace attic {
namespace {

// The mapping of /proc/self/smaps that contains `addr`: its end, resident KiB and VmFlags
// line (0, 0, "" if none).
struct Mapping {
  uintptr_t end = 0;
  size_t rss_kib = 0;
  std::string vm_flags;
};
Mapping MappingOf(const void* addr) {
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
      if (inside) found.end = hi;
      continue;
    }
    if (!inside) continue;
    if (line.rfind("Rss:", 0) == 0) found.rss_kib = std::stoul(line.substr(4));
    if (line.rfind("VmFlags:", 0) == 0) found.vm_flags = line;
  }
  return found;
}

std::string ThpMode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  return line;
}

TEST(HugePagesTest, MappingIsAlignedZeroedAndWritable) {
  const size_t bytes = (size_t{5} << 20) + 12345;  // not a multiple of anything
  std::shared_ptr<std::byte> m = AllocateHugePageAligned(bytes);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.get()) % (size_t{2} << 20), 0u);
  const auto* p = reinterpret_cast<const unsigned char*>(m.get());
  for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(p[i], 0) << i;
  ASSERT_EQ(p[bytes - 1], 0);
  std::memset(m.get(), 0x5a, bytes);
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(m.get())[bytes - 1], 0x5a);
  EXPECT_EQ(AllocateHugePageAligned(0), nullptr);
}

// The mapping asks for huge pages (the kernel's "hg" flag, MADV_HUGEPAGE) unless
// ATTIC_HUGE_PAGES=0. Whether the kernel then finds free huge pages is its business.
TEST(HugePagesTest, AsksForHugePagesUnlessTurnedOff) {
  if (ThpMode().find('[') == std::string::npos) GTEST_SKIP() << "no transparent huge pages here";
  if (ThpMode().find("[never]") != std::string::npos) GTEST_SKIP() << "THP mode is never";
  const char* saved = std::getenv("ATTIC_HUGE_PAGES");
  const std::string saved_value = saved != nullptr ? saved : "";
  ::unsetenv("ATTIC_HUGE_PAGES");
  std::shared_ptr<std::byte> on = AllocateHugePageAligned(size_t{4} << 20);
  ::setenv("ATTIC_HUGE_PAGES", "0", 1);
  std::shared_ptr<std::byte> off = AllocateHugePageAligned(size_t{4} << 20);
  if (saved != nullptr) ::setenv("ATTIC_HUGE_PAGES", saved_value.c_str(), 1);
  else ::unsetenv("ATTIC_HUGE_PAGES");
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  const std::string on_flags = MappingOf(on.get()).vm_flags, off_flags = MappingOf(off.get()).vm_flags;
  ASSERT_FALSE(on_flags.empty());
  ASSERT_FALSE(off_flags.empty());
  EXPECT_NE(on_flags.find(" hg"), std::string::npos) << on_flags;
  EXPECT_EQ(off_flags.find(" hg"), std::string::npos) << off_flags;
}

// Memory stays inside what was asked for: the mapping that holds it ends at the request's
// last 4 KiB page, and no more than that is resident, even when the request's last 2 MiB
// is only partly used and the kernel backs what it can with huge pages. (A huge page over
// that last part made the KV block pool, which is sized to --kv-budget, up to 2 MiB larger.)
TEST(HugePagesTest, NothingResidentPastTheRequest) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t bytes = (size_t{2} << 20) + 3 * page + 100;  // one whole huge page and a short tail
  const size_t used = (bytes + page - 1) / page * page;
  std::shared_ptr<std::byte> m = AllocateHugePageAligned(bytes);
  ASSERT_NE(m, nullptr);
  std::memset(m.get(), 1, bytes);
  const Mapping map = MappingOf(m.get());
  ASSERT_GT(map.end, 0u) << "no mapping holds the memory";
  EXPECT_LE(map.end, reinterpret_cast<uintptr_t>(m.get()) + used) << "the mapping runs past the request";
  EXPECT_LE(map.rss_kib * 1024, used) << "resident: " << map.rss_kib << " KiB for a request of " << bytes << " bytes";
}

}  // namespace
}  // namespace attic
