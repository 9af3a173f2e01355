// pq: PQCache's selector (paper 004, section 3): one codebook per layer and KV head.
// It needs the codebook (codebook.h), which lands separately; until then asking for pq
// is a broken invariant rather than silently another method.
#include <cstdio>

#include "pq/sparse_internal.h"

namespace attic::pq::internal {

std::unique_ptr<SparseAttention> MakePqSelector(const SparseOptions&, const attention::AttentionShape&, int,
                                                backend::ThreadPool&) {
  std::fprintf(stderr, "attic: the pq sparse selector needs the PQ codebook, not built yet\n");
  ATTIC_CHECK(false);
  return nullptr;
}

}  // namespace attic::pq::internal
