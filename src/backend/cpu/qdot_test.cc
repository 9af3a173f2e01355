// The block-quantized weights' Linear (qdot.h: x quantized to 8-bit blocks, integer dot
// products) against a float64 reference on the weights' dequantized values
// (attic::ConvertToF32, itself checked against the format definitions in
// src/model/quant_formats_test.cc), for every kernel table this CPU runs and through the
// public entry points (the ISA matrix runs those once per ISA leg).
//
// Tolerance per output element y = sum_i w_i x_i (the derivation is the kernels'):
//   x is quantized per block b of 32 to dx_b * xq_i with |x_i - dx_b xq_i| <= dx_b / 2
//   (dx_b = max|x of b| / 127; the f32 rounding of x_i / dx_b and of dx_b adds < 2^-16
//   of dx_b): 0.50002 * S1, S1 = sum_i |w_i| dx_b(i);
//   f32 rounding: a product sc_g * dx_b, its product with the exact int32 group sum, the
//   same for the offset term, and at most k/128 + 8 accumulations (8 lanes, then the
//   horizontal sum): <= (k/128 + 12) 2^-24 <= 1.4e-6 (k <= 512) relative to terms of size
//   sum_i (|sc_g q_i| + |mn_g|)(|x_i| + dx_b), which the test blocks keep below 3x
//   S2 = sum_i |w_i| (|x_i| + dx_b(i)) (offsets <= 0.05 * 63 against codes up to 15 x 0.05
//   x 63): 1e-5 * S2 covers it with margin.
// The GEMM path (more rows than the GEMV crossover) widens weight tiles to f32 and has
// the f32 bound 1e-5 * S2 alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attic/backend/cpu_features.h"
#include "attic/backend/kernels.h"
#include "attic/backend/thread_pool.h"
#include "attic/tensor/quants.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/qdot.h"
#include "backend/cpu/qpack.h"

namespace attic::backend::cpu {
namespace {

const DType kTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,  DType::kQ5_1,  DType::kQ2_K, DType::kQ3_K,
                        DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS};

// Offsets of the f16 fields (scales, mins) in a block of t.
std::vector<int> HalfFields(DType t) {
  switch (t) {
    case DType::kQ4_1:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K: return {0, 2};
    case DType::kQ2_K: return {80, 82};
    case DType::kQ3_K: return {108};
    case DType::kQ6_K: return {208};
    default: return {0};
  }
}

struct QWeight {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;
  WeightTensor w;
};

// Random bytes in every block (all codes, scale and min bits), with its f16 fields set
// to finite scales in [0.001, 0.05] (signed for the mins).
QWeight MakeQWeight(std::mt19937& rng, DType t, int64_t n, int64_t k) {
  QWeight q;
  const size_t nbytes = DTypeBytes(t, static_cast<size_t>(n * k));
  q.bytes.resize(nbytes + 64);
  uint8_t* base = q.bytes.data() + (64 - reinterpret_cast<uintptr_t>(q.bytes.data()) % 64) % 64;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (size_t i = 0; i < nbytes; ++i) base[i] = static_cast<uint8_t>(byte(rng));
  const size_t bb = DTypeBlockBytes(t);
  for (size_t b = 0; b < nbytes / bb; ++b) {
    const std::vector<int> fields = HalfFields(t);
    for (size_t f = 0; f < fields.size(); ++f) {
      float v = scale(rng);
      if (f == 1 && (t == DType::kQ4_1 || t == DType::kQ5_1) && byte(rng) < 128) v = -v;
      const uint16_t h = F32ToF16(v);
      std::memcpy(base + b * bb + fields[f], &h, 2);
    }
  }
  q.deq.resize(static_cast<size_t>(n * k));
  ConvertToF32(t, base, q.deq.data(), q.deq.size());
  q.w.dtype = t;
  q.w.data = base;
  q.w.shape = {n, k};
  return q;
}

std::vector<float> RandomX(std::mt19937& rng, int64_t m, int64_t k) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = d(rng);
  return x;
}

