// Tests every CPU kernel, for every ISA this machine can run, against naive scalar
// double-precision references written here.
//
// Tolerances (per output element, S = sum_k |x_k * w_k| + |bias|):
//   f32 math (all GEMV paths; GEMM with f32/f16/q8_0 weights; bf16 GEMM without
//   AVX512-BF16): |y - ref| <= 1e-5 * S + 1e-6, ref computed from the dequantised weights.
//   bf16 GEMM and GEMV with vdpbf16ps (CPUs with AVX512-BF16): x is rounded to bf16
//   (rel. error <= 2^-9 per element), so |y - ref| <= 4e-3 * S; against a reference
//   with x rounded the same way, the GEMV keeps the f32 bound.
//   Conversions to f32: bit-exact vs RefF16ToF32 / RefBf16ToF32 / RefToF32 (bit fields
//   decoded here); from f32: vs attic::F32ToBf16 / F32ToF16 (NaN payloads excepted). RmsNorm/Add: 1e-6 relative; SiluMul/Softmax: 2e-6 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attic/backend/convert.h"
#include "attic/backend/kernels.h"
#include "attic/backend/thread_pool.h"
#include "backend/cpu/kernel_table.h"

namespace attic::backend::cpu {
namespace {

std::vector<const KernelTable*> Tables() {
  std::vector<const KernelTable*> v;
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512})
    if (const KernelTable* t = KernelsFor(isa)) v.push_back(t);
  return v;
}

std::vector<float> RandomVec(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Independent of attic's converters: 16-bit floats decoded from their bit fields in
// double (IEEE 754 binary16: 1 sign, 5 exponent bits biased by 15, 10 fraction bits), bf16
// as the top half of an f32 (its definition), q8_0 as its blocks (an f16 scale, then 32
// int8: x = d * q, one rounding to f32 as the exact product fits a double).
float RefF16ToF32(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp(static_cast<double>(frac), -24);                 // subnormal, zero
  else if (exp == 31) v = frac == 0 ? std::numeric_limits<double>::infinity()   // inf, NaN
                                    : std::numeric_limits<double>::quiet_NaN();
  else v = std::ldexp(static_cast<double>(1024 + frac), exp - 25);
  return static_cast<float>(sign ? -v : v);
}
float RefBf16ToF32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::vector<float> RefToF32(DType dtype, const uint8_t* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint16_t u16;
    switch (dtype) {
      case DType::kF32: std::memcpy(&out[i], p + 4 * i, 4); break;
      case DType::kF16: std::memcpy(&u16, p + 2 * i, 2); out[i] = RefF16ToF32(u16); break;
      case DType::kBF16: std::memcpy(&u16, p + 2 * i, 2); out[i] = RefBf16ToF32(u16); break;
      case DType::kQ8_0: {
        const uint8_t* blk = p + (i / 32) * 34;
        std::memcpy(&u16, blk, 2);
        out[i] = static_cast<float>(static_cast<double>(RefF16ToF32(u16)) * static_cast<int8_t>(blk[2 + i % 32]));
        break;
      }
      default: ADD_FAILURE() << "no reference for " << DTypeName(dtype); break;
    }
  }
  return out;
}

// A weight matrix stored in `dtype` plus its exact f32 dequantisation (RefToF32).
struct TestWeight {
  std::vector<uint8_t> storage;
  std::vector<float> deq;  // [n, k]
  WeightTensor w;
};

// `offset`: bytes between a 64-byte boundary and the data (weight files store tensors at
// arbitrary offsets).
TestWeight MakeWeight(std::mt19937& rng, DType dtype, int64_t n, int64_t k, size_t offset = 0) {
  TestWeight t;
  std::vector<float> src = RandomVec(rng, n * k, 0.5f);
  t.storage.resize(DTypeBytes(dtype, static_cast<size_t>(n * k)) + 128);
  const size_t skip = (64 - reinterpret_cast<uintptr_t>(t.storage.data()) % 64) % 64 + offset;
  uint8_t* base = t.storage.data() + skip;
  if (dtype == DType::kQ8_0) {
    for (int64_t b = 0; b < n * k / 32; ++b) {
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[b * 32 + i]));
      uint16_t d16 = F32ToF16(amax / 127.0f);
      float d = F16ToF32(d16);
      uint8_t* blk = base + b * 34;
      std::memcpy(blk, &d16, 2);
      for (int i = 0; i < 32; ++i) {
        int q = d == 0 ? 0 : static_cast<int>(std::lround(src[b * 32 + i] / d));
        blk[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127, 127)));
      }
    }
  } else {
    ConvertFromF32(dtype, src.data(), base, static_cast<size_t>(n * k));
  }
  t.deq = RefToF32(dtype, base, n * k);
  t.w.dtype = dtype;
  t.w.data = base;
  t.w.shape = {n, k};
  return t;
}

// Checks y against a double reference with the tolerance described at the top.
void CheckLinear(const std::vector<float>& x, const TestWeight& tw, const float* bias, int64_t m, const float* y,
                 double rtol, const std::string& what) {
  const int64_t n = tw.w.rows(), k = tw.w.cols();
  int bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = bias ? bias[j] : 0.0, s = bias ? std::fabs(bias[j]) : 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        double p = static_cast<double>(x[i * k + kk]) * tw.deq[j * k + kk];
        ref += p;
        s += std::fabs(p);
      }
      double err = std::fabs(y[i * n + j] - ref);
      if (!(err <= rtol * s + 1e-6) && bad++ < 5)
        ADD_FAILURE() << what << " y[" << i << "," << j << "]=" << y[i * n + j] << " ref=" << ref << " err=" << err
                      << " bound=" << rtol * s + 1e-6;
    }
  }
}

struct Shape {
  int64_t m, n, k;
};

double LinearTol(const KernelTable& t, DType dtype, LinearPath path, int64_t m) {
  if (path == LinearPath::kAuto) path = m <= t.gemv_max_m[static_cast<int>(dtype)] ? LinearPath::kGemv : LinearPath::kGemm;
  if (dtype == DType::kBF16 && t.isa == Isa::kAvx512 &&
      (path == LinearPath::kGemm ? GetCpuFeatures().avx512_bf16 : avx512::Bf16GemvUsesDot()))
    return 4e-3;
  return 1e-5;
}

