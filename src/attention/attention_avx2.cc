// AVX2 attention kernel (compiled with -mavx2 -mfma): the vector-extension tile kernel
// with 8-float vectors; a*b+c contracts to FMA.
#include "attention/attention_internal.h"
#include "attention/attention_vec_kernel.h"

namespace attic::attention::internal {

KernelSet Avx2Kernels() {
  KernelSet ks;
  ks.tile = VecTile<8>;
  ks.tile_rows = kVecRows;
  return ks;
}

}  // namespace attic::attention::internal
