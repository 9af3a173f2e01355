// PqCodebook: k-means by faiss (one faiss::Clustering per sub-space, on a contiguous copy
// of that sub-space's sub-vectors); encoding, query tables and scoring are plain loops
// written so that -O2 vectorizes them (see the layout note below).
//
// Centroids are kept twice:
//   centroids_    [m][2^bits][sub_dim]  what centroid(s, c) returns
//   transposed_   [m][sub_dim][2^bits]  what Encode and AddQueryTable read: the inner loop
//                                       runs over the centroids, element-wise, so it
//                                       vectorizes without reassociating a reduction;
//                                       each centroid's sum over its dimensions is still
//                                       taken in dimension order, exactly as a scalar loop.
// The loops are instantiated per 2^bits (a compile-time trip count is what -O2's cheap
// vectorizer needs).
#include "attic/pq/codebook.h"

#include <cblas.h>
#include <faiss/Clustering.h>
#include <faiss/IndexFlat.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <string>

#include "attic/backend/cpu_features.h"
#include "pq/codebook_internal.h"

namespace attic::pq {

namespace {

// Sets the calling thread's OpenMP thread count for a scope and restores it after.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) : previous_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedOmpThreads() { omp_set_num_threads(previous_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int previous_;
};

// codes[i * m + s] for keys [0, n): nearest of K centroids (squared L2, first minimum).
// ct: [m][dsub][K]. Centroids go in chunks of kChunk whose distances stay in registers
// over the whole sub-vector (8 measured fastest at -O2, against 16 and all K at once:
// about 1.8x on 32k keys, head_dim 64, m = 2, 64 centroids).
template <int K>
void EncodeImpl(const float* ct, int m, int dsub, const float* keys, int64_t n, int64_t stride, uint8_t* codes) {
  constexpr int kChunk = K < 8 ? K : 8;
  for (int64_t i = 0; i < n; ++i) {
    const float* key = keys + i * stride;
    for (int s = 0; s < m; ++s) {
      const float* x = key + s * dsub;
      const float* cs = ct + static_cast<int64_t>(s) * dsub * K;
      int best = 0;
      float best_dist = std::numeric_limits<float>::infinity();
      for (int c0 = 0; c0 < K; c0 += kChunk) {
        float dist[kChunk] = {};
        for (int d = 0; d < dsub; ++d) {
          const float xd = x[d];
          const float* row = cs + static_cast<int64_t>(d) * K + c0;
          for (int c = 0; c < kChunk; ++c) {
            const float diff = xd - row[c];
            dist[c] += diff * diff;
          }
        }
        for (int c = 0; c < kChunk; ++c) {
          if (dist[c] < best_dist) {  // strict: ties keep the lower index
            best_dist = dist[c];
            best = c0 + c;
          }
        }
      }
      codes[i * m + s] = static_cast<uint8_t>(best);
    }
  }
}

template <int K>
void QueryTableImpl(const float* ct, int m, int dsub, const float* q, float weight, float* table) {
  alignas(64) float acc[K];
  for (int s = 0; s < m; ++s) {
    const float* x = q + s * dsub;
    const float* cs = ct + static_cast<int64_t>(s) * dsub * K;
    for (int c = 0; c < K; ++c) acc[c] = 0;
    for (int d = 0; d < dsub; ++d) {
      const float xd = x[d];
      const float* row = cs + static_cast<int64_t>(d) * K;
      for (int c = 0; c < K; ++c) acc[c] += xd * row[c];
    }
    float* t = table + s * K;
    for (int c = 0; c < K; ++c) t[c] += weight * acc[c];
  }
}

// Calls fn.template operator()<K>() with K = 2^bits, bits in [1, 8].
template <typename Fn>
void DispatchK(int bits, Fn&& fn) {
  switch (bits) {
    case 1: fn.template operator()<2>(); break;
    case 2: fn.template operator()<4>(); break;
    case 3: fn.template operator()<8>(); break;
    case 4: fn.template operator()<16>(); break;
    case 5: fn.template operator()<32>(); break;
    case 6: fn.template operator()<64>(); break;
    case 7: fn.template operator()<128>(); break;
    case 8: fn.template operator()<256>(); break;
    default: ATTIC_CHECK(false);
  }
}

// NaN ranks below every number in TopK (it never wins a slot over a real score).
inline float RankKey(float x) { return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x; }

}  // namespace