void RunLinearCases(DType dtype, const std::vector<Shape>& shapes) {
  std::mt19937 rng(1234 + static_cast<int>(dtype));
  ThreadPool pool2(2), pool1(1);
  for (const Shape& s : shapes) {
    TestWeight tw = MakeWeight(rng, dtype, s.n, s.k);
    std::vector<float> x = RandomVec(rng, s.m * s.k);
    std::vector<float> bias = RandomVec(rng, s.n);
    for (const KernelTable* t : Tables()) {
      for (LinearPath path : {LinearPath::kAuto, LinearPath::kGemv, LinearPath::kGemm}) {
        for (bool with_bias : {false, true}) {
          ThreadPool& pool = with_bias ? pool1 : pool2;
          std::vector<float> y(static_cast<size_t>(s.m * s.n), std::nanf(""));
          LinearWithPath(*t, path, pool, x.data(), s.m, tw.w, with_bias ? bias.data() : nullptr, y.data());
          std::string what = std::string(t->name) + " " + DTypeName(dtype) + " path=" +
                             std::to_string(static_cast<int>(path)) + " m=" + std::to_string(s.m) +
                             " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) + (with_bias ? " bias" : "");
          CheckLinear(x, tw, with_bias ? bias.data() : nullptr, s.m, y.data(), LinearTol(*t, dtype, path, s.m), what);
        }
      }
    }
  }
}

const std::vector<Shape>& FloatShapes() {
  static const std::vector<Shape> v = {
      {1, 1, 1},    {1, 1, 17},   {1, 5, 3},     {2, 7, 31},    {3, 16, 33},   {4, 17, 64},  {5, 47, 100},
      {7, 48, 257}, {8, 49, 16},  {9, 97, 600},  {13, 1, 1100}, {17, 130, 95}, {1, 600, 576}, {33, 389, 513},
      {130, 100, 1030}, {64, 48, 2}, {20, 50, 1601}, {40, 400, 2304}};
  return v;
}

const std::vector<Shape>& Q8Shapes() {
  static const std::vector<Shape> v = {{1, 1, 32},  {1, 5, 64},    {2, 47, 96},   {4, 49, 288},
                                       {5, 97, 576}, {9, 130, 320}, {17, 389, 544}, {130, 50, 32}};
  return v;
}

TEST(LinearTest, F32) { RunLinearCases(DType::kF32, FloatShapes()); }
TEST(LinearTest, F16) { RunLinearCases(DType::kF16, FloatShapes()); }
TEST(LinearTest, Bf16) { RunLinearCases(DType::kBF16, FloatShapes()); }

// A GEMM on a bf16 weight as loaded (`plain`), then on its prepacked copy (`packed`:
// t's prepack into a buffer pre-filled with NaN bits, tagged with t's ISA), which must
// give the same bits; tw.w keeps the packed copy (in *buf) afterwards.
struct PrepackedRun {
  std::vector<float> x, bias, plain, packed;
  std::string what;
};
PrepackedRun RunPrepacked(const KernelTable& t, ThreadPool& pool, std::mt19937& rng, const Shape& s, TestWeight& tw,
                          AlignedBuffer* buf) {
  const size_t bytes = t.prepacked_bytes(tw.w);
  PrepackedRun r;
  r.x = RandomVec(rng, s.m * s.k);
  r.bias = RandomVec(rng, s.n);
  r.what = "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
  r.plain.assign(static_cast<size_t>(s.m * s.n), std::nanf(""));
  r.packed.assign(r.plain.size(), std::nanf(""));
  LinearWithPath(t, LinearPath::kGemm, pool, r.x.data(), s.m, tw.w, r.bias.data(), r.plain.data());
  buf->Resize(bytes);
  std::memset(buf->data(), 0xff, bytes);  // NaN panels if misread
  t.prepack(pool, tw.w, buf->data());
  tw.w.packed = buf->data();
  tw.w.packed_layout = static_cast<int>(t.isa);
  LinearWithPath(t, LinearPath::kGemm, pool, r.x.data(), s.m, tw.w, r.bias.data(), r.packed.data());
  EXPECT_EQ(std::memcmp(r.plain.data(), r.packed.data(), r.plain.size() * sizeof(float)), 0) << r.what;
  return r;
}

// Prepacked bf16 weights (PrepackWeights' layout): the GEMM reads the same panels it
// would have packed, so its output is bit-identical; the automatic path (GEMV up to
// gemv_max_m_packed rows) still meets the reference bound.
TEST(LinearTest, Bf16PrepackedGemmIsBitIdentical) {
  const KernelTable* t = KernelsFor(Isa::kAvx512);
  if (t == nullptr || !GetCpuFeatures().avx512_bf16) GTEST_SKIP() << "needs AVX512-BF16";
  std::mt19937 rng(77);
  ThreadPool pool(2);
  for (const Shape& s : FloatShapes()) {
    TestWeight tw = MakeWeight(rng, DType::kBF16, s.n, s.k, 6);
    ASSERT_TRUE(avx512::CanPrepackBf16(tw.w));
    AlignedBuffer buf;
    const PrepackedRun r = RunPrepacked(*t, pool, rng, s, tw, &buf);
    std::vector<float> y(r.plain.size(), std::nanf(""));
    LinearWith(*t, pool, r.x.data(), s.m, tw.w, r.bias.data(), y.data());
    CheckLinear(r.x, tw, r.bias.data(), s.m, y.data(), 4e-3, "auto, prepacked " + r.what);
  }
}

