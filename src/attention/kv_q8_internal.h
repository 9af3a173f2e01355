// kv_q8.h's dequantization per ISA (DequantizeQ8 dispatches).
#pragma once

#include <cstdint>

namespace attic::attention::internal {

// REQUIRES: group a multiple of 8; the CPU has AVX2 and F16C.
void DequantizeQ8Avx2(const int8_t* q, const void* scales, int n, int group, float* y);

}  // namespace attic::attention::internal
