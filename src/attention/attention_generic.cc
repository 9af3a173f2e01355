// Portable attention kernel: the vector-extension tile kernel with 4-float vectors.
#include "attention/attention_internal.h"
#include "attention/attention_vec_kernel.h"

namespace attic::attention::internal {

KernelSet GenericKernels() {
  KernelSet ks;
  ks.tile = VecTile<4>;
  ks.tile_rows = kVecRows;
  return ks;
}

}  // namespace attic::attention::internal
