// Bulk dtype conversions between f32 and the 16-bit weight/KV formats, vectorised and
// dispatched at run time to AVX-512 / AVX2 / generic code (see cpu_features.h). The
// scalar conversions these agree with bit for bit live in attic/tensor/dtype.h.
//
// Thread-safety: stateless; safe to call from any thread.
#pragma once

#include <cstdint>

#include "attic/tensor/dtype.h"

namespace attic::backend {

// dst[i] = f32(src[i]) for i < n. Exact.
void ConvertF16ToF32(const uint16_t* src, float* dst, int64_t n);
void ConvertBf16ToF32(const uint16_t* src, float* dst, int64_t n);

// dst[i] = round-to-nearest-even(src[i]) for i < n. NaN stays NaN; f16 overflows to inf
// and underflows gradually (same results as attic::F32ToF16 / attic::F32ToBf16).
void ConvertF32ToBf16(const float* src, uint16_t* dst, int64_t n);
void ConvertF32ToF16(const float* src, uint16_t* dst, int64_t n);

// n elements of any dtype to f32. REQUIRES: for q8_0, n is a multiple of 32 and `src`
// points at the start of a block.
void ConvertRowToF32(DType dtype, const void* src, float* dst, int64_t n);

}  // namespace attic::backend