// Prepacked f16 weights (the f32 path's panels kept in f16, on any AVX-512 CPU): the GEMM
// widens the same values in the same order as when it packs per call, so its output is
// bit-identical and meets the f32 bound; the automatic path (the packed GEMV up to
// gemv_max_m_packed rows) meets it too.
TEST(LinearTest, F16PrepackedGemmIsBitIdentical) {
  const KernelTable* t = KernelsFor(Isa::kAvx512);
  if (t == nullptr) GTEST_SKIP() << "needs AVX-512";
  std::mt19937 rng(79);
  ThreadPool pool(2);
  std::vector<Shape> shapes = FloatShapes();
  shapes.push_back({65, 1536, 576});  // a returning turn's new tokens through w_up of the 135M shape
  shapes.push_back({7, 576, 1536});   // ... and w_down: two k blocks
  for (const Shape& s : shapes) {
    TestWeight tw = MakeWeight(rng, DType::kF16, s.n, s.k);
    ASSERT_TRUE(CanPrepack(*t, tw.w));
    ASSERT_EQ(t->prepacked_bytes(tw.w), avx512::PrepackedF16Bytes(tw.w));
    AlignedBuffer buf;
    const PrepackedRun r = RunPrepacked(*t, pool, rng, s, tw, &buf);
    ASSERT_TRUE(avx512::IsPrepackedF16(tw.w));
    CheckLinear(r.x, tw, r.bias.data(), s.m, r.packed.data(), 1e-5, "gemm, prepacked f16 " + r.what);
    std::vector<float> y(r.plain.size(), std::nanf(""));
    LinearWith(*t, pool, r.x.data(), s.m, tw.w, r.bias.data(), y.data());
    CheckLinear(r.x, tw, r.bias.data(), s.m, y.data(), 1e-5, "auto, prepacked f16 " + r.what);
  }
}

// The AVX2 GEMM's prepacked bf16 and f16 panels (16 rows, k-major): the same panels the
// call would pack, the same micro-kernel, so the same bits; each row alone gives its bits
// in the batch; a weight packed in another ISA's layout is not read as one; the automatic
// path still meets the reference bound.
void RunAvx2PrepackedGemmCases(DType dtype) {
  const KernelTable* t = KernelsFor(Isa::kAvx2);
  if (t == nullptr) GTEST_SKIP() << "needs AVX2";
  std::mt19937 rng(dtype == DType::kF16 ? 80 : 78);
  ThreadPool pool(2);
  std::vector<Shape> shapes = FloatShapes();
  shapes.push_back({65, 1536, 576});  // a returning turn's new tokens through w_up of the 135M shape
  shapes.push_back({7, 576, 1536});
  for (const Shape& s : shapes) {
    TestWeight tw = MakeWeight(rng, dtype, s.n, s.k, 6);
    ASSERT_TRUE(avx2::CanPrepackDense(tw.w));
    AlignedBuffer buf;
    static_assert(avx2::kPackedLayout == static_cast<int>(Isa::kAvx2));
    const PrepackedRun r = RunPrepacked(*t, pool, rng, s, tw, &buf);
    CheckLinear(r.x, tw, r.bias.data(), s.m, r.plain.data(), 1e-5, std::string("gemm ") + DTypeName(dtype) + " " + r.what);
    std::vector<float> y(r.plain.size(), std::nanf(""));
    LinearWith(*t, pool, r.x.data(), s.m, tw.w, r.bias.data(), y.data());
    CheckLinear(r.x, tw, r.bias.data(), s.m, y.data(), 1e-5, "auto, prepacked " + r.what);
    // Rows are computed independently: each row alone gives the same bits (so the
    // automatic path, which takes this GEMM for every m on prepacked weights, is
    // batch-invariant as the GEMV is).
    for (int64_t i : {int64_t{0}, s.m / 2, s.m - 1}) {
      std::vector<float> row(static_cast<size_t>(s.n), std::nanf(""));
      LinearWith(*t, pool, r.x.data() + i * s.k, 1, tw.w, r.bias.data(), row.data());
      EXPECT_EQ(std::memcmp(row.data(), r.packed.data() + i * s.n, row.size() * sizeof(float)), 0)
          << r.what << " row " << i;
    }
    // Another ISA's layout: packed by somebody else, so packed again by the call.
    tw.w.packed_layout = static_cast<int>(Isa::kAvx512);
    std::vector<float> other(r.plain.size(), std::nanf(""));
    LinearWithPath(*t, LinearPath::kGemm, pool, r.x.data(), s.m, tw.w, r.bias.data(), other.data());
    EXPECT_EQ(std::memcmp(r.plain.data(), other.data(), r.plain.size() * sizeof(float)), 0) << r.what;
  }
}

TEST(LinearTest, Avx2Bf16PrepackedGemmIsBitIdentical) { RunAvx2PrepackedGemmCases(DType::kBF16); }
TEST(LinearTest, Avx2F16PrepackedGemmIsBitIdentical) { RunAvx2PrepackedGemmCases(DType::kF16); }

