// q4_0 KV rows (kv_q4.h) against independent references: for 32-value groups, the GGUF
// q4_0 blocks of tensor/quants.h (whose quantizer is checked against llama.cpp's own
// quantize tool, bit for bit, in model/ tests) hold the same codes and scales, and read
// back the same values; for shorter rows (one group of head_dim values), every value
// reads back within the header's bound |x - read(x)| <= |d'| (1 + 2^-7).
#include "attic/attention/kv_q4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attic/tensor/dtype.h"
#include "attic/tensor/quants.h"

namespace attic::attention {
namespace {

std::vector<float> RandomRow(int n, std::mt19937& rng, float outlier) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = g(rng) * (i % 13 == 5 ? outlier : 1.0f);
  return x;
}

TEST(KvQ4, SupportsEvenRowsBelow32AndMultiplesOf32) {
  EXPECT_TRUE(KvQ4Supports(8));
  EXPECT_TRUE(KvQ4Supports(6));
  EXPECT_TRUE(KvQ4Supports(64));
  EXPECT_TRUE(KvQ4Supports(128));
  EXPECT_FALSE(KvQ4Supports(7));
  EXPECT_FALSE(KvQ4Supports(48));
  EXPECT_FALSE(KvQ4Supports(0));
}

// head_dim 64 and 128: each 32-value group is one block_q4_0 (half d; u8 qs[16]) with its
// scale kept apart from its codes.
TEST(KvQ4, RowsOf32ValueGroupsHoldTheGgufQ4_0Blocks) {
  std::mt19937 rng(7);
  for (int d : {32, 64, 128}) {
    for (float outlier : {1.0f, 8.0f, -30.0f}) {
      const std::vector<float> x = RandomRow(d, rng, outlier);
      const int groups = d / 32;
      std::vector<uint8_t> codes(d / 2);
      std::vector<uint16_t> scales(groups);
      QuantizeKvRowQ4(x.data(), d, codes.data(), scales.data());
      std::vector<uint8_t> blocks(static_cast<size_t>(groups) * 18);
      QuantizeBlocks(DType::kQ4_0, x.data(), blocks.data(), d);
      for (int b = 0; b < groups; ++b) {
        uint16_t want_d;
        std::memcpy(&want_d, &blocks[b * 18], 2);
        EXPECT_EQ(scales[b], want_d) << "d=" << d << " group " << b;
        EXPECT_EQ(std::memcmp(&codes[b * 16], &blocks[b * 18 + 2], 16), 0) << "d=" << d << " group " << b;
      }
      std::vector<float> got(d), want(d);
      DequantizeKvRowQ4(codes.data(), scales.data(), d, got.data());
      DequantizeBlocks(DType::kQ4_0, blocks.data(), want.data(), d);
      for (int i = 0; i < d; ++i) EXPECT_EQ(got[i], want[i]) << "d=" << d << " value " << i;
    }
  }
}

// Rows below 32 values are one group; nibble j holds values j and j + g / 2 as the
// 32-value layout does. Checked against the bound, the scale's definition (the signed
// value of largest magnitude over -8, rounded to f16) and the code layout, all from the
// values themselves.
TEST(KvQ4, ShortRowsAreOneGroupWithinTheBound) {
  std::mt19937 rng(8);
  for (int d : {6, 8, 16}) {
    for (int trial = 0; trial < 200; ++trial) {
      const std::vector<float> x = RandomRow(d, rng, trial % 3 == 0 ? 10.0f : 1.0f);
      std::vector<uint8_t> codes(d / 2);
      uint16_t scale;
      QuantizeKvRowQ4(x.data(), d, codes.data(), &scale);
      float max = 0;
      for (float v : x) max = std::fabs(v) > std::fabs(max) ? v : max;
      EXPECT_EQ(scale, F32ToF16(max / -8.0f));
      const double dp = std::fabs(F16ToF32(scale));
      std::vector<float> y(d);
      DequantizeKvRowQ4(codes.data(), &scale, d, y.data());
      for (int i = 0; i < d; ++i) {
        EXPECT_LE(std::fabs(static_cast<double>(x[i]) - y[i]), dp * (1 + 1.0 / 128)) << "d=" << d << " value " << i;
        const int code = i < d / 2 ? codes[i] & 0xF : codes[i - d / 2] >> 4;
        EXPECT_EQ(y[i], F16ToF32(scale) * static_cast<float>(code - 8)) << "d=" << d << " value " << i;
      }
    }
  }
}

TEST(KvQ4, ZerosHaveScaleZeroAndReadBackAsZeros) {
  std::vector<float> x(64, 0.0f), y(64, 1.0f);
  std::vector<uint8_t> codes(32, 0xFF);
  uint16_t scales[2] = {1, 1};
  QuantizeKvRowQ4(x.data(), 64, codes.data(), scales);
  EXPECT_EQ(F16ToF32(scales[0]), 0.0f);  // -0: 0 / -8, as llama.cpp's
  EXPECT_EQ(F16ToF32(scales[1]), 0.0f);
  DequantizeKvRowQ4(codes.data(), scales, 64, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace attic::attention