Status PqOptions::Validate(int head_dim) const {
  if (head_dim < 1) return InvalidArgumentError("pq: head_dim must be >= 1, got " + std::to_string(head_dim));
  if (m < 1 || head_dim % m != 0) {
    return InvalidArgumentError("pq: m = " + std::to_string(m) + " must be >= 1 and divide head_dim = " +
                                std::to_string(head_dim));
  }
  if (bits < 1 || bits > 8) return InvalidArgumentError("pq: bits must be in [1, 8], got " + std::to_string(bits));
  if (iterations < 1) return InvalidArgumentError("pq: iterations must be >= 1, got " + std::to_string(iterations));
  if (max_points_per_centroid < 1) {
    return InvalidArgumentError("pq: max_points_per_centroid must be >= 1, got " +
                                std::to_string(max_points_per_centroid));
  }
  return OkStatus();
}

double TrainStats::seconds_per_point_iteration() const {
  const double work = static_cast<double>(points_used) * m * iterations;
  return work > 0 ? seconds / work : 0.0;
}

StatusOr<PqCodebook> PqCodebook::Train(const float* keys, int64_t n, int head_dim, int64_t stride,
                                       const PqOptions& options, TrainStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  ATTIC_RETURN_IF_ERROR(options.Validate(head_dim));
  if (n < 1) return InvalidArgumentError("pq: Train needs at least one key, got " + std::to_string(n));
  if (keys == nullptr) return InvalidArgumentError("pq: Train got no keys");
  if (stride < head_dim) {
    return InvalidArgumentError("pq: stride " + std::to_string(stride) + " < head_dim " + std::to_string(head_dim));
  }

  PqCodebook cb;
  cb.m_ = options.m;
  cb.bits_ = options.bits;
  cb.head_dim_ = head_dim;
  const int k = 1 << options.bits;
  const int dsub = head_dim / options.m;
  cb.centroids_.resize(static_cast<size_t>(options.m) * k * dsub);

  const bool run_kmeans = n > k;
  std::vector<float> sub(static_cast<size_t>(n) * dsub);  // [n][dsub], one sub-space at a time
  {
    // faiss parallelises assignment and centroid updates with OpenMP, and its distance
    // GEMM with OpenBLAS. The engine's pool owns the cores (the backend already switches
    // OpenBLAS's threads off), and this runs on the step thread while that pool is idle.
    // One thread of each, measured on a shared 2-core machine for 8192 keys x head_dim
    // 64, m = 2, 64 centroids, 10 iterations: OpenMP 1 / OpenBLAS 1 88-117 ms; 1 / 2
    // 124-143 ms; 2 / 2 0.28-1.6 s; 2 / 1 1.0-1.4 s (OpenMP's spinning threads collide
    // with whatever else holds the cores).
    ScopedOmpThreads omp_threads(kTrainThreads);
    openblas_set_num_threads(1);
    for (int s = 0; s < options.m; ++s) {
      for (int64_t i = 0; i < n; ++i) {
        const float* src = keys + i * stride + s * dsub;
        std::copy(src, src + dsub, sub.data() + i * dsub);
      }
      float* out = cb.centroids_.data() + static_cast<size_t>(s) * k * dsub;
      if (!run_kmeans) {
        // Every key its own centroid; the surplus repeat keys (never nearer than the
        // original, so never chosen over it: ties go to the lower index).
        for (int c = 0; c < k; ++c) std::copy_n(sub.data() + (c % n) * dsub, dsub, out + c * dsub);
        continue;
      }
      faiss::ClusteringParameters cp;
      cp.niter = options.iterations;
      cp.seed = static_cast<int>(options.seed);
      cp.max_points_per_centroid = options.max_points_per_centroid;
      cp.min_points_per_centroid = 1;  // faiss only uses it to print a warning
      cp.verbose = false;
      try {
        faiss::Clustering clustering(dsub, k, cp);
        faiss::IndexFlatL2 index(dsub);
        clustering.train(n, sub.data(), index);
        if (clustering.centroids.size() != static_cast<size_t>(k) * dsub) {
          return InternalError("pq: faiss returned " + std::to_string(clustering.centroids.size()) +
                               " centroid floats, expected " + std::to_string(k * dsub));
        }
        std::copy(clustering.centroids.begin(), clustering.centroids.end(), out);
      } catch (const std::exception& e) {
        return InternalError(std::string("pq: faiss k-means failed: ") + e.what());
      }
    }
  }

  cb.Transpose();

  if (stats != nullptr) {
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats->points_used =
        run_kmeans ? std::min<int64_t>(n, static_cast<int64_t>(options.max_points_per_centroid) * k) : 0;
    stats->iterations = run_kmeans ? options.iterations : 0;
    stats->m = options.m;
  }
  return cb;
}