// The GEMV on prepacked bf16 weights reads the panels (one sequential stream) instead of
// the rows: against the double reference it keeps the GEMV's f32 bound (the dot form
// against x rounded to bf16, as the row-major dot form), in both forms; each row's bits
// do not depend on the other rows, on the pool's size or on how rows are cut into ranges.
void RunPrepackedGemvCases(const KernelTable& t, bool dot, DType dtype = DType::kBF16) {
  std::mt19937 rng(dot ? 91 : dtype == DType::kF16 ? 93 : 92);
  ThreadPool pool2(2), pool1(1);
  std::vector<Shape> shapes = FloatShapes();
  shapes.push_back({1, 1536, 576});   // the 135M shape's w_up
  shapes.push_back({2, 576, 1536});   // ... and w_down
  shapes.push_back({9, 4801, 64});    // many panels, a partial last one
  for (const Shape& s : shapes) {
    TestWeight tw = dtype == DType::kBF16 ? MakeWeight(rng, dtype, s.n, s.k, 6) : MakeWeight(rng, dtype, s.n, s.k);
    AlignedBuffer buf;
    buf.Resize(t.prepacked_bytes(tw.w));
    std::memset(buf.data(), 0xff, buf.size());  // NaN panels if misread
    t.prepack(pool2, tw.w, buf.data());
    tw.w.packed = buf.data();
    tw.w.packed_layout = static_cast<int>(t.isa);
    ASSERT_TRUE(dtype == DType::kBF16 ? avx512::IsPrepackedBf16(tw.w) : avx512::IsPrepackedF16(tw.w));
    std::vector<float> x = RandomVec(rng, s.m * s.k), bias = RandomVec(rng, s.n);
    std::vector<float> xr = x;  // x as the dot form sees it
    if (dot)
      for (float& v : xr) v = Bf16ToF32(F32ToBf16(v));
    const std::string what = std::string(dot ? "packed dot" : "packed fma") + " " + DTypeName(dtype) +
                             " m=" + std::to_string(s.m) +
                             " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
    std::vector<float> y2(static_cast<size_t>(s.m * s.n), std::nanf("")), y1 = y2;
    LinearWithPath(t, LinearPath::kGemv, pool2, x.data(), s.m, tw.w, bias.data(), y2.data());
    CheckLinear(xr, tw, bias.data(), s.m, y2.data(), 1e-5, what);
    LinearWithPath(t, LinearPath::kGemv, pool1, x.data(), s.m, tw.w, bias.data(), y1.data());
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0) << what << " pool sizes";
    for (int64_t i : {int64_t{0}, s.m - 1}) {
      std::vector<float> row(static_cast<size_t>(s.n), std::nanf(""));
      LinearWithPath(t, LinearPath::kGemv, pool2, x.data() + i * s.k, 1, tw.w, bias.data(), row.data());
      EXPECT_EQ(std::memcmp(row.data(), y2.data() + i * s.n, row.size() * sizeof(float)), 0) << what << " row " << i;
    }
  }
}

TEST(LinearTest, Bf16PrepackedGemvMatchesReference) {
  const KernelTable* t = KernelsFor(Isa::kAvx512);
  if (t == nullptr || !GetCpuFeatures().avx512_bf16) GTEST_SKIP() << "needs AVX512-BF16 (prepacking)";
  ASSERT_TRUE(avx512::Bf16GemvUsesDot());
  RunPrepackedGemvCases(*t, true);
  ASSERT_NE(Avx512FmaGemvTable(), nullptr);
  RunPrepackedGemvCases(*Avx512FmaGemvTable(), false);
}

// The same for prepacked f16 weights (one form: f32 FMA on exactly widened weights).
TEST(LinearTest, F16PrepackedGemvMatchesReference) {
  const KernelTable* t = KernelsFor(Isa::kAvx512);
  if (t == nullptr) GTEST_SKIP() << "needs AVX-512";
  RunPrepackedGemvCases(*t, false, DType::kF16);
}

TEST(LinearTest, Q8_0) { RunLinearCases(DType::kQ8_0, Q8Shapes()); }

// Tensors in weight files start anywhere (safetensors: 48 mod 64 is common); the AVX-512
// GEMV then walks rows from their 64-byte boundary with the head lanes masked.
TEST(LinearTest, MisalignedWeights) {
  std::mt19937 rng(77);
  ThreadPool pool(2);
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    const size_t esize = dt == DType::kF32 ? 4 : 2;
    for (size_t offset : {esize, size_t{16}, size_t{48}, size_t{60}}) {
      for (const Shape& s : std::vector<Shape>{{1, 7, 64}, {2, 50, 576}, {5, 33, 100}, {1, 20, 33}, {3, 9, 16},
                                               {1, 64, 2048}, {17, 40, 96}}) {
        TestWeight tw = MakeWeight(rng, dt, s.n, s.k, offset);
        std::vector<float> x = RandomVec(rng, s.m * s.k), bias = RandomVec(rng, s.n);
        for (const KernelTable* t : Tables()) {
          for (LinearPath path : {LinearPath::kGemv, LinearPath::kGemm}) {
            std::vector<float> y(static_cast<size_t>(s.m * s.n), std::nanf(""));
            LinearWithPath(*t, path, pool, x.data(), s.m, tw.w, bias.data(), y.data());
            CheckLinear(x, tw, bias.data(), s.m, y.data(), LinearTol(*t, dt, path, s.m),
                        std::string(t->name) + " " + DTypeName(dt) + " offset=" + std::to_string(offset) +
                            " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k));
          }
        }
      }
    }
  }
}

TEST(LinearTest, PublicEntryPointMatchesReference) {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    TestWeight tw = MakeWeight(rng, dt, 200, 576);
    for (int64_t m : {1, 3, 8, 40}) {
      std::vector<float> x = RandomVec(rng, m * 576), y(static_cast<size_t>(m * 200));
      Linear(pool, x.data(), m, tw.w, nullptr, y.data());
      CheckLinear(x, tw, nullptr, m, y.data(), LinearTol(ActiveKernels(), dt, LinearPath::kAuto, m),
                  "public");
    }
  }
}

// A GEMV row's result does not depend on the other rows of x: the same row alone (a
// decode step), among others at any position (a batch), with one or two threads, gives
// the same bits. Otherwise a sequence's logits would depend on what shared its step, and
// seeded sampling would not be reproducible under load.
void ExpectGemvRowsIndependentOfM(const KernelTable& t, DType dt, const std::string& form) {
  std::mt19937 rng(31 + static_cast<int>(dt));
  ThreadPool pool1(1), pool2(2);
  const Shape shapes[] = {{0, 37, 64}, {0, 130, 576}, {0, 9, 100}, {0, 600, 576}};
  for (const Shape& s : shapes) {
    for (size_t offset : {size_t{0}, size_t{48}}) {
      TestWeight tw = MakeWeight(rng, dt, s.n, s.k, dt == DType::kQ8_0 ? 0 : offset);
      const std::vector<float> row = RandomVec(rng, s.k);
      std::vector<float> alone(static_cast<size_t>(s.n));
      LinearWithPath(t, LinearPath::kGemv, pool1, row.data(), 1, tw.w, nullptr, alone.data());
      const int64_t max_m = std::max<int64_t>(t.gemv_max_m[static_cast<int>(dt)], 5);
      for (int64_t m = 1; m <= max_m; ++m) {
        for (int64_t at : {int64_t{0}, m / 2, m - 1}) {
          std::vector<float> x = RandomVec(rng, m * s.k);
          std::copy(row.begin(), row.end(), x.begin() + at * s.k);
          std::vector<float> y(static_cast<size_t>(m * s.n));
          LinearWithPath(t, LinearPath::kGemv, m % 2 ? pool2 : pool1, x.data(), m, tw.w, nullptr, y.data());
          const std::vector<float> got(y.begin() + at * s.n, y.begin() + (at + 1) * s.n);
          ASSERT_EQ(got, alone) << t.name << " " << form << " " << DTypeName(dt) << " n=" << s.n << " k=" << s.k
                                << " offset=" << offset << " m=" << m << " row " << at;
        }
      }
    }
  }
}

