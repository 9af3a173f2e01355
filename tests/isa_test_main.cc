// main() of the test programs that run once per ISA (the ISA matrix, CMakeLists.txt):
// the kernel, attention, engine, linking and sparse-decoding tests.
//
// ATTIC_TEST_ISA=avx2|generic makes a run one leg of the matrix: the kernels are capped
// at that ISA (ATTIC_ISA), so an AVX-512 machine checks its AVX2 and generic code too.
// A leg whose ISA is not below this CPU's best (capped at the best, it would run the
// same kernels as the default run) skips its tests, saying why. Every run prints the
// kernels it used.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attic/backend/cpu_features.h"

namespace {

class SkipLeg : public ::testing::Environment {
 public:
  explicit SkipLeg(std::string why) : why_(std::move(why)) {}
  void SetUp() override { GTEST_SKIP() << why_; }

 private:
  std::string why_;
};

}  // namespace

int main(int argc, char** argv) {
  using attic::backend::Isa;
  ::testing::InitGoogleTest(&argc, argv);
  const Isa best = attic::backend::BestIsa();
  const char* leg = std::getenv("ATTIC_TEST_ISA");
  if (leg != nullptr && *leg != '\0') {
    Isa want;
    if (std::strcmp(leg, "avx2") == 0) {
      want = Isa::kAvx2;
    } else if (std::strcmp(leg, "generic") == 0) {
      want = Isa::kGeneric;
    } else {
      std::fprintf(stderr, "ATTIC_TEST_ISA=%s: expected avx2 or generic\n", leg);
      return 2;
    }
    setenv("ATTIC_ISA", leg, 1);  // before any kernel is chosen
    if (static_cast<int>(want) >= static_cast<int>(best)) {
      ::testing::AddGlobalTestEnvironment(new SkipLeg(std::string("ISA matrix leg ") + leg + ": not below the CPU's best (" +
                                                      attic::backend::IsaName(best) + "), run by the default leg"));
    }
  }
  std::printf("[ kernels  ] %s (this CPU's best: %s)\n", attic::backend::IsaName(attic::backend::ActiveIsa()),
              attic::backend::IsaName(best));
  return RUN_ALL_TESTS();
}
