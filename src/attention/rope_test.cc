#include "attic/attention/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <initializer_list>
#include <vector>

#include "attention/attention_internal.h"
#include "attic/backend/cpu_features.h"

namespace attic::attention {
namespace {

using model::RopeScaling;
using model::RopeScalingType;

std::vector<double> ExpectedDefaultInvFreq(int head_dim, double theta) {
  std::vector<double> inv(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) inv[i] = std::pow(theta, -2.0 * i / head_dim);
  return inv;
}

std::vector<float> RandomVec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Rotates in double by angle(pos, i) given by `angle`.
template <typename AngleFn>
std::vector<double> NaiveRope(const std::vector<float>& x, int n_tokens, int n_heads, int head_dim,
                              const std::vector<int32_t>& pos, AngleFn angle) {
  std::vector<double> out(x.begin(), x.end());
  const int half = head_dim / 2;
  for (int t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      const size_t base = (static_cast<size_t>(t) * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const double a = angle(pos[t], i);
        const double x1 = x[base + i], x2 = x[base + i + half];
        out[base + i] = x1 * std::cos(a) - x2 * std::sin(a);
        out[base + i + half] = x2 * std::cos(a) + x1 * std::sin(a);
      }
    }
  }
  return out;
}

TEST(RopeTest, DefaultInvFreqMatchesFormula) {
  for (int head_dim : {8, 64, 128}) {
    for (double theta : {10000.0, 500000.0, 1000000.0}) {
      RopeTable rope(head_dim, static_cast<float>(theta), RopeScaling{});
      const std::vector<double> want = ExpectedDefaultInvFreq(head_dim, theta);
      ASSERT_EQ(rope.inv_freq().size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(rope.inv_freq()[i], want[i], 2e-7 * want[i]) << head_dim << " " << i;
    }
  }
}

TEST(RopeTest, ConfigConstructorUsesHeadDimAndTheta) {
  model::ModelConfig c;
  c.hidden_size = 576;
  c.n_heads = 9;
  c.head_dim = 64;
  c.rope_theta = 100000.0f;
  RopeTable rope(c);
  EXPECT_EQ(rope.head_dim(), 64);
  EXPECT_NEAR(rope.inv_freq()[1], std::pow(100000.0, -2.0 / 64), 1e-7);
}

TEST(RopeTest, ApplyMatchesHfFloat32Angles) {
  // HF: angle = f32(pos) * inv_freq (f32), cos/sin of it; rotation otherwise exact.
  const int head_dim = 64, n_heads = 3;
  RopeTable rope(head_dim, 10000.0f, RopeScaling{}, 4096);
  std::vector<int32_t> pos = {0, 1, 2, 7, 100, 1000, 2047, 4095, 4096, 9000, 65000};
  const int n = static_cast<int>(pos.size());
  std::vector<float> x = RandomVec(static_cast<size_t>(n) * n_heads * head_dim, 1);
  const auto& inv = rope.inv_freq();
  auto want = NaiveRope(x, n, n_heads, head_dim, pos,
                        [&](int32_t p, int i) { return static_cast<double>(static_cast<float>(p) * inv[i]); });
  rope.Apply(x.data(), n, n_heads, pos.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], want[i], 1e-6) << i;
}

TEST(RopeTest, ApplyMatchesDoubleFormulaAtSmallPositions) {
  const int head_dim = 128, n_heads = 2;
  RopeTable rope(head_dim, 10000.0f, RopeScaling{});
  std::vector<int32_t> pos = {0, 1, 3, 17, 63};
  const int n = static_cast<int>(pos.size());
  std::vector<float> x = RandomVec(static_cast<size_t>(n) * n_heads * head_dim, 2);
  const std::vector<double> inv = ExpectedDefaultInvFreq(head_dim, 10000.0);
  auto want = NaiveRope(x, n, n_heads, head_dim, pos, [&](int32_t p, int i) { return p * inv[i]; });
  rope.Apply(x.data(), n, n_heads, pos.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], want[i], 2e-5) << i;
}

TEST(RopeTest, RotateHalfPairsDimensionIWithIPlusHalf) {
  const int head_dim = 8;
  RopeTable rope(head_dim, 10000.0f, RopeScaling{});
  std::vector<float> x(head_dim, 0.0f);
  x[1] = 1.0f;
  const int32_t pos = 5;
  rope.Apply(x.data(), 1, 1, &pos);
  const double a = 5.0 * std::pow(10000.0, -2.0 / 8);
  EXPECT_NEAR(x[1], std::cos(a), 1e-6);
  EXPECT_NEAR(x[1 + 4], std::sin(a), 1e-6);
  for (int i : {0, 2, 3, 4, 6, 7}) EXPECT_EQ(x[i], 0.0f);
}