TEST(LinearTest, GemvRowResultsIndependentOfTheOtherRows) {
  for (const KernelTable* t : Tables())
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) ExpectGemvRowsIndependentOfM(*t, dt, "");
  // With AVX512-BF16 the bf16 rows above took vdpbf16ps; the f32-FMA form too.
  if (KernelsFor(Isa::kAvx512) == nullptr || !avx512::Bf16GemvUsesDot()) return;
  struct Restore {
    ~Restore() { avx512::SetBf16GemvDotDisabledForTesting(false); }
  } restore;
  avx512::SetBf16GemvDotDisabledForTesting(true);
  ExpectGemvRowsIndependentOfM(*KernelsFor(Isa::kAvx512), DType::kBF16, "f32-FMA form");
}

// LinearMode::kRowInvariant (the public entry points): far beyond the GEMM crossover a
// row still gets the bits it gets alone, and the result meets the reference bound.
TEST(LinearTest, RowInvariantModeHoldsBeyondTheCrossover) {
  std::mt19937 rng(41);
  ThreadPool pool(2);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
    TestWeight a = MakeWeight(rng, dt, 200, 576), b = MakeWeight(rng, dt, 64, 576);
    const std::vector<float> row = RandomVec(rng, 576);
    std::vector<float> alone(200), alone_b(64);
    Linear(pool, row.data(), 1, a.w, nullptr, alone.data(), LinearMode::kRowInvariant);
    Linear(pool, row.data(), 1, b.w, nullptr, alone_b.data(), LinearMode::kRowInvariant);
    for (int64_t m : {40, 130}) {
      std::vector<float> x = RandomVec(rng, m * 576);
      std::copy(row.begin(), row.end(), x.begin() + (m - 7) * 576);
      std::vector<float> y(m * 200), yb(m * 64);
      Linear(pool, x.data(), m, a.w, nullptr, y.data(), LinearMode::kRowInvariant);
      EXPECT_EQ(std::vector<float>(y.begin() + (m - 7) * 200, y.begin() + (m - 6) * 200), alone)
          << DTypeName(dt) << " m=" << m;
      CheckLinear(x, a, nullptr, m, y.data(), LinearTol(ActiveKernels(), dt, LinearPath::kGemv, m),
                  std::string("row-invariant ") + DTypeName(dt));
      LinearOutput outs[2] = {{&a.w, nullptr, y.data()}, {&b.w, nullptr, yb.data()}};
      LinearMulti(pool, x.data(), m, outs, 2, LinearMode::kRowInvariant);
      EXPECT_EQ(std::vector<float>(y.begin() + (m - 7) * 200, y.begin() + (m - 6) * 200), alone)
          << "multi " << DTypeName(dt) << " m=" << m;
      EXPECT_EQ(std::vector<float>(yb.begin() + (m - 7) * 64, yb.begin() + (m - 6) * 64), alone_b)
          << "multi " << DTypeName(dt) << " m=" << m;
    }
  }
}

