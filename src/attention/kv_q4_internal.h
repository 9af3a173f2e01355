// kv_q4.h's dequantization per ISA (DequantizeKvRowQ4 dispatches).
#pragma once

#include <cstdint>

namespace attic::attention::internal {

// DequantizeKvRowQ4's arithmetic, eight values at a time: the same bits (a code minus 8
// times an f16 scale is exact in f32). REQUIRES: group (KvQ4Group) a multiple of 16; the
// CPU has AVX2 and F16C.
void DequantizeQ4Avx2(const uint8_t* q, const void* scales, int n, int group, float* y);

}  // namespace attic::attention::internal
