// backend::CalibrateLinear on a loaded model: it times the candidates this CPU runs,
// installs one of them, and whatever it installs computes the same products: every
// Linear of the model, at row counts on both sides of the chosen crossover, meets a
// float64 reference within the bound of its arithmetic (below). The timings themselves
// are not asserted (no clocks in make test): only that every candidate was timed and
// that the choice is one of them.
//
// Bound per output j: |y - ref| <= u_x * sum_i |x_i w_ji| + 1e-5 * sum_i |x_i w_ji|,
// with u_x = 2^-8 where the kernel rounds x to bf16 (round to nearest: relative error
// <= 2^-8 an element; the products are then exact in f32) and 0 elsewhere, and 1e-5
// for f32 accumulation over k <= 1536 terms (k * 2^-24 ~ 1e-4 worst case; f32 sums in
// blocks of 16-32 lanes stay far below it, as kernels_test's LinearTol).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "attic/backend/kernels.h"
#include "attic/engine/transformer.h"
#include "backend/cpu/kernel_table.h"
#include "engine/tiny_llama.h"

namespace attic::engine {
namespace {

using attic::testing::TempDir;
using attic::testing::TinyModel;
using attic::testing::TinySpec;

class KernelCalibrationTest : public ::testing::TestWithParam<DType> {
 protected:
  void TearDown() override { backend::cpu::ResetActiveKernels(); }
};

// y = x W^T for m rows through the kernels in use, against float64 on `ref_w`: the
// reference's copy of the same values (written to the model file in w's dtype).
void CheckLinear(backend::ThreadPool& pool, const WeightTensor& w, const std::vector<float>& ref_w, int64_t m,
                 double u_x, std::mt19937& rng, const std::string& what) {
  const int64_t k = w.cols(), n = w.rows();
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n), std::nanf(""));
  for (float& v : x) v = nd(rng);
  backend::Linear(pool, x.data(), m, w, nullptr, y.data());
  ASSERT_EQ(ref_w.size(), static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n; ++j) {
    const float* row = ref_w.data() + j * k;
    for (int64_t i = 0; i < m; ++i) {
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < k; ++c) {
        ref += static_cast<double>(x[i * k + c]) * row[c];
        mag += std::abs(static_cast<double>(x[i * k + c]) * row[c]);
      }
      const double bound = (u_x + 1e-5) * mag;
      ASSERT_LE(std::abs(y[i * n + j] - ref), bound) << what << " m=" << m << " row " << i << " out " << j;
    }
  }
}

TEST_P(KernelCalibrationTest, InstallsATimedCandidateThatMeetsTheReference) {
  TinySpec spec;
  spec.hidden = 256, spec.inter = 512, spec.layers = 2, spec.heads = 4, spec.kv_heads = 2, spec.head_dim = 64;
  spec.dtype = GetParam();
  TempDir dir;
  TinyModel tm;
  attic::testing::MakeTinyModel(spec, dir, &tm);
  ASSERT_FALSE(HasFatalFailure());
  backend::ThreadPool pool(2);
  backend::PrepackWeights(LinearsOf(*tm.model), pool, uint64_t{1} << 30);

  auto cal = backend::CalibrateLinear(LinearsOf(*tm.model), pool);
  ASSERT_TRUE(cal.ok()) << cal.status().ToString();
  std::set<std::string> at_one_row;
  for (const auto& t : cal->timings) {
    EXPECT_GT(t.us, 0) << t.kernel;
    EXPECT_GE(t.m, 1);
    EXPECT_LE(t.m, 64);
    if (t.m == 1) at_one_row.insert(t.kernel);
  }
  EXPECT_TRUE(at_one_row.count("gemv " + cal->gemv)) << "the chosen GEMV was timed at one row";
  EXPECT_TRUE(at_one_row.count("gemm " + cal->isa)) << "the GEMM was timed at one row";
  EXPECT_EQ(cal->isa, backend::cpu::KernelsFor(backend::ActiveIsa())->name);
  EXPECT_GE(cal->gemv_max_m, 0);
  EXPECT_LE(cal->gemv_max_m, 64);
  EXPECT_EQ(cal->sample_layers, 2);  // a small model: every layer
  EXPECT_FALSE(cal->Summary().empty());

  // The installed table is the candidate's GEMV with the measured crossover.
  const backend::cpu::KernelTable& t = backend::cpu::ActiveKernels();
  const WeightTensor& wq = tm.model->weights().layers[0].wq;
  const bool packed = wq.packed != nullptr && wq.packed_layout == static_cast<int>(t.isa);
  EXPECT_EQ(packed, cal->prepacked);
  EXPECT_EQ(packed ? t.gemv_max_m_packed : t.gemv_max_m[static_cast<int>(GetParam())], cal->gemv_max_m);

  // Every matrix, at rows on both sides of the crossover, meets the reference.
  const double u_x = GetParam() == DType::kBF16 && backend::cpu::KernelsFor(backend::ActiveIsa())->bf16_rounds_x
                         ? std::ldexp(1.0, -8)
                         : 0.0;
  std::mt19937 rng(5);
  for (int64_t m : {int64_t{1}, std::max<int64_t>(1, cal->gemv_max_m), cal->gemv_max_m + 1, int64_t{40}}) {
    const auto& layers = tm.model->weights().layers;
    const std::pair<const WeightTensor*, const std::vector<float>*> mats[] = {
        {&wq, &tm.nw.layers[0].wq}, {&layers[0].w_up, &tm.nw.layers[0].up}, {&layers[1].w_down, &tm.nw.layers[1].down}};
    for (const auto& [w, ref_w] : mats)
      CheckLinear(pool, *w, *ref_w, m, u_x, rng, std::string(DTypeName(GetParam())) + " after calibration");
  }
}