TEST(LinearTest, MultiIsBitIdenticalToSeparateCalls) {
  std::mt19937 rng(21);
  ThreadPool pool(2);
  for (const KernelTable* t : Tables()) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32, DType::kQ8_0}) {
      const int64_t k = 576;
      TestWeight a = MakeWeight(rng, dt, 576, k), b = MakeWeight(rng, dt, 192, k), c = MakeWeight(rng, dt, 200, k);
      std::vector<float> bias = RandomVec(rng, 200);
      for (int64_t m : {1, 2, 5, 17, 40, 130}) {  // 130: x converted on the pool
        std::vector<float> x = RandomVec(rng, m * k);
        std::vector<float> ya(m * 576), yb(m * 192), yc(m * 200), ra(m * 576), rb(m * 192), rc(m * 200);
        LinearOutput outs[3] = {{&a.w, nullptr, ya.data()}, {&b.w, nullptr, yb.data()}, {&c.w, bias.data(), yc.data()}};
        LinearMultiWith(*t, pool, x.data(), m, outs, 3);
        LinearWith(*t, pool, x.data(), m, a.w, nullptr, ra.data());
        LinearWith(*t, pool, x.data(), m, b.w, nullptr, rb.data());
        LinearWith(*t, pool, x.data(), m, c.w, bias.data(), rc.data());
        EXPECT_EQ(ya, ra) << t->name << " " << DTypeName(dt) << " m=" << m;
        EXPECT_EQ(yb, rb) << t->name << " " << DTypeName(dt) << " m=" << m;
        EXPECT_EQ(yc, rc) << t->name << " " << DTypeName(dt) << " m=" << m;
      }
    }
  }
  // Prepacked bf16 weights on the GEMM path (one dispatch for all three) equal separate
  // prepacked calls and the unpacked GEMM.
  if (const KernelTable* t = KernelsFor(Isa::kAvx512); t != nullptr && GetCpuFeatures().avx512_bf16) {
    const int64_t k = 576;
    TestWeight w[3] = {MakeWeight(rng, DType::kBF16, 576, k), MakeWeight(rng, DType::kBF16, 192, k),
                       MakeWeight(rng, DType::kBF16, 200, k)};
    std::vector<float> bias = RandomVec(rng, 200);
    std::vector<float> unpacked[3];
    const int64_t m = 30;
    std::vector<float> x = RandomVec(rng, m * k);
    for (int i = 0; i < 3; ++i) {
      unpacked[i].resize(static_cast<size_t>(m * w[i].w.rows()));
      LinearWithPath(*t, LinearPath::kGemm, pool, x.data(), m, w[i].w, i == 2 ? bias.data() : nullptr,
                     unpacked[i].data());
    }
    // PrepackWith tags each copy with the AVX-512 layout, as PrepackWeights does: an
    // untagged copy is not read as one (GemvMaxM), so m = 30 would take the GEMV and this
    // would compare the GEMV's sums with the GEMM's.
    std::shared_ptr<AlignedBuffer> bufs[3];
    for (int i = 0; i < 3; ++i) bufs[i] = PrepackWith(*t, pool, &w[i].w);
    ASSERT_GT(m, t->gemv_max_m_packed);
    std::vector<float> y[3];
    LinearOutput outs[3];
    for (int i = 0; i < 3; ++i) {
      y[i].assign(unpacked[i].size(), std::nanf(""));
      outs[i] = {&w[i].w, i == 2 ? bias.data() : nullptr, y[i].data()};
    }
    LinearMultiWith(*t, pool, x.data(), m, outs, 3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(y[i], unpacked[i]) << "prepacked multi, output " << i;
  }
  // Different alignments: not fused, same results.
  {
    TestWeight a = MakeWeight(rng, DType::kBF16, 96, 64, 48), b = MakeWeight(rng, DType::kBF16, 40, 64, 0);
    std::vector<float> x = RandomVec(rng, 64), ya(96), yb(40);
    LinearOutput outs[2] = {{&a.w, nullptr, ya.data()}, {&b.w, nullptr, yb.data()}};
    LinearMulti(pool, x.data(), 1, outs, 2);
    const double tol = LinearTol(ActiveKernels(), DType::kBF16, LinearPath::kGemv, 1);
    CheckLinear(x, a, nullptr, 1, ya.data(), tol, "multi misaligned a");
    CheckLinear(x, b, nullptr, 1, yb.data(), tol, "multi misaligned b");
  }
  // Public entry point.
  TestWeight a = MakeWeight(rng, DType::kBF16, 64, 100), b = MakeWeight(rng, DType::kBF16, 33, 100);
  std::vector<float> x = RandomVec(rng, 100), ya(64), yb(33);
  LinearOutput outs[2] = {{&a.w, nullptr, ya.data()}, {&b.w, nullptr, yb.data()}};
  LinearMulti(pool, x.data(), 1, outs, 2);
  const double tol = LinearTol(ActiveKernels(), DType::kBF16, LinearPath::kGemv, 1);
  CheckLinear(x, a, nullptr, 1, ya.data(), tol, "multi a");
  CheckLinear(x, b, nullptr, 1, yb.data(), tol, "multi b");
}

// The AVX-512 bf16 GEMV, both forms (vdpbf16ps where the CPU has AVX512-BF16, and the
// f32-FMA form), over row counts that leave partial 4-row groups, k around the 32-lane
// chunks, every row alignment, several threads, and weights whose neighbouring bytes
// (the lanes the GEMV loads but masks off) are +inf: any leak would make y inf or NaN.
// vdpbf16ps is checked against a double reference with x rounded to bf16 (so only f32
// accumulation error remains: the 1e-5 bound), the FMA form against the exact one.
void RunBf16GemvCases(bool dot) {
  const KernelTable* t = KernelsFor(Isa::kAvx512);
  std::mt19937 rng(dot ? 91 : 92);
  ThreadPool pool2(2), pool1(1);
  const std::vector<Shape> shapes = {{1, 1, 1},    {1, 3, 2},     {1, 4, 31},    {1, 5, 32},   {1, 7, 33},
                                     {1, 130, 2048}, {1, 67, 100}, {2, 9, 63},    {3, 6, 64},   {4, 13, 65},
                                     {5, 33, 576},  {8, 47, 257},  {13, 18, 129}, {16, 70, 1024}, {1, 300, 2304}};
  for (size_t offset : {size_t{0}, size_t{2}, size_t{16}, size_t{32}, size_t{48}, size_t{62}}) {
    for (const Shape& s : shapes) {
      TestWeight tw = MakeWeight(rng, DType::kBF16, s.n, s.k, offset);
      // +inf in every byte pair around the tensor within its storage.
      uint16_t* first = static_cast<uint16_t*>(const_cast<void*>(tw.w.data));
      for (uint16_t* p = reinterpret_cast<uint16_t*>(tw.storage.data() + (offset & 1)); p < first; ++p) *p = 0x7f80;
      for (uint16_t* p = first + s.n * s.k;
           reinterpret_cast<uint8_t*>(p + 1) <= tw.storage.data() + tw.storage.size(); ++p)
        *p = 0x7f80;
      std::vector<float> x = RandomVec(rng, s.m * s.k), bias = RandomVec(rng, s.n);
      std::vector<float> xr = x;  // x as the dot form sees it
      if (dot)
        for (float& v : xr) v = Bf16ToF32(F32ToBf16(v));
      for (bool with_bias : {false, true}) {
        ThreadPool& pool = with_bias ? pool1 : pool2;
        std::vector<float> y(static_cast<size_t>(s.m * s.n), std::nanf(""));
        LinearWithPath(*t, LinearPath::kGemv, pool, x.data(), s.m, tw.w, with_bias ? bias.data() : nullptr, y.data());
        CheckLinear(xr, tw, with_bias ? bias.data() : nullptr, s.m, y.data(), 1e-5,
                    std::string(dot ? "bf16 dot" : "bf16 fma") + " offset=" + std::to_string(offset) +
                        " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                        (with_bias ? " bias" : ""));
      }
    }
  }
}

TEST(LinearTest, Bf16GemvDotMatchesRoundedReference) {
  if (KernelsFor(Isa::kAvx512) == nullptr || !avx512::Bf16GemvUsesDot()) GTEST_SKIP() << "no AVX512-BF16";
  RunBf16GemvCases(true);
}

TEST(LinearTest, Bf16GemvFmaFormMatchesReference) {
  if (KernelsFor(Isa::kAvx512) == nullptr) GTEST_SKIP() << "no AVX-512";
  struct Restore {
    ~Restore() { avx512::SetBf16GemvDotDisabledForTesting(false); }
  } restore;
  avx512::SetBf16GemvDotDisabledForTesting(true);
  ASSERT_FALSE(avx512::Bf16GemvUsesDot());
  RunBf16GemvCases(false);
}

// --- conversions -------------------------------------------------------------------------

std::vector<float> SpecialFloats(std::mt19937& rng, int64_t n) {
  std::vector<float> v = RandomVec(rng, n, 3.0f);
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 1e6f, -1e6f, 6.1e-5f, 5.96e-8f, 2.98e-8f,
                            1e-40f, -1e-40f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 1.00390625f /* bf16 tie */, 1.01171875f,
                            3.4e38f, 1.0009765625f, 1.00048828125f /* f16 tie */};
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]) && i < v.size(); ++i) v[i * 3 % v.size()] = specials[i];
  // Random bit patterns cover every exponent.
  std::uniform_int_distribution<uint32_t> bits;
  for (int64_t i = 0; i < n / 4; ++i) {
    uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    if (!std::isnan(f)) v[static_cast<size_t>(i * 4 + 1)] = f;
  }
  return v;
}

