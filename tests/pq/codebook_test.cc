// PqCodebook, TopK, TopKByCodes and AdaptiveIterations against references written here: brute-force
// nearest centroids and inner products in double, a full sort, the formula by hand.
#include "attic/pq/codebook.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace attic::pq {
namespace {

std::vector<float> RandomRows(int64_t n, int64_t stride, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n * stride);
  for (float& x : v) x = dist(rng);
  return v;
}

PqCodebook MustTrain(const std::vector<float>& keys, int64_t n, int head_dim, int64_t stride, const PqOptions& o,
                     TrainStats* stats = nullptr) {
  auto cb = PqCodebook::Train(keys.data(), n, head_dim, stride, o, stats);
  EXPECT_TRUE(cb.ok()) << cb.status().ToString();
  return std::move(cb).value();
}

// Nearest centroid of key sub-vector s in double; ties to the lower index.
int RefNearest(const PqCodebook& cb, const float* key, int s) {
  int best = -1;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < cb.n_centroids(); ++c) {
    const float* cen = cb.centroid(s, c);
    double d = 0;
    for (int j = 0; j < cb.sub_dim(); ++j) {
      const double diff = static_cast<double>(key[s * cb.sub_dim() + j]) - cen[j];
      d += diff * diff;
    }
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

// q . (reconstructed key) in double.
double RefScore(const PqCodebook& cb, const float* q, const uint8_t* code) {
  double sum = 0;
  for (int s = 0; s < cb.m(); ++s) {
    const float* cen = cb.centroid(s, code[s]);
    for (int j = 0; j < cb.sub_dim(); ++j) sum += static_cast<double>(q[s * cb.sub_dim() + j]) * cen[j];
  }
  return sum;
}

// Sum of |q_j c_j| over the code's centroids: what a float score's rounding scales with.
double AbsScore(const PqCodebook& cb, const float* q, const uint8_t* code) {
  double sum = 0;
  for (int s = 0; s < cb.m(); ++s) {
    const float* cen = cb.centroid(s, code[s]);
    for (int j = 0; j < cb.sub_dim(); ++j) sum += std::fabs(static_cast<double>(q[s * cb.sub_dim() + j]) * cen[j]);
  }
  return sum;
}

// gamma(n) = n u / (1 - n u), u = 2^-24: a float sum of n products (in any order, with or
// without FMA) is within gamma(n) * sum |terms| of the exact sum (Higham, Thm 3.1). A PQ
// score is a table entry per sub-space (a sub_dim-term dot, added into the zeroed table)
// summed over m sub-spaces: n = sub_dim + m covers it; each further query added into
// the same table adds one rounding.
double Gamma(int n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1 - n * u);
}

// Mean squared reconstruction error of keys under cb (double).
double ReconstructionError(const PqCodebook& cb, const std::vector<float>& keys, int64_t n) {
  std::vector<uint8_t> codes(n * cb.m());
  cb.Encode(keys.data(), n, cb.head_dim(), codes.data());
  double err = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int s = 0; s < cb.m(); ++s) {
      const float* cen = cb.centroid(s, codes[i * cb.m() + s]);
      for (int j = 0; j < cb.sub_dim(); ++j) {
        const double d = static_cast<double>(keys[i * cb.head_dim() + s * cb.sub_dim() + j]) - cen[j];
        err += d * d;
      }
    }
  }
  return err / n;
}

