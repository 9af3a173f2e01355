// The CPU features Attic detects against the kernel's own report, /proc/cpuinfo's "flags"
// line (Linux reads CPUID itself and clears what the OS does not enable), so that each
// compiler's build (GCC's release build, clang's sanitizer builds) sees the same CPU.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "attic/backend/cpu_features.h"

namespace attic::backend {
namespace {

std::set<std::string> KernelFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(CpuFeatures, EqualTheKernelsFlags) {
  const std::set<std::string> flags = KernelFlags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line";
  const CpuFeatures& f = GetCpuFeatures();
  auto has = [&](const char* name) { return flags.count(name) > 0; };
  EXPECT_EQ(f.avx2, has("avx2"));
  EXPECT_EQ(f.fma, has("fma"));
  EXPECT_EQ(f.f16c, has("f16c"));
  EXPECT_EQ(f.avx512f, has("avx512f"));
  EXPECT_EQ(f.avx512bw, has("avx512bw"));
  EXPECT_EQ(f.avx512vl, has("avx512vl"));
  EXPECT_EQ(f.avx512dq, has("avx512dq"));
  EXPECT_EQ(f.avx512_vnni, has("avx512_vnni"));
  EXPECT_EQ(f.avx512_bf16, has("avx512_bf16"));
}

}  // namespace
}  // namespace attic::backend