// y against the float64 reference with the tolerance derived above.
void ExpectNear(const std::vector<float>& x, const QWeight& q, const std::vector<float>& bias, const float* y,
                int64_t m, bool quantized_x, const std::string& what) {
  const int64_t n = q.w.rows(), k = q.w.cols();
  int bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    std::vector<double> dx(static_cast<size_t>(k / 32));
    for (int64_t b = 0; b < k / 32; ++b) {
      double amax = 0;
      for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(static_cast<double>(x[i * k + 32 * b + l])));
      dx[b] = amax / 127.0;
    }
    for (int64_t j = 0; j < n; ++j) {
      double ref = bias.empty() ? 0.0 : bias[j], s1 = 0, s2 = 0;
      for (int64_t l = 0; l < k; ++l) {
        const double w = q.deq[j * k + l], xv = x[i * k + l];
        ref += w * xv;
        s1 += std::fabs(w) * dx[l / 32];
        s2 += std::fabs(w) * (std::fabs(xv) + dx[l / 32]);
      }
      const double tol = (quantized_x ? 0.50002 * s1 : 0.0) + 1e-5 * s2 + 1e-6;
      const double got = y[i * n + j];
      if (!(std::fabs(got - ref) <= tol) && bad++ < 5) {
        ADD_FAILURE() << what << " row " << i << " col " << j << ": " << got << " vs " << ref << " (tol " << tol << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(QuantDotTest, EveryTableGemvMatchesFloat64Reference) {
  std::mt19937 rng(7);
  for (DType t : kTypes) {
    const int64_t bs = DTypeBlockSize(t);
    for (int64_t k : {bs, 2 * bs, int64_t{512}}) {
      if (k % bs) continue;
      const int64_t n = 19;
      QWeight q = MakeQWeight(rng, t, n, k);
      std::vector<float> bias(static_cast<size_t>(n));
      for (float& b : bias) b = 0.25f;
      for (int64_t m : {1, 3, 17}) {
        std::vector<float> x = RandomX(rng, m, k);
        for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
          const KernelTable* tab = KernelsFor(isa);
          if (tab == nullptr) continue;
          AlignedBuffer scratch;
          const float* xp = tab->gemv_prepare(q.w, x.data(), m, &scratch);
          std::vector<float> y(static_cast<size_t>(m * n), -1.0f);
          tab->gemv(xp, m, q.w, bias.data(), y.data(), 0, n);
          ExpectNear(x, q, bias, y.data(), m, true,
                     std::string(tab->name) + " " + DTypeName(t) + " k=" + std::to_string(k) + " m=" +
                         std::to_string(m));
        }
      }
    }
  }
}

// A slice [n0, n1) writes only its columns, as the pool's split needs.
TEST(QuantDotTest, GemvSliceWritesOnlyItsColumns) {
  std::mt19937 rng(8);
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
    const KernelTable* tab = KernelsFor(isa);
    if (tab == nullptr) continue;
    QWeight q = MakeQWeight(rng, DType::kQ4_K, 10, 256);
    std::vector<float> x = RandomX(rng, 2, 256);
    AlignedBuffer scratch;
    const float* xp = tab->gemv_prepare(q.w, x.data(), 2, &scratch);
    std::vector<float> y(20, 123.0f);
    tab->gemv(xp, 2, q.w, nullptr, y.data(), 3, 7);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 10; ++j)
        if (j < 3 || j >= 7) {
          EXPECT_EQ(y[i * 10 + j], 123.0f) << tab->name;
        }
  }
}

// The public Linear (the active ISA's table; GEMV below the crossover, GEMM above) and
// LinearMulti over weights of different block types sharing x (a Q4_K_M layer mixes
// Q4_K and Q6_K).
TEST(QuantDotTest, PublicLinearAndMultiMatchReference) {
  std::mt19937 rng(9);
  ThreadPool pool(2);
  QWeight a = MakeQWeight(rng, DType::kQ4_K, 96, 512);
  QWeight b = MakeQWeight(rng, DType::kQ6_K, 40, 512);
  QWeight c = MakeQWeight(rng, DType::kQ4_K, 33, 512);
  for (int64_t m : {1, 4, 70}) {
    std::vector<float> x = RandomX(rng, m, 512);
    const bool gemv = m <= ActiveKernels().gemv_max_m[static_cast<int>(DType::kQ4_K)];
    std::vector<float> y(static_cast<size_t>(m * 96));
    Linear(pool, x.data(), m, a.w, nullptr, y.data());
    ExpectNear(x, a, {}, y.data(), m, gemv, "Linear m=" + std::to_string(m));
    std::vector<float> ya(static_cast<size_t>(m * 96)), yb(static_cast<size_t>(m * 40)), yc(static_cast<size_t>(m * 33));
    const LinearOutput outs[3] = {{&a.w, nullptr, ya.data()}, {&b.w, nullptr, yb.data()}, {&c.w, nullptr, yc.data()}};
    LinearMulti(pool, x.data(), m, outs, 3);
    ExpectNear(x, a, {}, ya.data(), m, gemv, "LinearMulti q4_k m=" + std::to_string(m));
    ExpectNear(x, b, {}, yb.data(), m, gemv, "LinearMulti q6_k m=" + std::to_string(m));
    ExpectNear(x, c, {}, yc.data(), m, gemv, "LinearMulti q4_k (2) m=" + std::to_string(m));
  }
}

