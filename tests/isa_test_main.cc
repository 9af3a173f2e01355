// main() of the test programs that run once per ISA (the ISA matrix, CMakeLists.txt):
// the kernel, attention, engine, linking and sparse-decoding tests.
//
// ATTIC_TEST_ISA=avx2|generic makes a run one leg of the matrix: the kernels are capped
// at that ISA (ATTIC_ISA), so an AVX-512 machine checks its AVX2 and generic code too.
// A leg whose ISA is this CPU's best repeats the default run, so its tests are skipped,
// saying why. Every run prints the kernels it used.
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
    const bool known = std::strcmp(leg, "avx2") == 0 || std::strcmp(leg, "generic") == 0;
    if (!known) {
      std::fprintf(stderr, "ATTIC_TEST_ISA=%s: expected avx2 or generic\n", leg);
      return 2;
    }
    setenv("ATTIC_ISA", leg, 1);  // before any kernel is chosen
    if (std::strcmp(leg, attic::backend::IsaName(best)) == 0) {
      ::testing::AddGlobalTestEnvironment(new SkipLeg(std::string("ISA matrix leg ") + leg +
                                                      ": the CPU's best ISA, run by the default leg"));
    }
  }
  std::printf("[ kernels  ] %s (this CPU's best: %s)\n", attic::backend::IsaName(attic::backend::ActiveIsa()),
              attic::backend::IsaName(best));
  return RUN_ALL_TESTS();
}
