// Statistics the benchmark programs report over their samples (repetitions, requests,
// turns). One definition each, so that "p50" or "median" means the same thing in every
// program's table and JSON. Pure functions; thread-safe.
#pragma once

#include <utility>
#include <vector>

namespace attic::bench {

// The p-th percentile of `v` by the nearest-rank method: the smallest sample x such that
// at least p% of the samples are <= x, so always an observed value (the load generators'
// TTFT / TPOT p50, p90, p99). p <= 0 gives the minimum, p >= 100 the maximum; 0 when `v`
// is empty. Note that Percentile(v, 50) of an even count is the lower middle sample, not
// Median(v).
double Percentile(std::vector<double> v, double p);

// The median: the middle sample, or the mean of the two middle samples of an even count
// (the throughput programs' "median of --reps"); 0 when `v` is empty.
double Median(std::vector<double> v);

// The arithmetic mean; 0 when `v` is empty.
double Mean(const std::vector<double>& v);

// Total length of the union of the intervals [start, end): time during which at least
// one of them was open (overlaps counted once). Intervals with end <= start add nothing.
double UnionLength(std::vector<std::pair<double, double>> intervals);

}  // namespace attic::bench
