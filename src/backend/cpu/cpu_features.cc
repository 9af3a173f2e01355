#include "attic/backend/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

namespace attic::backend {

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2");
    c.fma = __builtin_cpu_supports("fma");
    c.avx512f = __builtin_cpu_supports("avx512f");
    c.avx512bw = __builtin_cpu_supports("avx512bw");
    c.avx512vl = __builtin_cpu_supports("avx512vl");
    c.avx512dq = __builtin_cpu_supports("avx512dq");
    c.avx512_vnni = __builtin_cpu_supports("avx512vnni");
    unsigned eax, ebx, ecx, edx;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) c.f16c = (ecx >> 29) & 1;
    // AVX512_BF16: CPUID leaf 7, sub-leaf 1, EAX bit 5 (read directly: GCC's
    // __builtin_cpu_supports knows "avx512bf16" from GCC 12 on, clang 14's does not, and the
    // sanitizer builds use clang). __get_cpuid_count checks the CPU has leaf 7; the OS's
    // saving of the zmm state is what avx512f's check already required.
    if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) c.avx512_bf16 = c.avx512f && ((eax >> 5) & 1);
    return c;
  }();
  return f;
}

Isa BestIsa() {
  const CpuFeatures& f = GetCpuFeatures();
  Isa best = Isa::kGeneric;
  if (f.avx2 && f.fma && f.f16c) best = Isa::kAvx2;
  if (best == Isa::kAvx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) best = Isa::kAvx512;
  return best;
}

Isa ActiveIsa() {
  static const Isa isa = [] {
    Isa best = BestIsa();
    if (const char* cap = std::getenv("ATTIC_ISA")) {
      Isa want = best;
      if (std::strcmp(cap, "generic") == 0) want = Isa::kGeneric;
      if (std::strcmp(cap, "avx2") == 0) want = Isa::kAvx2;
      if (static_cast<int>(want) < static_cast<int>(best)) best = want;
    }
    return best;
  }();
  return isa;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

}  // namespace attic::backend
