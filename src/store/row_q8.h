// The q8_0 entry row's dequantization per ISA (entry.h, DequantizeRowQ8 dispatches).
#pragma once

#include <cstdint>

namespace attic::store::internal {

// REQUIRES: group a multiple of 8; the CPU has AVX2 and F16C.
void DequantizeRowQ8Avx2(const uint8_t* row, int kv_dim, int group, float* y);

}  // namespace attic::store::internal