void PqCodebook::Transpose() {
  const int k = n_centroids(), dsub = sub_dim();
  transposed_.resize(centroids_.size());
  for (int s = 0; s < m_; ++s) {
    const float* src = centroids_.data() + static_cast<size_t>(s) * k * dsub;
    float* dst = transposed_.data() + static_cast<size_t>(s) * k * dsub;
    for (int c = 0; c < k; ++c) {
      for (int d = 0; d < dsub; ++d) dst[d * k + c] = src[c * dsub + d];
    }
  }
}

StatusOr<PqCodebook> PqCodebook::FromCentroids(int m, int bits, int head_dim, std::vector<float> centroids) {
  PqOptions o;
  o.m = m;
  o.bits = bits;
  ATTIC_RETURN_IF_ERROR(o.Validate(head_dim));
  if (centroids.size() != static_cast<size_t>(head_dim) << bits)
    return InvalidArgumentError("pq: " + std::to_string(centroids.size()) + " centroid floats, expected " +
                                std::to_string(static_cast<size_t>(head_dim) << bits));
  for (float x : centroids)
    if (!std::isfinite(x)) return InvalidArgumentError("pq: a centroid is not finite");
  PqCodebook cb;
  cb.m_ = m;
  cb.bits_ = bits;
  cb.head_dim_ = head_dim;
  cb.centroids_ = std::move(centroids);
  cb.Transpose();
  return cb;
}

const float* PqCodebook::centroid(int s, int c) const {
  return centroids_.data() + (static_cast<size_t>(s) * n_centroids() + c) * sub_dim();
}

void PqCodebook::Encode(const float* keys, int64_t n, int64_t stride, uint8_t* codes) const {
  DispatchK(bits_, [&]<int K>() { EncodeImpl<K>(transposed_.data(), m_, sub_dim(), keys, n, stride, codes); });
}

void PqCodebook::AddQueryTable(const float* q, float weight, float* table) const {
  DispatchK(bits_, [&]<int K>() { QueryTableImpl<K>(transposed_.data(), m_, sub_dim(), q, weight, table); });
}

void PqCodebook::Score(const float* table, const uint8_t* codes, int64_t n, float* scores) const {
  const int k = n_centroids();
  if (m_ == 2) {
    // The hot case: two look-ups per key, every coded slot of every KV head of every
    // layer at every decode step.
    const float* t0 = table;
    const float* t1 = table + k;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      const uint8_t* c = codes + 2 * i;
      scores[i] = t0[c[0]] + t1[c[1]];
      scores[i + 1] = t0[c[2]] + t1[c[3]];
      scores[i + 2] = t0[c[4]] + t1[c[5]];
      scores[i + 3] = t0[c[6]] + t1[c[7]];
    }
    for (; i < n; ++i) scores[i] = t0[codes[2 * i]] + t1[codes[2 * i + 1]];
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* c = codes + i * m_;
    float sum = table[c[0]];
    for (int s = 1; s < m_; ++s) sum += table[s * k + c[s]];
    scores[i] = sum;
  }
}

