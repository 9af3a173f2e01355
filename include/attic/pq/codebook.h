// Product quantization of one KV head's keys (paper 004, PQCache, section 3.2): the
// head_dim of a key (RoPE applied, as attention sees it) is split into m sub-spaces of
// head_dim / m dimensions; each sub-space is clustered by k-means into 2^bits centroids;
// a key's code is the index of its nearest centroid in every sub-space (m bytes). A
// query's inner product with a key is then approximated by
//     sum over s of  q_s . centroid[s][code_s]
// which a table of q_s . centroid[s][c] (m x 2^bits floats per query) turns into m
// look-ups per key.
//
// K-means is faiss's (libfaiss-dev): faiss::Clustering with L2 assignment; its training
// set is subsampled to at most max_points_per_centroid * 2^bits keys. Encoding (nearest
// centroid) and scoring are Attic's own: they run on every decode step and must not go
// through a library call per key.
//
// Thread-safety: a trained PqCodebook is immutable; its const methods may be called from
// any number of threads.
#pragma once

#include <cstdint>
#include <vector>

#include "attic/core/status.h"

namespace attic::pq {

struct PqOptions {
  int m = 2;         // sub-spaces; must divide head_dim
  int bits = 6;      // 2^bits centroids per sub-space, 1..8 (a code is one byte)
  int iterations = 10;               // k-means iterations (>= 1)
  int max_points_per_centroid = 256; // training subsample, as faiss's default
  uint64_t seed = 1234;
  // InvalidArgument unless m >= 1 divides head_dim >= 1, 1 <= bits <= 8, iterations >= 1
  // and max_points_per_centroid >= 1.
  Status Validate(int head_dim) const;
};

// What one Train call cost: the adaptive planner (AdaptiveIterations) calibrates its
// seconds_per_point_iteration from the first layer it clusters.
struct TrainStats {
  double seconds = 0;          // wall time of the whole Train call (copies, k-means, all sub-spaces)
  int64_t points_used = 0;     // keys k-means ran on per sub-space: min(n, max_points_per_centroid * 2^bits); 0 if none ran
  int iterations = 0;          // k-means iterations per sub-space (0 if none ran)
  int m = 0;                   // sub-spaces clustered
  // seconds / (points_used * m * iterations): one key, one sub-space, one iteration, all
  // 2^bits centroids; 0 when no k-means ran.
  double seconds_per_point_iteration() const;
};

class PqCodebook {
 public:
  // The OpenMP threads faiss's k-means may use (measured on 2 cores: see codebook.cc).
  static constexpr int kTrainThreads = 1;

  PqCodebook() = default;

  // Trains on `n` keys of head_dim floats each, rows `stride` floats apart (a KV head's
  // keys inside [n, kv_dim] rows: stride = kv_dim). With no more keys than centroids no
  // k-means runs: centroid c of a sub-space is key c % n's sub-vector (faiss refuses
  // n < 2^bits), so every key is its own centroid and scores are exact. `stats`, when
  // not null, receives what the clustering cost (TrainStats).
  // faiss runs on kTrainThreads OpenMP threads (the calling thread's setting, restored
  // after) and single-threaded OpenBLAS (process-wide, as the backend sets it).
  // InvalidArgument for n < 1, stride < head_dim or options that fail Validate; Internal
  // if faiss fails.
  static StatusOr<PqCodebook> Train(const float* keys, int64_t n, int head_dim, int64_t stride, const PqOptions& options,
                                    TrainStats* stats = nullptr);

  // A codebook from its centroids ([m][2^bits][sub_dim] floats, the layout centroid()
  // reads; a stored index, pq_index.h): InvalidArgument for options that fail Validate,
  // a wrong count or a centroid that is not finite.
  static StatusOr<PqCodebook> FromCentroids(int m, int bits, int head_dim, std::vector<float> centroids);

  int m() const { return m_; }
  int bits() const { return bits_; }
  int n_centroids() const { return 1 << bits_; }
  int head_dim() const { return head_dim_; }
  int sub_dim() const { return head_dim_ / m_; }
  // Centroid c of sub-space s: sub_dim floats.
  const float* centroid(int s, int c) const;
  // Every centroid: [m][2^bits][sub_dim] floats.
  const std::vector<float>& centroids() const { return centroids_; }