// A stored calibration (Serialize / Parse) installs the same choice without timing, and
// one that is not valid here is refused, leaving the kernels as they were.
TEST(KernelCalibration, AStoredChoiceInstallsAsMeasuredAndAForeignOneIsRefused) {
  TinySpec spec;
  spec.dtype = DType::kBF16;
  TempDir dir;
  TinyModel tm;
  attic::testing::MakeTinyModel(spec, dir, &tm);
  ASSERT_FALSE(HasFatalFailure());
  backend::ThreadPool pool(2);
  auto cal = backend::CalibrateLinear(LinearsOf(*tm.model), pool);
  ASSERT_TRUE(cal.ok()) << cal.status().ToString();
  const backend::cpu::KernelTable measured = backend::cpu::ActiveKernels();
  backend::cpu::ResetActiveKernels();

  auto back = backend::LinearCalibration::Parse(cal->Serialize());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->gemv, cal->gemv);
  EXPECT_EQ(back->gemv_max_m, cal->gemv_max_m);
  EXPECT_EQ(back->isa, cal->isa);
  EXPECT_EQ(back->prepacked, cal->prepacked);
  ASSERT_EQ(back->timings.size(), cal->timings.size());
  for (size_t i = 0; i < cal->timings.size(); ++i) {
    EXPECT_EQ(back->timings[i].kernel, cal->timings[i].kernel);
    EXPECT_EQ(back->timings[i].m, cal->timings[i].m);
  }
  ASSERT_TRUE(backend::InstallLinearCalibration(*back, LinearsOf(*tm.model)).ok());
  const backend::cpu::KernelTable& t = backend::cpu::ActiveKernels();
  EXPECT_EQ(t.gemv, measured.gemv);
  EXPECT_EQ(t.gemv_prepare, measured.gemv_prepare);
  EXPECT_EQ(t.gemv_max_m[static_cast<int>(DType::kBF16)], measured.gemv_max_m[static_cast<int>(DType::kBF16)]);
  EXPECT_EQ(t.gemv_max_m_packed, measured.gemv_max_m_packed);

  backend::cpu::ResetActiveKernels();
  const backend::cpu::KernelTable* base = &backend::cpu::ActiveKernels();
  backend::LinearCalibration foreign = *back;
  foreign.gemv = "avx1024";
  EXPECT_FALSE(backend::InstallLinearCalibration(foreign, LinearsOf(*tm.model)).ok());
  foreign = *back;
  foreign.prepacked = !foreign.prepacked;
  EXPECT_FALSE(backend::InstallLinearCalibration(foreign, LinearsOf(*tm.model)).ok());
  foreign = *back;
  foreign.isa = "riscv";
  EXPECT_FALSE(backend::InstallLinearCalibration(foreign, LinearsOf(*tm.model)).ok());
  EXPECT_EQ(&backend::cpu::ActiveKernels(), base) << "a refused choice installs nothing";
  for (const char* bad : {"", "gemv=avx2\n", "isa=avx2\ngemv=avx2\ngemv_max_m=x\nprepacked=0\n", "garbage"})
    EXPECT_FALSE(backend::LinearCalibration::Parse(bad).ok()) << bad;
  backend::cpu::ResetActiveKernels();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KernelCalibrationTest, ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace attic::engine
