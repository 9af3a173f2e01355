#include "bench/common/roof.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "attic/core/huge_pages.h"

namespace attic::bench {

namespace {

// Xor of n 64-bit words into 8 independent accumulators, vectorized by the compiler at
// the widest vectors the CPU has (one clone per ISA, picked at run time): bound by the
// loads, not by a dependency chain or the vector width. (A target_clones function is
// called through its resolver, never inlined; clang refuses an explicit noinline on it.)
__attribute__((target_clones("avx512f", "avx2", "default"))) uint64_t SumWords(const uint64_t* p, size_t n) {
  uint64_t a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] ^= p[i + j];
  for (; i < n; ++i) a[0] ^= p[i];
  uint64_t s = 0;
  for (uint64_t v : a) s ^= v;
  return s;
}

}  // namespace

ReadRoof MeasureReadRoof(int threads, uint64_t bytes, int passes) {
  threads = std::max(1, threads);
  const size_t words = bytes / 8, per = words / static_cast<size_t>(threads);
  // In huge pages, as the weights a decode step streams are (backend::PrepackWeights):
  // on 4 KiB pages one thread read ~25-30% slower here (21-24 against 29.6-33.0 GB/s; the
  // prefetcher restarts at every page edge), and a roof below what the GEMV reaches is no
  // roof.
  std::shared_ptr<std::byte> mapping = AllocateHugePageAligned(words * 8);
  uint64_t* const buf_data = reinterpret_cast<uint64_t*>(mapping.get());
  std::vector<double> seconds(static_cast<size_t>(passes), 0);
  std::vector<uint64_t> sink(static_cast<size_t>(threads));
  using Clock = std::chrono::steady_clock;
  Clock::time_point start;
  std::barrier sync(threads, []() noexcept {});
  auto body = [&](int t) {
    uint64_t* p = buf_data + per * static_cast<size_t>(t);
    std::memset(p, t + 1, per * 8);  // the slice's pages, touched by its reader
    for (int r = 0; r < passes; ++r) {
      sync.arrive_and_wait();
      if (t == 0) start = Clock::now();
      sync.arrive_and_wait();
      sink[static_cast<size_t>(t)] += SumWords(p, per);
      sync.arrive_and_wait();
      if (t == 0) seconds[static_cast<size_t>(r)] = std::chrono::duration<double>(Clock::now() - start).count();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  body(0);
  for (auto& th : pool) th.join();
  ReadRoof r;
  r.threads = threads;
  r.bytes = static_cast<uint64_t>(per) * 8 * static_cast<uint64_t>(threads);
  r.passes = passes;
  const double best = *std::min_element(seconds.begin(), seconds.end());
  r.gbs = best > 0 ? static_cast<double>(r.bytes) / best / 1e9 : 0;
  return r;
}

}  // namespace attic::bench
