#include "attic/store/dram_size.h"

#include <gtest/gtest.h>

namespace attic::store {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20, kGiB = uint64_t{1} << 30;

// The rule written out (dram_size.h): min(8 GiB, physical / 4, available / 2), down to
// a multiple of 64 MiB. Each case names which term decides.
TEST(AutoDramTierBytes, TheSmallestOfTheThreeBoundsDecides) {
  EXPECT_EQ(AutoDramTierBytes(64 * kGiB, 60 * kGiB), 8 * kGiB);   // the 8 GiB ceiling
  EXPECT_EQ(AutoDramTierBytes(24 * kGiB, 20 * kGiB), 6 * kGiB);   // a quarter of 24 GiB
  EXPECT_EQ(AutoDramTierBytes(24 * kGiB, 6 * kGiB), 3 * kGiB);    // half of what is available
  EXPECT_EQ(AutoDramTierBytes(512 * kGiB, 12 * kGiB), 6 * kGiB);  // a big machine that is busy
  EXPECT_EQ(AutoDramTierBytes(8 * kGiB, 8 * kGiB), 2 * kGiB);
}

TEST(AutoDramTierBytes, RoundsDownToWhole64MiB) {
  // A quarter of 10 GiB + 100 MiB is 2,585 MiB: 2,560 MiB after rounding down.
  EXPECT_EQ(AutoDramTierBytes(10 * kGiB + 100 * kMiB, 64 * kGiB), 2560 * kMiB);
  // Half of 1,001 MiB is 500.5 MiB: 448 MiB.
  EXPECT_EQ(AutoDramTierBytes(16 * kGiB, 1001 * kMiB), 448 * kMiB);
  EXPECT_EQ(AutoDramTierBytes(16 * kGiB, 1001 * kMiB) % kAutoDramGrainBytes, 0u);
}

TEST(AutoDramTierBytes, LessThan64MiBIsNoTier) {
  EXPECT_EQ(AutoDramTierBytes(16 * kGiB, 128 * kMiB), 64 * kMiB);  // exactly the smallest tier
  EXPECT_EQ(AutoDramTierBytes(16 * kGiB, 127 * kMiB), 0u);
  EXPECT_EQ(AutoDramTierBytes(255 * kMiB, 16 * kGiB), 0u);
  EXPECT_EQ(AutoDramTierBytes(16 * kGiB, 1), 0u);  // a cgroup at its limit
}

TEST(AutoDramTierBytes, WhatTheHostDoesNotReportIsNoConstraint) {
  EXPECT_EQ(AutoDramTierBytes(16 * kGiB, 0), 4 * kGiB);  // no MemAvailable (kernels before 3.14)
  EXPECT_EQ(AutoDramTierBytes(0, 6 * kGiB), 3 * kGiB);
  EXPECT_EQ(AutoDramTierBytes(0, 0), kAutoDramMaxBytes);
}

TEST(ParseMemAvailable, ReadsTheKernelsLineInKiB) {
  const char* meminfo =
      "MemTotal:       24634580 kB\n"
      "MemFree:         1532728 kB\n"
      "MemAvailable:   19873412 kB\n"
      "Buffers:          364400 kB\n";
  EXPECT_EQ(ParseMemAvailable(meminfo), uint64_t{19873412} * 1024);
  EXPECT_EQ(ParseMemAvailable("MemAvailable: 7 kB"), 7u * 1024);  // last line, no newline
  EXPECT_EQ(ParseMemAvailable("MemTotal: 100 kB\nMemFree: 50 kB\n"), 0u);
  EXPECT_EQ(ParseMemAvailable("MemAvailable:   kB\n"), 0u);
  EXPECT_EQ(ParseMemAvailable(""), 0u);
}

// Not the sizes of this machine (they vary), only that the reader finds some on Linux.
TEST(ReadHostMemory, ReportsThisMachinesMemory) {
  const HostMemory m = ReadHostMemory();
  EXPECT_GT(m.physical_bytes, 0u);
  EXPECT_GT(m.available_bytes, 0u);
  EXPECT_LE(m.available_bytes, m.physical_bytes);
}

}  // namespace
}  // namespace attic::store