TEST(ConvertTest, MatchesScalar) {
  std::mt19937 rng(99);
  for (const KernelTable* t : Tables()) {
    for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 33, 1000}) {
      std::vector<float> f = SpecialFloats(rng, n);
      std::vector<uint16_t> h(static_cast<size_t>(n) + 1, 0xdead), b(static_cast<size_t>(n) + 1, 0xdead);
      t->f32_to_f16(f.data(), h.data(), n);
      t->f32_to_bf16(f.data(), b.data(), n);
      EXPECT_EQ(h[static_cast<size_t>(n)], 0xdead) << "wrote past the end";
      EXPECT_EQ(b[static_cast<size_t>(n)], 0xdead) << "wrote past the end";
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(h[i], F32ToF16(f[i])) << t->name << " f16 of " << f[i];
        ASSERT_EQ(b[i], F32ToBf16(f[i])) << t->name << " bf16 of " << f[i];
      }
      // Every 16-bit pattern back to f32.
      std::vector<uint16_t> all(65536);
      for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
      std::vector<float> out(65536);
      t->f16_to_f32(all.data() + 3, out.data(), 65533);
      for (int i = 3; i < 65536; ++i) {
        float ref = RefF16ToF32(static_cast<uint16_t>(i));
        if (std::isnan(ref)) ASSERT_TRUE(std::isnan(out[i - 3])) << i;
        else ASSERT_EQ(std::memcmp(&ref, &out[i - 3], 4), 0) << t->name << " f16 " << i;
      }
      t->bf16_to_f32(all.data() + 3, out.data(), 65533);
      for (int i = 3; i < 65536; ++i) {
        float ref = RefBf16ToF32(static_cast<uint16_t>(i));
        ASSERT_EQ(std::memcmp(&ref, &out[i - 3], 4), 0) << t->name << " bf16 " << i;
      }
    }
    // NaN stays NaN.
    float nan = std::nanf("");
    uint16_t h, b;
    t->f32_to_f16(&nan, &h, 1);
    t->f32_to_bf16(&nan, &b, 1);
    EXPECT_TRUE(std::isnan(F16ToF32(h)));
    EXPECT_TRUE(std::isnan(Bf16ToF32(b)));
  }
}

// Each table's row_to_f32 against RefToF32 (bit-level, written here), bit for bit.
TEST(ConvertTest, RowToF32AllDtypes) {
  std::mt19937 rng(5);
  for (const KernelTable* t : Tables()) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
      const int64_t k = dt == DType::kQ8_0 ? 96 : 77;
      TestWeight tw = MakeWeight(rng, dt, 3, k);
      std::vector<float> out(static_cast<size_t>(k));
      for (int64_t r = 0; r < 3; ++r) {
        t->row_to_f32(dt, tw.w.row(r), out.data(), k);
        for (int64_t i = 0; i < k; ++i)
          ASSERT_EQ(std::memcmp(&out[i], &tw.deq[r * k + i], 4), 0) << t->name << " " << DTypeName(dt) << " " << i;
      }
    }
  }
}

TEST(ConvertTest, PublicApi) {
  std::vector<float> f = {1.5f, -2.25f, 3.0f};
  std::vector<uint16_t> h(3), b(3);
  std::vector<float> back(3);
  ConvertF32ToF16(f.data(), h.data(), 3);
  ConvertF16ToF32(h.data(), back.data(), 3);
  EXPECT_EQ(back, f);
  ConvertF32ToBf16(f.data(), b.data(), 3);
  ConvertBf16ToF32(b.data(), back.data(), 3);
  EXPECT_EQ(back, f);
  ConvertRowToF32(DType::kF32, f.data(), back.data(), 3);
  EXPECT_EQ(back, f);
}

TEST(EmbeddingRowTest, AllDtypes) {
  std::mt19937 rng(11);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
    TestWeight tw = MakeWeight(rng, dt, 10, 64);
    std::vector<float> out(64);
    EmbeddingRow(tw.w, 7, out.data());
    for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], tw.deq[7 * 64 + i]) << DTypeName(dt);
  }
}

// --- elementwise ops ---------------------------------------------------------------------

void ExpectNear(double got, double ref, double rtol, const std::string& what) {
  if (!(std::fabs(got - ref) <= rtol * std::fabs(ref) + 1e-30)) ADD_FAILURE() << what << " got " << got << " ref " << ref;
}