namespace {

// The largest t among keys[0, n) (each counted weights[i] times) such that at least k
// of the counted keys are >= t, and how many are > t: a quickselect weighted by the
// counts. REQUIRES: 1 <= k <= the sum of the weights.
void WeightedKth(std::vector<float>& keys, std::vector<int32_t>& weights, int64_t k, float* t, int64_t* n_above) {
  size_t lo = 0, hi = keys.size();
  int64_t above = 0;  // counted keys known to be > every key in [lo, hi)
  while (true) {
    const float p = keys[lo + (hi - lo) / 2];
    // Three-way partition of [lo, hi): > p first, then == p, then < p.
    size_t g = lo, e = lo, l = hi;
    while (e < l) {
      if (keys[e] > p) {
        std::swap(keys[e], keys[g]);
        std::swap(weights[e], weights[g]);
        ++g, ++e;
      } else if (keys[e] < p) {
        --l;
        std::swap(keys[e], keys[l]);
        std::swap(weights[e], weights[l]);
      } else {
        ++e;
      }
    }
    int64_t w_greater = 0, w_equal = 0;
    for (size_t i = lo; i < g; ++i) w_greater += weights[i];
    for (size_t i = g; i < e; ++i) w_equal += weights[i];
    if (k <= w_greater) {
      hi = g;
    } else if (k <= w_greater + w_equal) {
      *t = p;
      *n_above = above + w_greater;
      return;
    } else {
      k -= w_greater + w_equal;
      above += w_greater + w_equal;
      lo = e;
    }
  }
}

// A key's tuple index: codes c_0 .. c_{m-1} as digits of base 2^bits, c_0 lowest.
inline int TupleOf(const uint8_t* c, int m, int bits) {
  int tup = 0;
  for (int s = 0; s < m; ++s) tup |= c[s] << (s * bits);
  return tup;
}

// WeightedKth over the tuples: the largest t such that at least k of the keys (tuple
// tup counted count[tup] times, scored score[tup]) score >= t, and how many score > t.
// [lo, hi]: a range holding every finite score of a non-empty tuple. REQUIRES: 1 <= k <=
// the sum of the counts; scores are never NaN (RankKey).
//
// The tuples' scores are first cut into kBuckets equal ranges of [lo, hi] (a monotone
// map, so equal scores share a bucket and bucket order is score order); one pass counts
// the keys per bucket, a walk from the top finds the bucket holding the k-th best key,
// and only that bucket's tuples (a handful) go through WeightedKth, whose three-way
// partitions branch unpredictably on every element they move. Without a finite range
// (one distinct score, or infinities) every non-empty tuple goes to WeightedKth.
// avx2: the passes of codebook_avx2.cc (REQUIRES: n_tuples % 16 == 0).
void TupleThreshold(const float* score, const int32_t* count, int n_tuples, int64_t k, float lo, float hi, bool avx2,
                    float* t, int64_t* n_above) {
  constexpr int kBuckets = 1024;
  thread_local std::vector<float> keys;
  thread_local std::vector<int32_t> weights;
  keys.clear();
  weights.clear();
  const double range = static_cast<double>(hi) - lo;
  if (!(range > 0) || !std::isfinite(range)) {
    for (int tup = 0; tup < n_tuples; ++tup) {
      if (count[tup] == 0) continue;
      keys.push_back(score[tup]);
      weights.push_back(count[tup]);
    }
    WeightedKth(keys, weights, k, t, n_above);
    return;
  }
  const float scale = static_cast<float>((kBuckets - 0.5) / range);
  thread_local std::vector<uint16_t> bucket;
  thread_local std::vector<int64_t> hist;
  bucket.resize(n_tuples);
  hist.assign(kBuckets, 0);
  if (avx2) {
    internal::BucketTuplesAvx2(score, count, n_tuples, lo, scale, kBuckets, bucket.data(), hist.data());
  } else {
    for (int tup = 0; tup < n_tuples; ++tup) {
      // -infinity (a NaN score) fails x > 0: bucket 0, below every finite score in it.
      const float x = (score[tup] - lo) * scale;
      const int b = x > 0 ? (x < kBuckets - 1 ? static_cast<int>(x) : kBuckets - 1) : 0;
      bucket[tup] = static_cast<uint16_t>(b);
      hist[b] += count[tup];
    }
  }
  int64_t above = 0;
  int b = kBuckets - 1;
  while (above + hist[b] < k) above += hist[b--];
  if (avx2) {
    keys.resize(n_tuples);
    weights.resize(n_tuples);
    const int found = internal::CollectBucketAvx2(bucket.data(), count, score, n_tuples, b, keys.data(), weights.data());
    keys.resize(found);
    weights.resize(found);
  } else {
    for (int tup = 0; tup < n_tuples; ++tup) {
      if (bucket[tup] != b || count[tup] == 0) continue;
      keys.push_back(score[tup]);
      weights.push_back(count[tup]);
    }
  }
  WeightedKth(keys, weights, k - above, t, n_above);
  *n_above += above;
}

}  // namespace

void PqCodebook::CountTuples(const uint8_t* codes, int64_t n, int32_t delta, int32_t* counts) const {
  ATTIC_CHECK(n_tuples() > 0);
  if (m_ == 2) {
    for (int64_t i = 0; i < n; ++i) counts[codes[2 * i] | (codes[2 * i + 1] << bits_)] += delta;
  } else {
    for (int64_t i = 0; i < n; ++i) counts[TupleOf(codes + i * m_, m_, bits_)] += delta;
  }
}