TEST(RopeTest, InverseUndoesApply) {
  const int head_dim = 64, n_heads = 4;
  RopeTable rope(head_dim, 500000.0f, RopeScaling{}, 1024);
  std::vector<int32_t> pos = {0, 5, 1023, 1024, 5000, 131071, 3};
  const int n = static_cast<int>(pos.size());
  const std::vector<float> orig = RandomVec(static_cast<size_t>(n) * n_heads * head_dim, 3);
  std::vector<float> x = orig;
  rope.Apply(x.data(), n, n_heads, pos.data());
  rope.ApplyInverse(x.data(), n, n_heads, pos.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], orig[i], 1e-6) << i;
}

// ApplyToken writes each head to its own strided destination (the compute buffer's
// [head][row][head_dim] blocks). It must match the double-precision formula, and equal
// Apply bit for bit: stored KV entering the compute buffer must be exactly what the
// forward pass would have written there (reuse exactness).
TEST(RopeTest, ApplyTokenIntoStridedHeadsMatchesApply) {
  const int head_dim = 64, n_heads = 3, stride = 16 * head_dim;
  RopeTable rope(head_dim, 10000.0f, RopeScaling{}, 1024);
  const std::vector<int32_t> pos = {0, 1, 77, 1023, 1024, 40000};  // tabulated and computed
  const int n = static_cast<int>(pos.size());
  const std::vector<float> x = RandomVec(static_cast<size_t>(n) * n_heads * head_dim, 9);
  std::vector<float> applied = x;
  rope.Apply(applied.data(), n, n_heads, pos.data());
  const auto& inv = rope.inv_freq();
  const std::vector<double> naive = NaiveRope(x, n, n_heads, head_dim, pos, [&](int32_t p, int i) {
    return static_cast<double>(static_cast<float>(p) * inv[i]);
  });
  for (int t = 0; t < n; ++t) {
    std::vector<float> dst(static_cast<size_t>(n_heads) * stride, -7.0f);
    rope.ApplyToken(x.data() + static_cast<size_t>(t) * n_heads * head_dim, dst.data(), n_heads, stride, pos[t]);
    for (int h = 0; h < n_heads; ++h) {
      for (int i = 0; i < head_dim; ++i) {
        const size_t src = (static_cast<size_t>(t) * n_heads + h) * head_dim + i;
        const float got = dst[static_cast<size_t>(h) * stride + i];
        EXPECT_EQ(got, applied[src]) << "token " << t << " head " << h << " dim " << i;
        EXPECT_NEAR(got, naive[src], 1e-5) << "token " << t << " head " << h << " dim " << i;
      }
      EXPECT_EQ(dst[static_cast<size_t>(h) * stride + head_dim], -7.0f);  // nothing past the head
    }
  }
}

TEST(RopeTest, TabulatedAndComputedPositionsAgreeExactly) {
  RopeTable small(64, 10000.0f, RopeScaling{}, 16);   // position 100 computed on the fly
  RopeTable large(64, 10000.0f, RopeScaling{}, 4096);  // position 100 tabulated
  ASSERT_LE(small.table_positions(), 100);
  ASSERT_GT(large.table_positions(), 100);
  std::vector<float> a = RandomVec(64 * 2, 4), b = a;
  const int32_t pos[2] = {100, 7};
  small.Apply(a.data(), 2, 1, pos);
  large.Apply(b.data(), 2, 1, pos);
  EXPECT_EQ(a, b);
  std::vector<float> c1(32), s1(32), c2(32), s2(32);
  small.CosSin(100, c1.data(), s1.data());
  large.CosSin(100, c2.data(), s2.data());
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(s1, s2);
}

// HF's angles as the header specifies them, computed here: cos/sin in double of the f32
// angle f32(position) * inv_freq, rounded to f32.
void ExpectHfAngles(const RopeTable& rope, int32_t position) {
  const int half = rope.head_dim() / 2;
  std::vector<float> c(half), s(half);
  rope.CosSin(position, c.data(), s.data());
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * rope.inv_freq()[i];
    EXPECT_EQ(c[i], static_cast<float>(std::cos(static_cast<double>(angle)))) << position << " " << i;
    EXPECT_EQ(s[i], static_cast<float>(std::sin(static_cast<double>(angle)))) << position << " " << i;
  }
}