TEST(PqOptionsTest, ValidateRejectsBadOptions) {
  PqOptions o;
  EXPECT_TRUE(o.Validate(64).ok());
  EXPECT_TRUE(o.Validate(2).ok());
  EXPECT_FALSE(o.Validate(63).ok());  // m = 2 does not divide it
  EXPECT_FALSE(o.Validate(0).ok());
  auto bad = [](auto change) {
    PqOptions b;
    change(b);
    return b.Validate(64);
  };
  EXPECT_EQ(bad([](PqOptions& b) { b.m = 0; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](PqOptions& b) { b.m = 3; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](PqOptions& b) { b.m = 128; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](PqOptions& b) { b.bits = 0; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](PqOptions& b) { b.bits = 9; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](PqOptions& b) { b.iterations = 0; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](PqOptions& b) { b.max_points_per_centroid = 0; }).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(bad([](PqOptions& b) { b.m = 64; b.bits = 8; b.iterations = 1; }).ok());
}

TEST(PqCodebookTest, TrainRejectsBadArguments) {
  std::vector<float> keys = RandomRows(100, 16, 1);
  PqOptions o;
  EXPECT_EQ(PqCodebook::Train(keys.data(), 0, 16, 16, o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PqCodebook::Train(keys.data(), 10, 16, 8, o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PqCodebook::Train(keys.data(), 10, 15, 16, o).status().code(), StatusCode::kInvalidArgument);
  o.bits = 9;
  EXPECT_EQ(PqCodebook::Train(keys.data(), 10, 16, 16, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(PqCodebookTest, EncodeIsTheNearestCentroid) {
  struct Case {
    int head_dim, m, bits;
  };
  for (const Case& c : {Case{64, 2, 6}, Case{64, 4, 8}, Case{32, 1, 1}, Case{16, 16, 3}, Case{48, 3, 5}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << c.head_dim << " m " << c.m << " bits " << c.bits);
    const int64_t stride = c.head_dim * 3;  // one KV head's keys inside wider rows
    const int64_t n = 1500;
    std::vector<float> rows = RandomRows(n, stride, 7);
    PqOptions o;
    o.m = c.m;
    o.bits = c.bits;
    o.iterations = 4;
    PqCodebook cb = MustTrain(rows, n, c.head_dim, stride, o);
    EXPECT_EQ(cb.m(), c.m);
    EXPECT_EQ(cb.sub_dim(), c.head_dim / c.m);
    EXPECT_EQ(cb.n_centroids(), 1 << c.bits);
    // Fresh keys (not the training set), read at an offset inside the rows.
    const int64_t n_enc = 700;
    std::vector<float> fresh = RandomRows(n_enc, stride, 8, 1.3f);
    const float* base = fresh.data() + c.head_dim;  // the second KV head's columns
    std::vector<uint8_t> codes(n_enc * c.m);
    cb.Encode(base, n_enc, stride, codes.data());
    int mismatches = 0;
    for (int64_t i = 0; i < n_enc; ++i) {
      for (int s = 0; s < c.m; ++s) mismatches += codes[i * c.m + s] != RefNearest(cb, base + i * stride, s);
    }
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(PqCodebookTest, EncodeTiesGoToTheLowerCentroid) {
  // With no more keys than centroids the centroids are the keys themselves: small
  // integers, so every squared distance is exact in float and equal ones are equal.
  const int head_dim = 4, m = 2;  // sub_dim 2
  PqOptions o;
  o.m = m;
  o.bits = 4;  // 16 centroids
  {
    // A hand-made grid: sub-space 0's centroids (0,0) (2,0) (0,2) (2,2), then repeats.
    std::vector<float> keys = {0, 0, 5, 5,  //
                               2, 0, 5, 5,  //
                               0, 2, 5, 5,  //
                               2, 2, 5, 5};
    PqCodebook cb = MustTrain(keys, 4, head_dim, head_dim, o);
    for (int c = 0; c < 16; ++c) {  // centroid c repeats key c % 4
      EXPECT_EQ(cb.centroid(0, c)[0], keys[(c % 4) * 4]);
      EXPECT_EQ(cb.centroid(0, c)[1], keys[(c % 4) * 4 + 1]);
    }
    std::vector<float> probe = {1, 0, 5, 5,   // (0,0) and (2,0) tie -> 0
                                1, 1, 5, 5,   // all four tie -> 0
                                2, 1, 5, 5,   // (2,0) and (2,2) tie -> 1
                                1, 2, 5, 5,   // (0,2) and (2,2) tie -> 2
                                2, 2, 5, 5};  // exactly centroid 3 (and 7, 11, 15) -> 3
    std::vector<uint8_t> codes(5 * m);
    cb.Encode(probe.data(), 5, head_dim, codes.data());
    EXPECT_EQ(codes[0], 0);
    EXPECT_EQ(codes[2], 0);
    EXPECT_EQ(codes[4], 1);
    EXPECT_EQ(codes[6], 2);
    EXPECT_EQ(codes[8], 3);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(codes[i * m + 1], 0);  // sub-space 1: every centroid (5,5)
  }
  {
    // Random integer grids: many exact ties, checked against the double reference.
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> coord(-3, 3);
    std::vector<float> keys(16 * head_dim);
    for (float& x : keys) x = static_cast<float>(coord(rng));
    PqCodebook cb = MustTrain(keys, 16, head_dim, head_dim, o);
    const int64_t n = 2000;
    std::vector<float> probe(n * head_dim);
    for (float& x : probe) x = static_cast<float>(coord(rng));
    std::vector<uint8_t> codes(n * m);
    cb.Encode(probe.data(), n, head_dim, codes.data());
    for (int64_t i = 0; i < n; ++i) {
      for (int s = 0; s < m; ++s) ASSERT_EQ(codes[i * m + s], RefNearest(cb, probe.data() + i * head_dim, s)) << i;
    }
  }
}

TEST(PqCodebookTest, ScoreIsTheInnerProductWithTheReconstructedKey) {
  for (int m : {1, 2, 4, 8}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    const int head_dim = 64;
    const int64_t n = 3001;  // not a multiple of the unrolled loop
    std::vector<float> keys = RandomRows(n, head_dim, 11);
    PqOptions o;
    o.m = m;
    o.iterations = 3;
    PqCodebook cb = MustTrain(keys, n, head_dim, head_dim, o);
    std::vector<uint8_t> codes(n * m);
    cb.Encode(keys.data(), n, head_dim, codes.data());
    std::vector<float> q = RandomRows(1, head_dim, 12);
    std::vector<float> table(m * cb.n_centroids(), 0.0f);
    cb.AddQueryTable(q.data(), 1.0f, table.data());
    std::vector<float> scores(n);
    cb.Score(table.data(), codes.data(), n, scores.data());
    for (int64_t i = 0; i < n; ++i) {
      const double ref = RefScore(cb, q.data(), codes.data() + i * m);
      ASSERT_NEAR(scores[i], ref, Gamma(cb.sub_dim() + m) * AbsScore(cb, q.data(), codes.data() + i * m)) << i;
    }
  }
}

TEST(PqCodebookTest, QueryTablesAddUp) {
  const int head_dim = 32;
  const int64_t n = 1000;
  std::vector<float> keys = RandomRows(n, head_dim, 21);
  PqOptions o;
  o.iterations = 3;
  PqCodebook cb = MustTrain(keys, n, head_dim, head_dim, o);
  std::vector<uint8_t> codes(n * o.m);
  cb.Encode(keys.data(), n, head_dim, codes.data());
  std::vector<float> q1 = RandomRows(1, head_dim, 22), q2 = RandomRows(1, head_dim, 23);
  std::vector<float> sum(head_dim);
  for (int j = 0; j < head_dim; ++j) sum[j] = q1[j] + q2[j];
  const int table_size = o.m * cb.n_centroids();
  std::vector<float> t12(table_size, 0.0f), tsum(table_size, 0.0f), tw(table_size, 0.0f);
  cb.AddQueryTable(q1.data(), 1.0f, t12.data());
  cb.AddQueryTable(q2.data(), 1.0f, t12.data());
  cb.AddQueryTable(sum.data(), 1.0f, tsum.data());
  cb.AddQueryTable(q1.data(), 0.5f, tw.data());  // the weight scales the entries
  std::vector<float> s12(n), ssum(n), sw(n), s1(n);
  cb.Score(t12.data(), codes.data(), n, s12.data());
  cb.Score(tsum.data(), codes.data(), n, ssum.data());
  cb.Score(tw.data(), codes.data(), n, sw.data());
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* code = codes.data() + i * o.m;
    // Both are within gamma(sub_dim + m + 1) * (|q1 c| + |q2 c|) of the exact (q1 + q2) . c
    // (the one more rounding: the second table added in, or q1 + q2 rounded to float).
    const double a12 = AbsScore(cb, q1.data(), code) + AbsScore(cb, q2.data(), code);
    ASSERT_NEAR(s12[i], ssum[i], 2 * Gamma(cb.sub_dim() + o.m + 1) * a12) << i;
    // x 0.5 is exact: the weighted table's score is half the unweighted one's rounding.
    ASSERT_NEAR(sw[i], 0.5 * RefScore(cb, q1.data(), code), 0.5 * Gamma(cb.sub_dim() + o.m) * AbsScore(cb, q1.data(), code))
        << i;
  }
}

TEST(PqCodebookTest, FewerKeysThanCentroidsScoreExactly) {
  const int head_dim = 16;
  for (int64_t n : {1, 5, 64}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    std::vector<float> keys = RandomRows(n, head_dim, 31);
    PqOptions o;  // 64 centroids
    TrainStats stats;
    PqCodebook cb = MustTrain(keys, n, head_dim, head_dim, o, &stats);
    EXPECT_EQ(stats.points_used, 0);  // no k-means ran
    EXPECT_EQ(stats.seconds_per_point_iteration(), 0.0);
    std::vector<uint8_t> codes(n * o.m);
    cb.Encode(keys.data(), n, head_dim, codes.data());
    std::vector<float> q = RandomRows(1, head_dim, 32);
    std::vector<float> table(o.m * cb.n_centroids(), 0.0f);
    cb.AddQueryTable(q.data(), 1.0f, table.data());
    std::vector<float> scores(n);
    cb.Score(table.data(), codes.data(), n, scores.data());
    for (int64_t i = 0; i < n; ++i) {
      for (int s = 0; s < o.m; ++s) EXPECT_EQ(codes[i * o.m + s], i);  // each key is its own centroid
      double exact = 0;
      for (int j = 0; j < head_dim; ++j) exact += static_cast<double>(q[j]) * keys[i * head_dim + j];
      // The centroids are the keys themselves (copied exactly), so only the score's own
      // rounding remains.
      EXPECT_NEAR(scores[i], exact, Gamma(cb.sub_dim() + o.m) * AbsScore(cb, q.data(), codes.data() + i * o.m));
    }
  }
}

TEST(PqCodebookTest, TrainFindsWellSeparatedClusters) {
  // Each sub-space's sub-vectors sit around one of 4 centres (a centre per sub-space
  // coordinate pattern, 20 apart; noise 0.1): every key must get a centroid of its own
  // cluster, in every sub-space.
  const int head_dim = 16, m = 2, sub_dim = 8, n_clusters = 4;
  const int64_t n = 4096;
  std::mt19937 rng(41);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  std::uniform_int_distribution<int> pick(0, n_clusters - 1);
  std::vector<float> centres(m * n_clusters * sub_dim);
  for (int s = 0; s < m; ++s) {
    for (int c = 0; c < n_clusters; ++c) {
      for (int j = 0; j < sub_dim; ++j) centres[(s * n_clusters + c) * sub_dim + j] = (j == c ? 20.0f : 0.0f) + 3.0f * s;
    }
  }
  std::vector<float> keys(n * head_dim);
  std::vector<int> label(n * m);
  for (int64_t i = 0; i < n; ++i) {
    for (int s = 0; s < m; ++s) {
      label[i * m + s] = pick(rng);
      const float* centre = &centres[(s * n_clusters + label[i * m + s]) * sub_dim];
      for (int j = 0; j < sub_dim; ++j) keys[i * head_dim + s * sub_dim + j] = centre[j] + noise(rng);
    }
  }
  PqOptions o;
  o.m = m;
  TrainStats stats;
  PqCodebook cb = MustTrain(keys, n, head_dim, head_dim, o, &stats);
  std::vector<uint8_t> codes(n * m);
  cb.Encode(keys.data(), n, head_dim, codes.data());
  for (int64_t i = 0; i < n; ++i) {
    for (int s = 0; s < m; ++s) {
      const float* cen = cb.centroid(s, codes[i * m + s]);
      const float* centre = &centres[(s * n_clusters + label[i * m + s]) * sub_dim];
      double d = 0;
      for (int j = 0; j < sub_dim; ++j) d += (static_cast<double>(cen[j]) - centre[j]) * (cen[j] - centre[j]);
      ASSERT_LT(std::sqrt(d), 1.0) << "key " << i << " sub-space " << s;
    }
  }
  // Far below random centroids: the error of 64 random keys of the same mixture as
  // centroids is at least the noise, and the clustering's is about the noise's share left.
  const double trained = ReconstructionError(cb, keys, n);
  std::vector<float> random_rows = RandomRows(64, head_dim, 42, 10.0f);
  PqOptions few = o;
  few.bits = 6;
  PqCodebook random_cb = MustTrain(random_rows, 64, head_dim, head_dim, few);  // centroids = random keys
  const double random = ReconstructionError(random_cb, keys, n);
  EXPECT_LT(trained, 0.05 * random) << trained << " vs " << random;
  EXPECT_LT(trained, 16 * 0.01 * 2);  // about the noise variance over 16 dimensions
  // TrainStats: all 4096 keys used (< 256 * 64), 10 iterations, 2 sub-spaces.
  EXPECT_EQ(stats.points_used, n);
  EXPECT_EQ(stats.iterations, 10);
  EXPECT_EQ(stats.m, 2);
  EXPECT_GT(stats.seconds, 0.0);
  EXPECT_NEAR(stats.seconds_per_point_iteration(), stats.seconds / (n * 2.0 * 10), 1e-15);
}

TEST(PqCodebookTest, MoreIterationsReconstructBetter) {
  // Overlapping clusters (a Gaussian mixture with many centres): k-means has work to do.
  const int head_dim = 32;
  const int64_t n = 4000;
  std::vector<float> centres = RandomRows(300, head_dim, 51, 2.0f);
  std::vector<float> keys = RandomRows(n, head_dim, 52, 0.7f);
  std::mt19937 rng(53);
  std::uniform_int_distribution<int> pick(0, 299);
  for (int64_t i = 0; i < n; ++i) {
    const int c = pick(rng);
    for (int j = 0; j < head_dim; ++j) keys[i * head_dim + j] += centres[c * head_dim + j];
  }
  PqOptions o;
  o.iterations = 1;
  const double one = ReconstructionError(MustTrain(keys, n, head_dim, head_dim, o), keys, n);
  o.iterations = 10;
  const double ten = ReconstructionError(MustTrain(keys, n, head_dim, head_dim, o), keys, n);
  // The same seeded start; each Lloyd iteration (nearest centroid, then the mean) can
  // only lower the squared error over the keys trained on (all 4000 here), so nine more
  // iterations give less unless the first left no key to move, which overlapping
  // clusters rule out. No margin: the claim is the strict decrease itself.
  EXPECT_LT(ten, one) << ten << " vs " << one;
}

TEST(PqCodebookTest, TrainSubsamplesToMaxPointsPerCentroid) {
  const int head_dim = 8;
  const int64_t n = 1000;
  std::vector<float> keys = RandomRows(n, head_dim, 61);
  PqOptions o;
  o.bits = 4;
  o.max_points_per_centroid = 5;  // 80 points of the 1000
  o.iterations = 2;
  TrainStats stats;
  PqCodebook cb = MustTrain(keys, n, head_dim, head_dim, o, &stats);
  EXPECT_EQ(stats.points_used, 80);
  EXPECT_EQ(stats.iterations, 2);
  EXPECT_EQ(cb.bytes(), 2 * 2 * 16 * 4 * 4);  // two layouts of m x 16 x 4 floats
}

// TopK reference: sort every index by (score descending, index ascending), keep k,
// return ascending.
std::vector<int32_t> RefTopK(const std::vector<float>& s, int64_t k) {
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
  idx.resize(std::min<int64_t>(k, static_cast<int64_t>(s.size())));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(TopKTest, MatchesAFullSortWithTies) {
  std::mt19937 rng(71);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = std::uniform_int_distribution<int>(0, 300)(rng);
    const int levels = std::uniform_int_distribution<int>(1, 20)(rng);  // few levels: many ties
    std::uniform_int_distribution<int> level(0, levels - 1);
    std::vector<float> s(n);
    for (float& x : s) x = trial % 2 ? static_cast<float>(level(rng)) : std::normal_distribution<float>()(rng);
    for (int64_t k : {int64_t{0}, int64_t{1}, n / 3, n - 1, n, n + 5}) {
      if (k < 0) continue;
      std::vector<int32_t> got;
      TopK(s.data(), n, k, &got);
      ASSERT_EQ(got, RefTopK(s, k)) << "trial " << trial << " n " << n << " k " << k;
    }
  }
  std::vector<int32_t> got = {9, 9};
  TopK(nullptr, 0, 3, &got);
  EXPECT_TRUE(got.empty());
}

TEST(TopKTest, HandWorked) {
  std::vector<float> s = {1, 5, 3, 5, 2, 3, 3};
  std::vector<int32_t> got;
  TopK(s.data(), 7, 3, &got);
  EXPECT_EQ(got, (std::vector<int32_t>{1, 2, 3}));  // both 5s, then the first 3
  TopK(s.data(), 7, 4, &got);
  EXPECT_EQ(got, (std::vector<int32_t>{1, 2, 3, 5}));
}

TEST(TopKTest, NanRanksLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> s = {nan, 1, nan, -2, 0};
  std::vector<int32_t> got;
  TopK(s.data(), 5, 3, &got);
  EXPECT_EQ(got, (std::vector<int32_t>{1, 3, 4}));
}

// TopKByCodes against the reference: each key's score summed here from the tables (in
// sub-space order, as Score documents), the max over the tables, then a full sort.
TEST(TopKByCodesTest, MatchesAFullSortOfTheKeysScores) {
  std::mt19937 rng(91);
  struct Shape {
    int m, bits, head_dim;
  };
  // m * bits <= 16 tabulates the code tuples (when n is large enough); 4 x 6 = 24 scores
  // every key.
  for (const Shape& sh : {Shape{2, 6, 16}, Shape{1, 8, 8}, Shape{2, 8, 16}, Shape{4, 4, 16}, Shape{4, 6, 16},
                          Shape{2, 3, 4}}) {
    PqOptions o;
    o.m = sh.m;
    o.bits = sh.bits;
    o.iterations = 1;
    const PqCodebook cb = MustTrain(RandomRows(64, sh.head_dim, 5), 64, sh.head_dim, sh.head_dim, o);
    const int kc = 1 << sh.bits;
    for (int trial = 0; trial < 40; ++trial) {
      const int64_t n = std::uniform_int_distribution<int>(1, 5000)(rng);
      const int n_tables = 1 + trial % 3;
      const bool ties = trial % 2 == 0;  // small integer table entries: many equal scores
      std::vector<std::vector<float>> tables(n_tables, std::vector<float>(static_cast<size_t>(sh.m) * kc));
      for (auto& t : tables)
        for (float& x : t)
          x = ties ? static_cast<float>(std::uniform_int_distribution<int>(-3, 3)(rng)) : std::normal_distribution<float>()(rng);
      std::vector<const float*> ptrs;
      for (auto& t : tables) ptrs.push_back(t.data());
      // Skewed codes (a few centroids take most keys), as real keys cluster.
      std::vector<uint8_t> codes(static_cast<size_t>(n) * sh.m);
      for (uint8_t& c : codes) {
        const int r = std::uniform_int_distribution<int>(0, kc - 1)(rng);
        c = static_cast<uint8_t>(rng() % 4 == 0 ? r : r % std::max(1, kc / 8));
      }
      std::vector<float> ref_scores(n);
      for (int64_t i = 0; i < n; ++i) {
        float best = 0;
        for (int t = 0; t < n_tables; ++t) {
          float sum = tables[t][codes[i * sh.m]];
          for (int s = 1; s < sh.m; ++s) sum += tables[t][s * kc + codes[i * sh.m + s]];
          best = t == 0 ? sum : std::max(best, sum);
        }
        ref_scores[i] = best;
      }
      for (int64_t k : {int64_t{1}, n / 5, n / 2, n - 1, n, n + 3}) {
        if (k < 1) continue;
        std::vector<int32_t> got = {-7};  // appended after what is there
        cb.TopKByCodes(ptrs.data(), n_tables, codes.data(), n, k, 100, &got);
        std::vector<int32_t> want = {-7};
        for (int32_t i : RefTopK(ref_scores, k)) want.push_back(100 + i);
        ASSERT_EQ(got, want) << "m " << sh.m << " bits " << sh.bits << " trial " << trial << " n " << n << " k " << k;
      }
    }
  }
}

TEST(TopKByCodesTest, NanScoresRankLast) {
  PqOptions o;
  o.m = 2;
  o.bits = 2;
  o.iterations = 1;
  const PqCodebook cb = MustTrain(RandomRows(16, 4, 6), 16, 4, 4, o);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Sub-space 0's code 1 is NaN: every key with it scores NaN.
  const std::vector<float> table = {0, nan, 2, 3, /* sub-space 1 */ 0, 0, 1, 0};
  const float* ptr = table.data();
  // Keys: (c0, c1) pairs; scores 0+0, NaN, 2+1, 3+0, NaN, 0+1 (many keys so the tuples
  // are tabulated: 16 tuples <= 4n).
  std::vector<uint8_t> codes;
  const std::vector<std::pair<int, int>> keys = {{0, 0}, {1, 0}, {2, 2}, {3, 1}, {1, 3}, {0, 2}};
  for (int rep = 0; rep < 3; ++rep)
    for (auto [a, b] : keys) codes.push_back(static_cast<uint8_t>(a)), codes.push_back(static_cast<uint8_t>(b));
  std::vector<int32_t> got;
  cb.TopKByCodes(&ptr, 1, codes.data(), 18, 6, 0, &got);
  EXPECT_EQ(got, (std::vector<int32_t>{2, 3, 8, 9, 14, 15}));  // every 3 and 2+1
  got.clear();
  cb.TopKByCodes(&ptr, 1, codes.data(), 18, 17, 0, &got);  // all but one NaN: the last NaN key goes
  std::vector<int32_t> want(18);
  std::iota(want.begin(), want.end(), 0);
  want.erase(want.begin() + 16);  // keys 1, 4, 7, 10, 13, 16 are NaN; 16 is the last
  EXPECT_EQ(got, want);
}

TEST(AdaptiveIterationsTest, Arithmetic) {
  PqOptions o;  // m 2, bits 6, max_points_per_centroid 256: at most 16384 points
  // 1000 points x 2 sub-spaces x 2 heads x 1e-6 s = 4 ms an iteration.
  EXPECT_EQ(AdaptiveIterations(0.1001, 1e-6, 1000, 2, o), 25);        // floor(25.025)
  EXPECT_EQ(AdaptiveIterations(0.099, 1e-6, 1000, 2, o), 24);          // floor(24.75)
  EXPECT_EQ(AdaptiveIterations(0.0481, 1e-6, 1000, 2, o), 12);         // floor(12.025)
  EXPECT_EQ(AdaptiveIterations(1.0, 1e-6, 1000, 2, o), 25);            // 250, clamped
  EXPECT_EQ(AdaptiveIterations(1.0, 1e-6, 1000, 2, o, 1, 1000), 250);
  // 1e6 points are subsampled to 16384: 65.536 ms an iteration.
  EXPECT_EQ(AdaptiveIterations(1.0, 1e-6, 1000000, 2, o), 15);
  EXPECT_EQ(AdaptiveIterations(1.0, 1e-6, 16384, 2, o), 15);
  o.max_points_per_centroid = 100;  // 6400 points: 25.6 ms
  EXPECT_EQ(AdaptiveIterations(1.0, 1e-6, 1000000, 2, o, 1, 100), 39);
  o.m = 4;  // 51.2 ms
  EXPECT_EQ(AdaptiveIterations(1.0, 1e-6, 1000000, 2, o, 1, 100), 19);
  // Clamps and degenerate inputs.
  EXPECT_EQ(AdaptiveIterations(1e-9, 1e-6, 1000, 2, o), 1);
  EXPECT_EQ(AdaptiveIterations(1e-9, 1e-6, 1000, 2, o, 3, 25), 3);
  EXPECT_EQ(AdaptiveIterations(0.0, 1e-6, 1000, 2, o), 1);
  EXPECT_EQ(AdaptiveIterations(1.0, 0.0, 1000, 2, o), 25);  // nothing measured yet
  EXPECT_EQ(AdaptiveIterations(1.0, 1e-6, 0, 2, o), 25);    // nothing to cluster
}

}  // namespace
}  // namespace attic::pq
