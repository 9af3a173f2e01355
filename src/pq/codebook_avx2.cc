// AVX2 forms of TopKByCodes' hot loops for m = 2 (compiled with -mavx2; the caller
// checks backend::ActiveIsa()). No floating-point multiply is involved, so nothing here
// can be contracted into an FMA: every value is the one the scalar loops compute, and the
// keys taken are the same.
#include <immintrin.h>

#include <array>
#include <cstdint>
#include <limits>

#include "pq/codebook_internal.h"

namespace attic::pq::internal {

namespace {

// kCompress[mask]: the lanes set in an 8-bit mask, lowest first, as 8 byte indices
// (the rest 0): a permutation that packs the chosen lanes to the front.
constexpr std::array<uint64_t, 256> MakeCompress() {
  std::array<uint64_t, 256> lut{};
  for (int mask = 0; mask < 256; ++mask) {
    uint64_t v = 0;
    int j = 0;
    for (int lane = 0; lane < 8; ++lane) {
      if (mask & (1 << lane)) v |= static_cast<uint64_t>(lane) << (8 * j++);
    }
    lut[mask] = v;
  }
  return lut;
}
constexpr std::array<uint64_t, 256> kCompress = MakeCompress();

}  // namespace

void TupleScoresM2Avx2(const float* t0, const float* t1, int kc, float* ts) {
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int c1 = 0; c1 < kc; ++c1) {
    const __m256 b = _mm256_set1_ps(t1[c1]);
    float* row = ts + static_cast<int64_t>(c1) * kc;
    for (int c0 = 0; c0 < kc; c0 += 8) {
      const __m256 x = _mm256_add_ps(_mm256_loadu_ps(t0 + c0), b);
      _mm256_storeu_ps(row + c0, _mm256_blendv_ps(x, neg_inf, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));  // RankKey
    }
  }
}

void ClassifyAvx2(const float* ts, int n, float t, int32_t* cls) {
  const __m256 tv = _mm256_set1_ps(t);
  const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2);
  for (int i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(ts + i);
    const __m256i gt = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(v, tv, _CMP_GT_OQ)), one);
    const __m256i eq = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(v, tv, _CMP_EQ_OQ)), two);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cls + i), _mm256_or_si256(gt, eq));
  }
}

void BucketTuplesAvx2(const float* ts, const int32_t* count, int n, float lo, float scale, int n_buckets,
                      uint16_t* bucket, int64_t* hist) {
  const __m256 vlo = _mm256_set1_ps(lo), vscale = _mm256_set1_ps(scale);
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(static_cast<float>(n_buckets - 1));
  alignas(32) int32_t b[8];
  for (int i = 0; i < n; i += 8) {
    // max(x, 0) also sends -infinity (and a NaN, which RankKey leaves none of) to 0.
    const __m256 x = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(ts + i), vlo), vscale);
    const __m256i bi = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(x, zero), top));
    _mm256_store_si256(reinterpret_cast<__m256i*>(b), bi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(bucket + i),
                     _mm_packus_epi32(_mm256_castsi256_si128(bi), _mm256_extracti128_si256(bi, 1)));
    for (int j = 0; j < 8; ++j) hist[b[j]] += count[i + j];
  }
}

int CollectBucketAvx2(const uint16_t* bucket, const int32_t* count, const float* ts, int n, int b, float* keys,
                      int32_t* weights) {
  const __m256i vb = _mm256_set1_epi16(static_cast<int16_t>(b));
  int found = 0;
  for (int i = 0; i < n; i += 16) {
    const __m256i eq = _mm256_cmpeq_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bucket + i)), vb);
    unsigned mask = static_cast<unsigned>(_mm256_movemask_epi8(eq)) & 0x55555555u;  // one bit per uint16 lane
    for (; mask != 0; mask &= mask - 1) {
      const int tup = i + __builtin_ctz(mask) / 2;
      if (count[tup] == 0) continue;
      keys[found] = ts[tup];
      weights[found++] = count[tup];
    }
  }
  return found;
}

int64_t TakeM2Avx2(const uint8_t* codes, int64_t n, int bits, const int32_t* cls, int64_t ties, int32_t offset,
                   int32_t* out) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i low = _mm256_set1_epi32(0xFF);
  const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2);
  const __m128i shift = _mm_cvtsi32_si128(bits);
  int64_t j = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    // Eight keys' code pairs: lane = c0 | c1 << 8, tuple = c0 | c1 << bits.
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 2 * i)));
    const __m256i tuple = _mm256_or_si256(_mm256_and_si256(w, low), _mm256_sll_epi32(_mm256_srli_epi32(w, 8), shift));
    const __m256i c = _mm256_i32gather_epi32(cls, tuple, 4);
    int take = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, one)));
    int tie = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, two)));
    for (; tie != 0 && ties > 0; --ties) {  // the lowest keys first, while ties remain
      take |= tie & -tie;
      tie &= tie - 1;
    }
    const __m256i ids = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(offset + i)), iota);
    const __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(kCompress[take])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), _mm256_permutevar8x32_epi32(ids, perm));
    j += __builtin_popcount(static_cast<unsigned>(take));
  }
  for (; i < n; ++i) {
    const int c = cls[codes[2 * i] | (codes[2 * i + 1] << bits)];
    const int64_t tie = (c >> 1) & (ties > 0);
    out[j] = static_cast<int32_t>(offset + i);
    j += (c & 1) | tie;
    ties -= tie;
  }
  return j;
}

}  // namespace attic::pq::internal