TEST(RopeTest, PositionsPastTheTableAreTabulatedOnFirstUseWithHfAngles) {
  RopeTable rope(64, 10000.0f, RopeScaling{}, 16);
  ASSERT_EQ(rope.table_positions(), 16);
  EXPECT_EQ(rope.lazy_bytes(), 0);
  const int64_t chunk_bytes = int64_t{2} * RopeTable::kLazyChunkPositions * 32 * 4;
  for (int32_t p : {16, 17, 4000, 16 + RopeTable::kLazyChunkPositions - 1}) ExpectHfAngles(rope, p);
  EXPECT_EQ(rope.lazy_bytes(), chunk_bytes);  // one chunk held all four
  for (int32_t p : {16 + RopeTable::kLazyChunkPositions, 40000, 65535}) ExpectHfAngles(rope, p);
  EXPECT_EQ(rope.lazy_bytes(), 4 * chunk_bytes);
  // Past the lazily tabulated range (and before 0): computed per row, the same formula.
  const int32_t far = static_cast<int32_t>(RopeTable::kMaxLazyPositions) + 3;
  ExpectHfAngles(rope, far);
  ExpectHfAngles(rope, -5);
  EXPECT_EQ(rope.lazy_bytes(), 4 * chunk_bytes);
  // Rotation at those positions: the same as with the rows rotated one at a time out of
  // place, and as a table that holds the position eagerly.
  RopeTable eager(64, 10000.0f, RopeScaling{}, 32768);
  ASSERT_GT(eager.table_positions(), 20000);
  const std::vector<int32_t> pos = {20000, 17, far, -5};
  std::vector<float> a = RandomVec(64 * 2 * pos.size(), 11), b = a, c(a.size());
  rope.Apply(a.data(), static_cast<int64_t>(pos.size()), 2, pos.data());
  eager.Apply(b.data(), static_cast<int64_t>(pos.size()), 2, pos.data());
  EXPECT_EQ(a, b);
  const std::vector<float> x = RandomVec(64 * 2 * pos.size(), 11);
  for (size_t t = 0; t < pos.size(); ++t) rope.ApplyToken(x.data() + t * 128, c.data() + t * 128, 2, 64, pos[t]);
  EXPECT_EQ(a, c);
}

TEST(RopeTest, ThreadsFillingTheSameChunkSeeTheSameAngles) {
  RopeTable rope(64, 10000.0f, RopeScaling{}, 64);
  RopeTable reference(64, 10000.0f, RopeScaling{}, 64);
  const int n_threads = 4, rows = 256;
  std::vector<std::vector<float>> got(n_threads, RandomVec(64 * rows, 12));
  const std::vector<float> x = got[0];
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < rows; ++r) {
        const int32_t p = 70000 + (r * 37 + t * 11) % 3000;  // one chunk, in different orders
        rope.ApplyToken(x.data() + r * 64, got[t].data() + r * 64, 1, 64, p);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < n_threads; ++t) {
    std::vector<float> want(x.size());
    for (int r = 0; r < rows; ++r) {
      const int32_t p = 70000 + (r * 37 + t * 11) % 3000;
      reference.ApplyToken(x.data() + r * 64, want.data() + r * 64, 1, 64, p);
    }
    EXPECT_EQ(got[t], want) << t;
  }
  EXPECT_EQ(rope.lazy_bytes(), int64_t{2} * RopeTable::kLazyChunkPositions * 32 * 4);
}

// The AVX-512 rotate-half gives exactly the scalar loop's bits (products and sums rounded
// in the same order, never fused), for full and partial vectors and both signs, in and
// out of place.
// Both vector rotate-halves give the scalar loop's bits (no FMA contraction), so the
// KV a CPU enters does not depend on its ISA.
using RotateHalfFn = void (*)(const float*, const float*, float*, float*, const float*, const float*, float, int);
void ExpectRotateHalfIsBitIdenticalToScalar(RotateHalfFn rotate, std::initializer_list<int> halves) {
  for (int half : halves) {
    for (float sign : {1.0f, -1.0f}) {
      const std::vector<float> x = RandomVec(2 * half, 7 + half), c = RandomVec(half, 8), sv = RandomVec(half, 9);
      std::vector<float> want(2 * half);
      for (int i = 0; i < half; ++i) {
        const float a = x[i], b = x[half + i], si = sign * sv[i];
        volatile float ac = a * c[i], bs = b * si, bc = b * c[i], as = a * si;  // no contraction
        want[i] = ac - bs;
        want[half + i] = bc + as;
      }
      std::vector<float> got(2 * half);
      rotate(x.data(), x.data() + half, got.data(), got.data() + half, c.data(), sv.data(), sign, half);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << half << " " << sign;
      std::vector<float> in_place = x;
      rotate(in_place.data(), in_place.data() + half, in_place.data(), in_place.data() + half, c.data(), sv.data(),
             sign, half);
      EXPECT_EQ(std::memcmp(in_place.data(), want.data(), want.size() * sizeof(float)), 0) << half << " " << sign;
    }
  }
}

