// Runtime CPU ISA detection. Kernels are compiled for several ISAs and the best one the
// running CPU supports is chosen once (ATTIC_ISA=generic|avx2|avx512 caps it, for tests).
#pragma once

namespace attic::backend {

enum class Isa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512_bf16 = false,
       avx512_vnni = false;
};

const CpuFeatures& GetCpuFeatures();
// The best ISA this CPU runs, whatever ATTIC_ISA says.
Isa BestIsa();
// The ISA kernels use: BestIsa(), capped by ATTIC_ISA if set.
Isa ActiveIsa();
const char* IsaName(Isa isa);

}  // namespace attic::backend