void PqCodebook::TopKByCodes(const float* const* tables, int n_tables, const uint8_t* codes, int64_t n, int64_t k,
                             int32_t offset, std::vector<int32_t>* out, const int32_t* counts) const {
  if (n <= 0 || k <= 0) return;
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) out->push_back(static_cast<int32_t>(offset + i));
    return;
  }
  const int kc = n_centroids(), m = m_;
  const int n_tuples = static_cast<int>(this->n_tuples());  // a key's tuple: TupleOf
  if (n_tuples == 0 || n_tuples > 4 * n) {
    // Many tuples for few keys: score every key.
    thread_local std::vector<float> scores, other;
    thread_local std::vector<int32_t> picked;
    scores.resize(n);
    Score(tables[0], codes, n, scores.data());
    if (n_tables > 1) {
      other.resize(n);
      for (int t = 1; t < n_tables; ++t) {
        Score(tables[t], codes, n, other.data());
        for (int64_t i = 0; i < n; ++i) scores[i] = std::max(scores[i], other[i]);
      }
    }
    TopK(scores.data(), n, k, &picked);
    for (int32_t i : picked) out->push_back(offset + i);
    return;
  }
  thread_local std::vector<float> tuple_score;
  thread_local std::vector<int32_t> count;
  tuple_score.resize(n_tuples);
  // m = 2 with whole AVX2 vectors of centroids (bits >= 3, so the tuples are a multiple
  // of 64): the vector forms of the loops below (codebook_avx2.cc; the same values, so
  // the same keys).
  const bool avx2 = m == 2 && kc % 8 == 0 && backend::ActiveIsa() != backend::Isa::kGeneric;
  // Each tuple's score summed in Score's order (sub-space 0 first), so it equals Score's.
  if (avx2 && n_tables == 1) {
    internal::TupleScoresM2Avx2(tables[0], tables[0] + kc, kc, tuple_score.data());
  } else if (m == 2) {
    // The hot case, row by row of the second code (contiguous: vectorizes).
    float* ts = tuple_score.data();
    for (int t = 0; t < n_tables; ++t) {
      const float* t0 = tables[t];
      const float* t1 = tables[t] + kc;
      for (int c1 = 0; c1 < kc; ++c1) {
        float* row = ts + static_cast<size_t>(c1) * kc;
        const float b = t1[c1];
        if (t == 0) {
          for (int c0 = 0; c0 < kc; ++c0) row[c0] = t0[c0] + b;
        } else {
          for (int c0 = 0; c0 < kc; ++c0) row[c0] = std::max(row[c0], t0[c0] + b);
        }
      }
    }
    for (int tup = 0; tup < n_tuples; ++tup) ts[tup] = RankKey(ts[tup]);
  } else {
    for (int tup = 0; tup < n_tuples; ++tup) {
      float best = 0;
      for (int t = 0; t < n_tables; ++t) {
        float sum = tables[t][tup & (kc - 1)];
        for (int s = 1; s < m; ++s) sum += tables[t][s * kc + ((tup >> (s * bits_)) & (kc - 1))];
        best = t == 0 ? sum : std::max(best, sum);
      }
      tuple_score[tup] = RankKey(best);
    }
  }
  // The keys counted per tuple (one pass over the codes, unless the caller keeps the
  // counts), the threshold found among the tuples (TupleThreshold: O(2^(m * bits)), no
  // per-key work), then one more pass over the codes takes the keys. The tuple index is
  // recomputed from the codes in that pass rather than stored by the first: two code
  // bytes are cheaper to read again than a uint16 per key to write and read.
  if (counts == nullptr) {
    count.assign(n_tuples, 0);
    CountTuples(codes, n, 1, count.data());
    counts = count.data();
  }
  // The range of the scores: for one m = 2 table, from its two halves' extremes (a sum
  // rounds monotonically, so fl(min + min) is the least tuple score); otherwise a scan.
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  if (avx2 && n_tables == 1) {
    const float* t0 = tables[0];
    const float* t1 = tables[0] + kc;
    float lo0 = t0[0], hi0 = t0[0], lo1 = t1[0], hi1 = t1[0];
    for (int c = 1; c < kc; ++c) {
      lo0 = std::min(lo0, t0[c]), hi0 = std::max(hi0, t0[c]);
      lo1 = std::min(lo1, t1[c]), hi1 = std::max(hi1, t1[c]);
    }
    // An infinite entry leaves no finite range (TupleThreshold's fallback); a NaN entry is
    // skipped here, and its tuples' -infinity lands in the lowest bucket.
    lo = lo0 + lo1, hi = hi0 + hi1;
  } else {
    for (int tup = 0; tup < n_tuples; ++tup) {
      const float v = tuple_score[tup];
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    }
  }
  float t = 0;
  int64_t n_above = 0;
  TupleThreshold(tuple_score.data(), counts, n_tuples, k, lo, hi, avx2, &t, &n_above);
  int64_t ties = k - n_above;
  const size_t start = out->size();
  if (avx2) {
    thread_local std::vector<int32_t> cls32;
    cls32.resize(n_tuples);
    internal::ClassifyAvx2(tuple_score.data(), n_tuples, t, cls32.data());
    out->resize(start + k + 8);
    const int64_t taken = internal::TakeM2Avx2(codes, n, bits_, cls32.data(), ties, offset, out->data() + start);
    ATTIC_CHECK(taken == k);
    out->resize(start + k);
    return;
  }
  // Per tuple: 1 taken (score > t), 2 a tie (score == t: taken while ties remain, lowest
  // keys first), 0 not taken.
  thread_local std::vector<uint8_t> cls;
  cls.resize(n_tuples);
  for (int tup = 0; tup < n_tuples; ++tup) {
    const float v = tuple_score[tup];
    cls[tup] = static_cast<uint8_t>((v > t) | ((v == t) << 1));
  }
  out->resize(start + k + 1);
  int32_t* o = out->data() + start;
  int64_t j = 0;
  // Branch-free: o[j] is always written, and kept when j advances (hence k + 1).
  auto take = [&](int64_t i, int c) {
    const int64_t tie = (c >> 1) & (ties > 0);
    o[j] = static_cast<int32_t>(offset + i);
    j += (c & 1) | tie;
    ties -= tie;
  };
  if (m == 2) {
    for (int64_t i = 0; i < n; ++i) take(i, cls[codes[2 * i] | (codes[2 * i + 1] << bits_)]);
  } else {
    for (int64_t i = 0; i < n; ++i) take(i, cls[TupleOf(codes + i * m, m, bits_)]);
  }
  out->resize(start + k);
}

