// The automatic DRAM tier size (dram_size.h).
#include "attic/store/dram_size.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <string>

namespace attic::store {

uint64_t AutoDramTierBytes(uint64_t physical_bytes, uint64_t available_bytes) {
  uint64_t bytes = kAutoDramMaxBytes;
  if (physical_bytes > 0) bytes = std::min(bytes, physical_bytes / 4);
  if (available_bytes > 0) bytes = std::min(bytes, available_bytes / 2);
  return bytes / kAutoDramGrainBytes * kAutoDramGrainBytes;  // < 64 MiB: 0, no tier
}

uint64_t ParseMemAvailable(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemAvailable:";
  for (size_t at = 0; at < meminfo.size();) {
    size_t end = meminfo.find('\n', at);
    if (end == std::string_view::npos) end = meminfo.size();
    std::string_view line = meminfo.substr(at, end - at);
    at = end + 1;
    if (line.substr(0, kKey.size()) != kKey) continue;
    line.remove_prefix(kKey.size());
    line.remove_prefix(std::min(line.find_first_not_of(' '), line.size()));
    uint64_t kib = 0;
    auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), kib);
    if (ec != std::errc() || p == line.data()) return 0;
    return kib * 1024;  // the kernel writes "NNN kB", kB meaning KiB
  }
  return 0;
}

namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream f(path);  // /proc and /sys files report size 0: read, don't map
  if (!f) return "";
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// A cgroup v2 file holding one number; 0 for "max" (no limit) or a file that is not there.
uint64_t ReadCgroupNumber(const std::string& path) {
  const std::string text = ReadSmallFile(path);
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return ec == std::errc() && p != text.data() ? v : 0;
}

// The process's cgroup v2 path ("0::/a/b" in /proc/self/cgroup), or "" (cgroup v1 or none).
std::string CgroupPath() {
  std::istringstream in(ReadSmallFile("/proc/self/cgroup"));
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return "";
}

}  // namespace

HostMemory ReadHostMemory() {
  HostMemory m;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) m.physical_bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  m.available_bytes = ParseMemAvailable(ReadSmallFile("/proc/meminfo"));
  // The tightest memory.max of the process's cgroup and its ancestors (a container's
  // limit, a systemd unit's MemoryMax=), and what it leaves (conservative: memory.current
  // counts the group's page cache, which MemAvailable would count as available).
  std::string path = CgroupPath();
  while (!path.empty() && path.front() == '/') {
    const std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
    if (const uint64_t max = ReadCgroupNumber(dir + "/memory.max"); max > 0) {
      const uint64_t used = ReadCgroupNumber(dir + "/memory.current");
      const uint64_t left = max > used ? max - used : 1;  // 1: at the limit (0 would mean unknown)
      m.physical_bytes = m.physical_bytes > 0 ? std::min(m.physical_bytes, max) : max;
      m.available_bytes = m.available_bytes > 0 ? std::min(m.available_bytes, left) : left;
    }
    if (path == "/") break;
    const size_t slash = path.find_last_of('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  return m;
}

}  // namespace attic::store
