#include "model/random_fill.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace attic::model {
namespace {

TEST(RandomFillTest, VectorAndScalarAgreeAndAnyRangeMatches) {
  const int64_t n = 1003;
  std::vector<float> a(n), b(n), part(n);
  internal::FillNormalScalar(0x1234567890abcdefull, 77, n, 0.02f, a.data());
  FillNormal(0x1234567890abcdefull, 77, n, 0.02f, b.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
  FillNormal(0x1234567890abcdefull, 77 + 13, n - 13, 0.02f, part.data());
  EXPECT_EQ(std::memcmp(a.data() + 13, part.data(), (n - 13) * sizeof(float)), 0);
}

TEST(RandomFillTest, Moments) {
  const int64_t n = 1 << 20;
  std::vector<float> v(n);
  FillNormal(42, 0, n, 1.0f, v.data());
  double sum = 0, sq = 0, quad = 0;
  for (float x : v) sum += x, sq += double(x) * x, quad += double(x) * x * x * x;
  double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.005);
  EXPECT_NEAR(var, 1.0, 0.01);
  EXPECT_NEAR(quad / n / (var * var), 2.7, 0.05);  // Irwin-Hall(4) kurtosis 2.7 (normal: 3)
}

TEST(RandomFillTest, ConversionsMatchScalarBitForBit) {
  std::vector<float> v;
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 1e10f, -1e10f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 5.96e-8f, 2.98e-8f, 6.1e-5f, 1e-40f,
                            std::numeric_limits<float>::denorm_min()};
  for (float f : specials) v.push_back(f);
  uint32_t u = 1;
  for (int i = 0; i < (1 << 22); ++i) {  // a sweep over bit patterns, NaNs included
    u += 1021u;
    u *= 2654435761u;
    float f;
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  for (DType t : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> a(v.size()), b(v.size());
    ConvertFromF32(t, v.data(), a.data(), v.size());
    ConvertForStorage(t, v.data(), b.data(), v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &v[i], 4);
      ASSERT_EQ(a[i], b[i]) << DTypeName(t) << " input bits " << std::hex << bits;
    }
  }
}

}  // namespace
}  // namespace attic::model
