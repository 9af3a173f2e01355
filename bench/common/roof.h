// The machine's DRAM read roof, measured by the benchmark itself: decode is bound by the
// bytes it reads per token, so its speed means something only next to what this machine
// can read right now (this VM's 2-thread read rate has been seen anywhere from ~20 to
// ~75 GB/s between windows).
#pragma once

#include <cstdint>

namespace attic::bench {

struct ReadRoof {
  double gbs = 0;       // best of the passes, GB/s (1e9 bytes)
  int threads = 0;      // threads reading together
  uint64_t bytes = 0;   // bytes of the buffer each pass reads
  int passes = 0;
};

// Streams a `bytes` buffer (its pages touched first) with `threads` threads, each its
// own contiguous slice, `passes` times, and keeps the fastest pass: the rate a decode
// step's weight stream can reach. Allocates `bytes` for the duration of the call (run it
// after reading a benchmark's peak RSS).
ReadRoof MeasureReadRoof(int threads, uint64_t bytes = uint64_t{1} << 30, int passes = 5);

}  // namespace attic::bench