TEST(OpsTest, RmsNorm) {
  std::mt19937 rng(3);
  for (const KernelTable* t : Tables()) {
    for (int64_t n : {1, 5, 16, 31, 576, 2049}) {
      std::vector<float> x = RandomVec(rng, n, 2.0f), w = RandomVec(rng, n), out(static_cast<size_t>(n));
      t->rmsnorm_row(x.data(), w.data(), n, 1e-5f, out.data());
      double ss = 0;
      for (float v : x) ss += static_cast<double>(v) * v;
      double scale = 1.0 / std::sqrt(ss / n + 1e-5);
      for (int64_t i = 0; i < n; ++i) ExpectNear(out[i], x[i] * scale * w[i], 1e-6, std::string(t->name) + " rmsnorm");
      t->rmsnorm_row(x.data(), w.data(), n, 1e-5f, x.data());  // in place
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], out[i]);
    }
  }
  // Public entry point, many rows (parallel).
  ThreadPool pool(2);
  const int64_t rows = 70, n = 600;
  std::vector<float> x = RandomVec(rng, rows * n), w = RandomVec(rng, n), out(static_cast<size_t>(rows * n));
  RmsNorm(pool, x.data(), w.data(), rows, n, 1e-6f, out.data());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[r * n + i]) * x[r * n + i];
    double scale = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int64_t i = 0; i < n; ++i) ExpectNear(out[r * n + i], x[r * n + i] * scale * w[i], 1e-6, "rmsnorm rows");
  }
}

TEST(OpsTest, SiluMulAndAdd) {
  std::mt19937 rng(4);
  for (const KernelTable* t : Tables()) {
    for (int64_t n : {1, 7, 16, 33, 1000}) {
      std::vector<float> g = RandomVec(rng, n, 4.0f), u = RandomVec(rng, n);
      if (n > 5) {
        g[0] = 100.0f;
        g[1] = -100.0f;
        g[2] = 0.0f;
        g[3] = -20.0f;
        g[4] = 30.0f;
      }
      std::vector<float> g0 = g;
      t->silu_mul(g.data(), u.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        double ref = g0[i] / (1.0 + std::exp(-static_cast<double>(g0[i]))) * u[i];
        if (!(std::fabs(g[i] - ref) <= 2e-6 * std::fabs(ref) + 1e-30))
          ADD_FAILURE() << t->name << " silu(" << g0[i] << ")*" << u[i] << " = " << g[i] << " ref " << ref;
      }
      std::vector<float> a = RandomVec(rng, n), b = RandomVec(rng, n), a0 = a;
      t->add(a.data(), b.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], a0[i] + b[i]);
    }
  }
  ThreadPool pool(2);
  std::vector<float> g = RandomVec(rng, 100000), u = RandomVec(rng, 100000), g0 = g;
  SiluMul(pool, g.data(), u.data(), 100000);
  for (int i = 0; i < 100000; i += 997) ExpectNear(g[i], g0[i] / (1.0 + std::exp(-double(g0[i]))) * u[i], 2e-6, "silu pub");
}

// The engine cuts rows x intermediate_size into ranges that change with the step's row
// count, so an element's SiLU must not depend on where it falls in the range (vector body
// or tail): else a sequence's logits depend on what shares its step (--deterministic).
TEST(OpsTest, SiluMulOfAnElementIndependentOfItsPlaceInTheRange) {
  std::mt19937 rng(8);
  const int64_t n = 43;
  const std::vector<float> g = RandomVec(rng, n, 4.0f), u = RandomVec(rng, n);
  for (const KernelTable* t : Tables()) {
    std::vector<float> whole = g;
    t->silu_mul(whole.data(), u.data(), n);
    for (int64_t begin = 0; begin < n; ++begin) {
      for (int64_t len = 1; begin + len <= n; ++len) {
        std::vector<float> part(g.begin() + begin, g.begin() + begin + len);
        t->silu_mul(part.data(), u.data() + begin, len);
        for (int64_t i = 0; i < len; ++i)
          ASSERT_EQ(part[i], whole[begin + i]) << t->name << " element " << begin + i << " in [" << begin << ", "
                                               << begin + len << ")";
      }
    }
  }
}

TEST(OpsTest, Softmax) {
  std::mt19937 rng(6);
  for (const KernelTable* t : Tables()) {
    for (int64_t n : {1, 2, 15, 16, 17, 100, 4097}) {
      std::vector<float> x = RandomVec(rng, n, 5.0f);
      if (n > 3) {
        x[1] = -std::numeric_limits<float>::infinity();  // masked position
        x[2] = -200.0f;
      }
      std::vector<float> x0 = x;
      t->softmax(x.data(), n);
      double mx = -INFINITY, sum = 0;
      for (float v : x0) mx = std::max(mx, static_cast<double>(v));
      for (float v : x0) sum += std::exp(v - mx);
      for (int64_t i = 0; i < n; ++i) {
        double ref = std::exp(x0[i] - mx) / sum;
        if (!(std::fabs(x[i] - ref) <= 2e-6 * ref + 1e-12))
          ADD_FAILURE() << t->name << " softmax n=" << n << " i=" << i << " got " << x[i] << " ref " << ref;
      }
    }
  }
}

// --- thread pool ---------------------------------------------------------------------------

TEST(ThreadPoolTest, CoversEveryTaskOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      for (int rep = 0; rep < 50; ++rep)
        pool.ParallelFor(n, [&](int64_t t, int th) {
          ASSERT_GE(th, 0);
          ASSERT_LT(th, threads);
          hits[static_cast<size_t>(t)].fetch_add(1);
        });
      for (auto& h : hits) ASSERT_EQ(h.load(), 50);
    }
  }
}

TEST(ThreadPoolTest, RangesAreAlignedAndComplete) {
  ThreadPool pool(2);
  for (int64_t n : {1, 15, 16, 17, 100, 1001}) {
    for (int64_t align : {1, 16, 48}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.ParallelRange(n, align, [&](int64_t b, int64_t e, int) {
        ASSERT_EQ(b % align, 0);
        ASSERT_TRUE(e == n || e % align == 0);
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

}  // namespace
}  // namespace attic::backend::cpu