void TopK(const float* scores, int64_t n, int64_t k, std::vector<int32_t>* out) {
  out->clear();
  if (n <= 0 || k <= 0) return;
  if (k >= n) {
    out->resize(n);
    for (int64_t i = 0; i < n; ++i) (*out)[i] = static_cast<int32_t>(i);
    return;
  }
  // The k-th largest value t splits the scores: every score > t is taken, and the
  // lowest-indexed scores == t fill the rest. One selection and one pass, O(n); the pass
  // emits indices in ascending order, so nothing is sorted.
  thread_local std::vector<float> work;
  work.resize(n);
  for (int64_t i = 0; i < n; ++i) work[i] = RankKey(scores[i]);
  std::nth_element(work.begin(), work.begin() + (k - 1), work.end(), std::greater<float>());
  const float t = work[k - 1];
  // work[0, k) holds the k largest: its copies of t are the ties to take.
  int64_t ties = 0;
  for (int64_t i = 0; i < k; ++i) ties += work[i] == t;
  // Branch-free: out[j] is always written, and kept when j advances (hence k + 1).
  out->resize(k + 1);
  int32_t* o = out->data();
  int64_t j = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = RankKey(scores[i]);
    const int64_t tie = (v == t) & (ties > 0);
    o[j] = static_cast<int32_t>(i);
    j += (v > t) | tie;
    ties -= tie;
  }
  out->resize(k);
}

int AdaptiveIterations(double budget_seconds, double seconds_per_point_iteration, int64_t n_points, int n_kv_heads,
                       const PqOptions& options, int min_iterations, int max_iterations) {
  max_iterations = std::max(max_iterations, min_iterations);
  const int64_t k = int64_t{1} << options.bits;
  const int64_t n_used = std::min<int64_t>(n_points, static_cast<int64_t>(options.max_points_per_centroid) * k);
  const double per_iteration =
      static_cast<double>(n_used) * options.m * n_kv_heads * seconds_per_point_iteration;
  // Nothing to cluster, or no measured cost: the cap.
  if (!(per_iteration > 0) || !std::isfinite(per_iteration)) return max_iterations;
  if (!(budget_seconds > 0)) return min_iterations;
  const double fit = std::floor(budget_seconds / per_iteration);
  if (fit >= max_iterations) return max_iterations;
  if (fit <= min_iterations) return min_iterations;
  return static_cast<int>(fit);
}

}  // namespace attic::pq
