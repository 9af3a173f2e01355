// Private to pq: the AVX2 forms of PqCodebook::TopKByCodes' loops for m = 2
// (codebook_avx2.cc). Callable only where backend::ActiveIsa() is kAvx2 or better.
#pragma once

#include <cstdint>

namespace attic::pq::internal {

// ts[c1 * kc + c0] = t0[c0] + t1[c1], a NaN sum as -infinity (RankKey). kc % 8 == 0.
void TupleScoresM2Avx2(const float* t0, const float* t1, int kc, float* ts);

// cls[i] = 1 if ts[i] > t, 2 if ts[i] == t, else 0, for i < n (n % 8 == 0).
void ClassifyAvx2(const float* ts, int n, float t, int32_t* cls);

// TupleThreshold's bucket pass (n % 8 == 0): bucket[i] = the bucket of ts[i] in
// n_buckets equal ranges from lo, scale buckets per unit (clamped into [0, n_buckets);
// -infinity to 0), and hist[bucket[i]] += count[i]. Monotone in ts[i], as the scalar
// pass; the buckets may differ from the scalar pass's in rounding, which changes nothing
// but how many tuples the final selection sees.
void BucketTuplesAvx2(const float* ts, const int32_t* count, int n, float lo, float scale, int n_buckets,
                      uint16_t* bucket, int64_t* hist);

// The non-empty tuples i < n (n % 16 == 0) of bucket b, ascending: keys[j] = ts[i],
// weights[j] = count[i]; returns how many (keys and weights have room for n).
int CollectBucketAvx2(const uint16_t* bucket, const int32_t* count, const float* ts, int n, int b, float* keys,
                      int32_t* weights);

// TopKByCodes' last pass for m = 2: appends offset + i to out for every key i < n whose
// tuple (codes[2i] | codes[2i + 1] << bits) has class 1, and for the lowest `ties` keys
// of class 2, in ascending order; returns how many. out must have room for the keys
// taken plus 8 (whole vectors are stored).
int64_t TakeM2Avx2(const uint8_t* codes, int64_t n, int bits, const int32_t* cls, int64_t ties, int32_t offset,
                   int32_t* out);

}  // namespace attic::pq::internal
