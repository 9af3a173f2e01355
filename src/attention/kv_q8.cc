#include "attic/attention/kv_q8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attic/backend/cpu_features.h"
#include "attic/tensor/dtype.h"
#include "attention/kv_q8_internal.h"

namespace attic::attention {

void QuantizeKvRowQ8(const float* x, int head_dim, int8_t* q, uint16_t* scales) {
  const int group = KvQ8Group(head_dim);
  static const bool avx2 = backend::ActiveIsa() >= backend::Isa::kAvx2;
  if (avx2 && group % 8 == 0) {
    internal::QuantizeQ8Avx2(x, head_dim, group, q, scales);
    return;
  }
  for (int g0 = 0, b = 0; g0 < head_dim; g0 += group, ++b) {
    float amax = 0;
    for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[g0 + i]));
    // The largest finite f16 keeps a huge group finite (its values then clamp at 127).
    const uint16_t h = F32ToF16(std::min(amax / 127.0f, 65504.0f));
    const float d = F16ToF32(h);
    scales[b] = h;
    for (int i = 0; i < group; ++i) {
      // Divided by the stored scale, not multiplied by a reciprocal: the error bound
      // |x - d q| <= d / 2 then holds for the value that is read back.
      const float r = d > 0 ? std::round(x[g0 + i] / d) : 0.0f;  // halves away from zero, as llama.cpp
      q[g0 + i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
}

void DequantizeKvRowQ8(const int8_t* q, const uint16_t* scales, int head_dim, float* y) {
  DequantizeQ8(q, scales, head_dim, KvQ8Group(head_dim), y);
}

void DequantizeQ8(const int8_t* q, const void* scales, int n, int group, float* y) {
  static const bool avx2 = backend::ActiveIsa() >= backend::Isa::kAvx2;
  if (avx2 && group % 8 == 0) {
    internal::DequantizeQ8Avx2(q, scales, n, group, y);
    return;
  }
  const auto* s = static_cast<const uint8_t*>(scales);
  for (int g0 = 0, b = 0; g0 < n; g0 += group, ++b) {
    uint16_t h;
    std::memcpy(&h, s + 2 * b, sizeof(h));
    const float d = F16ToF32(h);
    for (int i = 0; i < group; ++i) y[g0 + i] = d * static_cast<float>(q[g0 + i]);
  }
}

}  // namespace attic::attention