// The tables that read packed block-quantized weights (qpack.h) on this CPU: AVX2, and
// AVX-512 with AVX512-VNNI.
std::vector<const KernelTable*> PackingTables() {
  std::vector<const KernelTable*> out;
  if (const KernelTable* t = KernelsFor(Isa::kAvx2)) out.push_back(t);
  if (const KernelTable* t = KernelsFor(Isa::kAvx512); t != nullptr && GetCpuFeatures().avx512_vnni) out.push_back(t);
  return out;
}

// Weights packed 16 rows at a time (qpack.cc): each table's GEMV over the packed copy,
// whole and in slices, for m across the kernels' x-row groups of 4, against the float64
// reference with the tolerance above (x quantized; the f32 rounding is that of at most
// k/32 + 4 scale products and accumulations per lane, inside the 1e-5 S2 bound).
TEST(QuantDotTest, PrepackedGemvMatchesFloat64Reference) {
  const std::vector<const KernelTable*> tabs = PackingTables();
  if (tabs.empty()) GTEST_SKIP() << "no table reads packed block-quantized weights on this CPU";
  std::mt19937 rng(11);
  ThreadPool pool(2);
  const DType packed_types[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                DType::kQ8_0, DType::kQ4_K, DType::kQ6_K};
  for (const KernelTable* tab : tabs) {
    for (DType t : packed_types) {
      if (tab->isa == Isa::kAvx2 && t == DType::kQ8_0) {  // its codes would saturate vpmaddubsw
        QWeight q = MakeQWeight(rng, t, 16, 256);
        EXPECT_FALSE(CanPrepack(*tab, q.w));
        continue;
      }
      for (int64_t k : {int64_t{256}, int64_t{512}}) {
        for (int64_t n : {int64_t{19}, int64_t{48}}) {
          QWeight q = MakeQWeight(rng, t, n, k);
          ASSERT_TRUE(CanPrepack(*tab, q.w)) << tab->name << " " << DTypeName(t);
          std::shared_ptr<AlignedBuffer> buf = PrepackWith(*tab, pool, &q.w);
          std::vector<float> bias(static_cast<size_t>(n));
          for (float& b : bias) b = 0.25f;
          for (int64_t m : {1, 3, 4, 5, 9}) {
            std::vector<float> x = RandomX(rng, m, k);
            AlignedBuffer scratch;
            const float* xp = tab->gemv_prepare(q.w, x.data(), m, &scratch);
            const std::string what = std::string(tab->name) + " " + DTypeName(t) + " k=" + std::to_string(k) +
                                     " n=" + std::to_string(n) + " m=" + std::to_string(m);
            std::vector<float> y(static_cast<size_t>(m * n), -1.0f);
            tab->gemv(xp, m, q.w, bias.data(), y.data(), 0, n);
            ExpectNear(x, q, bias, y.data(), m, true, "packed " + what);
            // Two slices at a panel boundary write the same values, and only their columns.
            std::vector<float> ys(static_cast<size_t>(m * n), 123.0f);
            tab->gemv(xp, m, q.w, bias.data(), ys.data(), 16, n);
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < 16; ++j) ASSERT_EQ(ys[i * n + j], 123.0f) << what;
            tab->gemv(xp, m, q.w, bias.data(), ys.data(), 0, 16);
            EXPECT_EQ(ys, y) << what;
            // Through LinearWith (the GEMV path for every m on packed weights).
            std::vector<float> yl(static_cast<size_t>(m * n));
            LinearWith(*tab, pool, x.data(), m, q.w, bias.data(), yl.data());
            ExpectNear(x, q, bias, yl.data(), m, true, "LinearWith " + what);
          }
        }
      }
    }
  }
}

