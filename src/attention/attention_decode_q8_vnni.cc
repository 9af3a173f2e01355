// The AVX-512 q8_0 decode kernel's VNNI form (attention_avx512_decode.h, kVnni: scores
// as int8 dot products by vpdpbusd). Compiled with -mavx512vnni; Avx512Kernels calls it
// only on a CPU with AVX512-VNNI.
#include "attention/attention_avx512_decode.h"

namespace attic::attention::internal {

void Avx512DecodeQ8Vnni(const AttendParams& p, const TileJob& job, float* o, float* m, float* l) {
  DecodeKernelQ8</*kVnni=*/true>(p, job, o, m, l);
}

void Avx512DecodeK8V4Vnni(const AttendParams& p, const TileJob& job, float* o, float* m, float* l) {
  DecodeKernelQ8</*kVnni=*/true, /*kV4=*/true>(p, job, o, m, l);
}

}  // namespace attic::attention::internal