  // codes[i * m + s] = nearest centroid (squared L2) of key i's sub-vector s; ties go to
  // the lower index.
  void Encode(const float* keys, int64_t n, int64_t stride, uint8_t* codes) const;

  // table[s * n_centroids + c] += weight * (q_s . centroid[s][c]) for one query of
  // head_dim floats. Summing the tables of a GQA group's query heads scores the sum of
  // their inner products (GqaCombine::kSum).
  void AddQueryTable(const float* q, float weight, float* table) const;

  // scores[i] = sum over s of table[s * n_centroids + codes[i * m + s]], i in [0, n).
  void Score(const float* table, const uint8_t* codes, int64_t n, float* scores) const;

  // The k best keys by PQ score, appended to `out` as offset + index, ascending: what
  // TopK gives for the scores Score computes with tables[0] (n_tables == 1), or for the
  // max over t of Score with tables[t] (a GQA group's query heads combined by max) --
  // the same keys, ties to the lower index, NaN lowest -- without scoring every key.
  // A key's score depends only on its m codes, so when there are few code tuples
  // (2^(m * bits) <= 65,536 and no more than 4n) the tuples' scores are tabulated once,
  // the keys counted per tuple, the k-th best found among the tuples (a selection
  // weighted by the counts) and the keys taken in one pass over the codes; otherwise
  // Score then TopK. O(n + 2^(m * bits)).
  // `counts`, when not null, are the keys per code tuple of codes[0, n) (n_tuples()
  // entries, as CountTuples makes them): a caller that keeps them up to date as it codes
  // keys spares TopKByCodes its own pass over the codes. Same result either way.
  void TopKByCodes(const float* const* tables, int n_tables, const uint8_t* codes, int64_t n, int64_t k, int32_t offset,
                   std::vector<int32_t>* out, const int32_t* counts = nullptr) const;

  // The code tuples TopKByCodes can tabulate: 2^(m * bits) when m * bits <= 16, else 0.
  int64_t n_tuples() const { return m_ * bits_ <= 16 ? int64_t{1} << (m_ * bits_) : 0; }
  // counts[tuple of key i] += delta for keys i in [0, n) (codes[i * m + s]; counts has
  // n_tuples() entries). REQUIRES: n_tuples() > 0.
  void CountTuples(const uint8_t* codes, int64_t n, int32_t delta, int32_t* counts) const;

  // Bytes the codebook holds (its centroids, in both layouts), for memory accounting.
  int64_t bytes() const { return static_cast<int64_t>(centroids_.size() + transposed_.size()) * 4; }

 private:
  void Transpose();  // transposed_ from centroids_

  int m_ = 0, bits_ = 0, head_dim_ = 0;
  std::vector<float> centroids_;   // [m][2^bits][sub_dim]
  std::vector<float> transposed_;  // [m][sub_dim][2^bits]: what Encode and AddQueryTable read
};

// The indices of the k largest scores among scores[0, n) (ties: the lower index),
// ascending by index. k >= n returns every index; k <= 0 none. A NaN score ranks as
// -infinity. O(n): one selection (nth_element) and one pass, no sort.
void TopK(const float* scores, int64_t n, int64_t k, std::vector<int32_t>* out);

// Section 3.3, adaptive clustering: the iteration count that keeps one layer's k-means
// (n keys, every KV head, every sub-space) within `budget_seconds`, from a measured cost
// `seconds_per_point_iteration` (one key, one sub-space, one iteration, all 2^bits
// centroids), clamped to [min_iterations, max_iterations]:
//   floor(budget_seconds / (n_used * m * n_kv_heads * seconds_per_point_iteration)),
//   n_used = min(n_points, max_points_per_centroid * 2^bits) (faiss subsamples to that).
// A cost that is not positive and finite (nothing measured yet) gives max_iterations; a
// budget that is not positive gives min_iterations. TrainStats measures the cost.
int AdaptiveIterations(double budget_seconds, double seconds_per_point_iteration, int64_t n_points, int n_kv_heads,
                       const PqOptions& options, int min_iterations = 1, int max_iterations = 25);

}  // namespace attic::pq