// A Q4_K_M-like layer: packed q4_k and q6_k and an unpacked q5_k (a type without a
// packed layout) sharing x through LinearMulti, at decode and prefill sizes.
TEST(QuantDotTest, PrepackedAndRowMajorWeightsShareX) {
  const std::vector<const KernelTable*> tabs = PackingTables();
  if (tabs.empty()) GTEST_SKIP() << "no table reads packed block-quantized weights on this CPU";
  std::mt19937 rng(12);
  ThreadPool pool(2);
  for (const KernelTable* tab : tabs) {
    QWeight a = MakeQWeight(rng, DType::kQ4_K, 96, 512);
    QWeight b = MakeQWeight(rng, DType::kQ6_K, 40, 512);
    QWeight c = MakeQWeight(rng, DType::kQ5_K, 33, 512);
    ASSERT_FALSE(CanPrepack(*tab, c.w));
    std::shared_ptr<AlignedBuffer> pa = PrepackWith(*tab, pool, &a.w), pb = PrepackWith(*tab, pool, &b.w);
    for (int64_t m : {1, 4, 70}) {
      std::vector<float> x = RandomX(rng, m, 512);
      const bool c_gemv = m <= tab->gemv_max_m[static_cast<int>(DType::kQ5_K)];
      std::vector<float> ya(static_cast<size_t>(m * 96)), yb(static_cast<size_t>(m * 40)),
          yc(static_cast<size_t>(m * 33));
      const LinearOutput outs[3] = {{&a.w, nullptr, ya.data()}, {&b.w, nullptr, yb.data()}, {&c.w, nullptr, yc.data()}};
      LinearMultiWith(*tab, pool, x.data(), m, outs, 3);
      const std::string at = std::string(tab->name) + " m=" + std::to_string(m);
      ExpectNear(x, a, {}, ya.data(), m, true, "packed q4_k " + at);
      ExpectNear(x, b, {}, yb.data(), m, true, "packed q6_k " + at);
      ExpectNear(x, c, {}, yc.data(), m, c_gemv, "row-major q5_k " + at);
    }
  }
}

// The AVX-512 QuantizeX writes the same bytes as the portable one.
TEST(QuantDotTest, VnniQuantizeXEqualsPortable) {
  if (!GetCpuFeatures().avx512_vnni) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  std::mt19937 rng(13);
  const int64_t k = 256, m = 3;
  std::vector<float> x = RandomX(rng, m, k);
  for (int l = 64; l < 96; ++l) x[l] = 0.0f;
  x[130] = 1e-30f;
  AlignedBuffer s1, s2;
  const uint8_t* a = reinterpret_cast<const uint8_t*>(QuantizeX(x.data(), m, k, &s1));
  const uint8_t* b = reinterpret_cast<const uint8_t*>(vnni::QuantizeX(x.data(), m, k, &s2));
  EXPECT_EQ(std::memcmp(a, b, static_cast<size_t>(m * QuantXRowBytes(k))), 0);
}

// x's quantization itself: codes within 1/2 step of x / dx, sums per 16 exact.
TEST(QuantDotTest, QuantizeXFollowsItsDefinition) {
  std::mt19937 rng(10);
  const int64_t k = 96, m = 2;
  std::vector<float> x = RandomX(rng, m, k);
  x[5] = 0.0f;
  for (int l = 64; l < 96; ++l) x[l] = 0.0f;  // an all-zero block: dx 0, codes 0
  AlignedBuffer scratch;
  const uint8_t* p = reinterpret_cast<const uint8_t*>(QuantizeX(x.data(), m, k, &scratch));
  for (int64_t i = 0; i < m; ++i) {
    const uint8_t* r = p + i * QuantXRowBytes(k);
    const int8_t* xq = reinterpret_cast<const int8_t*>(r);
    const float* dx = reinterpret_cast<const float*>(r + k);
    const int32_t* s = reinterpret_cast<const int32_t*>(r + k + 4 * (k / 32));
    for (int64_t b = 0; b < k / 32; ++b) {
      double amax = 0;
      for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(static_cast<double>(x[i * k + 32 * b + l])));
      EXPECT_NEAR(dx[b], amax / 127.0, amax / 127.0 * 1e-7);
      for (int h = 0; h < 2; ++h) {
        int sum = 0;
        for (int l = 16 * h; l < 16 * h + 16; ++l) {
          const double v = x[i * k + 32 * b + l];
          if (amax > 0) {
            EXPECT_LE(std::fabs(v / dx[b] - xq[32 * b + l]), 0.5 + 1e-4);
          } else {
            EXPECT_EQ(xq[32 * b + l], 0);
          }
          sum += xq[32 * b + l];
        }
        EXPECT_EQ(s[2 * b + h], sum);
      }
    }
  }
}

}  // namespace
}  // namespace attic::backend::cpu
