#include "attic/attention/kv_q4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/kv_q4_internal.h"
#include "attic/backend/cpu_features.h"
#include "attic/tensor/dtype.h"

namespace attic::attention {

void QuantizeKvRowQ4(const float* x, int head_dim, uint8_t* q, uint16_t* scales) {
  const int group = KvQ4Group(head_dim), half = group / 2;
  for (int g0 = 0, b = 0; g0 < head_dim; g0 += group, ++b) {
    const float* v = x + g0;
    float amax = 0, max = 0;
    for (int i = 0; i < group; ++i) {
      if (amax < std::fabs(v[i])) {
        amax = std::fabs(v[i]);
        max = v[i];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    // The largest finite f16 keeps a huge group's scale finite (its codes are computed
    // with the unclamped d, as llama.cpp's; such a group reads back smaller).
    scales[b] = F32ToF16(std::clamp(d, -65504.0f, 65504.0f));
    uint8_t* out = q + g0 / 2;
    for (int j = 0; j < half; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(v[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(v[j + half] * id + 8.5f)));
      out[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void DequantizeKvRowQ4(const uint8_t* q, const void* scales, int head_dim, float* y) {
  const int group = KvQ4Group(head_dim), half = group / 2;
  static const bool avx2 = backend::ActiveIsa() >= backend::Isa::kAvx2;
  if (avx2 && group % 16 == 0) {
    internal::DequantizeQ4Avx2(q, scales, head_dim, group, y);
    return;
  }
  const auto* s = static_cast<const uint8_t*>(scales);
  for (int g0 = 0, b = 0; g0 < head_dim; g0 += group, ++b) {
    uint16_t h;
    std::memcpy(&h, s + 2 * b, sizeof(h));
    const float d = F16ToF32(h);
    const uint8_t* in = q + g0 / 2;
    float* out = y + g0;
    for (int j = 0; j < half; ++j) {
      out[j] = d * static_cast<float>((in[j] & 0xF) - 8);
      out[j + half] = d * static_cast<float>((in[j] >> 4) - 8);
    }
  }
}

}  // namespace attic::attention
