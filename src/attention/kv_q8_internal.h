// kv_q8.h's dequantization per ISA (DequantizeQ8 dispatches).
#pragma once

#include <cstdint>

namespace attic::attention::internal {

// REQUIRES: group a multiple of 8; the CPU has AVX2 and F16C.
void DequantizeQ8Avx2(const int8_t* q, const void* scales, int n, int group, float* y);

// QuantizeKvRowQ8's arithmetic, eight values at a time: the same bits as the scalar loop
// for every finite x (the division is IEEE's in both, and rounding half away from zero is
// done exactly on the quotient). REQUIRES: group a multiple of 8; AVX2 and F16C.
void QuantizeQ8Avx2(const float* x, int n, int group, int8_t* q, uint16_t* scales);

}  // namespace attic::attention::internal