TEST(RopeTest, Avx2RotateHalfIsBitIdenticalToScalar) {
  if (!backend::GetCpuFeatures().avx2) GTEST_SKIP() << "no AVX2 on this CPU";
  ExpectRotateHalfIsBitIdenticalToScalar(internal::RotateHalfAvx2, {4, 8, 12, 16, 32, 40, 64});
}

TEST(RopeTest, Avx512RotateHalfIsBitIdenticalToScalar) {
  if (backend::ActiveIsa() != backend::Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  ExpectRotateHalfIsBitIdenticalToScalar(internal::RotateHalfAvx512, {8, 16, 32, 40, 64});
}

TEST(RopeTest, LinearScalingDividesInvFreq) {
  RopeScaling s;
  s.type = RopeScalingType::kLinear;
  s.factor = 4.0f;
  RopeTable rope(64, 10000.0f, s);
  const std::vector<double> base = ExpectedDefaultInvFreq(64, 10000.0);
  for (size_t i = 0; i < base.size(); ++i) EXPECT_NEAR(rope.inv_freq()[i], base[i] / 4.0, 2e-7 * base[i]);
  // Position p with factor 4 rotates like position p / 4 unscaled.
  RopeTable plain(64, 10000.0f, RopeScaling{});
  std::vector<float> a = RandomVec(64, 5), b = a;
  const int32_t p_scaled = 400, p_plain = 100;
  rope.Apply(a.data(), 1, 1, &p_scaled);
  plain.Apply(b.data(), 1, 1, &p_plain);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(a[i], b[i], 2e-5);
}

// transformers' _compute_llama3_parameters, evaluated in double.
std::vector<double> ExpectedLlama3(int head_dim, double theta, double factor, double low, double high, double old_ctx) {
  std::vector<double> inv = ExpectedDefaultInvFreq(head_dim, theta);
  const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  for (double& f : inv) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      f = f / factor;
    } else {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      f = (1 - smooth) * f / factor + smooth * f;
    }
  }
  return inv;
}

TEST(RopeTest, Llama3ScalingMatchesPublishedFormula) {
  struct Case {
    int head_dim;
    double theta, factor, low, high;
    int old_ctx;
  };
  // Llama 3.1 8B / 3.2 1B settings, and a smaller synthetic one.
  for (const Case& c : {Case{128, 500000, 8, 1, 4, 8192}, Case{64, 500000, 32, 1, 4, 8192}, Case{64, 10000, 4, 1, 2, 256}}) {
    RopeScaling s;
    s.type = RopeScalingType::kLlama3;
    s.factor = static_cast<float>(c.factor);
    s.low_freq_factor = static_cast<float>(c.low);
    s.high_freq_factor = static_cast<float>(c.high);
    s.original_max_position_embeddings = c.old_ctx;
    RopeTable rope(c.head_dim, static_cast<float>(c.theta), s);
    const std::vector<double> want = ExpectedLlama3(c.head_dim, c.theta, c.factor, c.low, c.high, c.old_ctx);
    const std::vector<double> plain = ExpectedDefaultInvFreq(c.head_dim, c.theta);
    int n_high = 0, n_low = 0, n_mid = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(rope.inv_freq()[i], want[i], 1e-6 * want[i]) << c.head_dim << " " << i;
      if (want[i] == plain[i]) {
        ++n_high;
      } else if (std::abs(want[i] - plain[i] / c.factor) < 1e-12 * plain[i]) {
        ++n_low;
      } else {
        ++n_mid;
      }
    }
    // Every regime is exercised.
    EXPECT_GT(n_high, 0);
    EXPECT_GT(n_low, 0);
    EXPECT_GT(n_mid, 0);
  }
}

}  // namespace
}  // namespace attic::attention
