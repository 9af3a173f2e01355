// What a benchmark run measures about itself and feeds the engine: a monotonic clock in
// seconds, the process's peak resident memory, the machine it ran on (CPU model, load
// average: this VM's CPU changes between sessions and its cores are shared), and seeded
// random token ids. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attic::bench {

// Seconds on a monotonic clock (steady_clock); only differences mean anything.
double NowSeconds();

// The process's peak resident set size (VmHWM of /proc/self/status) in MiB; 0 if unknown.
double PeakRssMiB();
// Resets the kernel's peak RSS (VmHWM) to the current RSS (/proc/self/clear_refs "5",
// Linux >= 4.0), so that a later PeakRssMiB() sees only what comes after. False when the
// kernel refuses it.
bool ResetPeakRss();

// The CPU's model name (/proc/cpuinfo), "" if unknown.
std::string CpuName();

// What else ran on the machine: /proc/loadavg's 1/5/15-minute figures ("" if unknown).
std::string LoadAverage();

// `n` token ids in [lo, hi), the i-th from the i-th draw of a mt19937_64 seeded with
// `seed` (as lo + draw % (hi - lo)): the same ids for the same seed on every machine.
// REQUIRES: lo < hi.
std::vector<int32_t> RandomTokens(int n, uint64_t seed, int32_t lo, int32_t hi);

}  // namespace attic::bench
