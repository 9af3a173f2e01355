// PqIndex (attic/pq/pq_index.h): the serialized form of a PQ selector's index round-trips
// (centroids bit for bit, codes byte for byte), and every corrupt or truncated blob is
// an error, never a partial or altered index.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "attic/core/hash.h"
#include "attic/pq/pq_index.h"

namespace attic::pq {
namespace {

// An index of `n_layers` layers (the second unbuilt when there are several) with
// codebooks trained on random keys and random codes.
PqIndex RandomIndex(int n_layers, int n_kv, int head_dim, int m, int bits, int n_coded, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> code(0, (1 << bits) - 1);
  PqIndex idx;
  idx.m = m;
  idx.bits = bits;
  idx.head_dim = head_dim;
  idx.n_kv_heads = n_kv;
  idx.layers.resize(n_layers);
  PqOptions o;
  o.m = m;
  o.bits = bits;
  o.iterations = 2;
  for (int l = 0; l < n_layers; ++l) {
    if (l == 1) continue;  // not built
    PqIndex::Layer& layer = idx.layers[l];
    layer.built = true;
    layer.n_coded = n_coded;
    for (int h = 0; h < n_kv; ++h) {
      std::vector<float> keys(static_cast<size_t>(200) * head_dim);
      for (float& x : keys) x = normal(rng);
      auto book = PqCodebook::Train(keys.data(), 200, head_dim, head_dim, o);
      EXPECT_TRUE(book.ok());
      layer.books.push_back(std::move(*book));
      std::vector<uint8_t> codes(static_cast<size_t>(n_coded) * m);
      for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
      layer.codes.push_back(std::move(codes));
    }
  }
  return idx;
}

void ExpectEqual(const PqIndex& a, const PqIndex& b) {
  ASSERT_EQ(a.m, b.m);
  ASSERT_EQ(a.bits, b.bits);
  ASSERT_EQ(a.head_dim, b.head_dim);
  ASSERT_EQ(a.n_kv_heads, b.n_kv_heads);
  ASSERT_EQ(a.n_layers(), b.n_layers());
  for (int l = 0; l < a.n_layers(); ++l) {
    SCOPED_TRACE(l);
    ASSERT_EQ(a.layers[l].built, b.layers[l].built);
    if (!a.layers[l].built) continue;
    ASSERT_EQ(a.layers[l].n_coded, b.layers[l].n_coded);
    for (int h = 0; h < a.n_kv_heads; ++h) {
      const auto& ca = a.layers[l].books[h].centroids();
      const auto& cb = b.layers[l].books[h].centroids();
      ASSERT_EQ(ca.size(), cb.size());
      EXPECT_EQ(std::memcmp(ca.data(), cb.data(), ca.size() * sizeof(float)), 0);
      EXPECT_EQ(a.layers[l].codes[h], b.layers[l].codes[h]);
    }
  }
}

TEST(PqIndex, RoundTripKeepsCentroidsAndCodes) {
  for (int bits : {1, 4, 6, 8}) {
    SCOPED_TRACE(bits);
    const PqIndex idx = RandomIndex(3, 2, 16, 4, bits, 37, 5 + bits);
    const std::string blob = SerializePqIndex(idx);
    auto back = DeserializePqIndex(blob);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectEqual(idx, *back);
    // The codebook rebuilt from its centroids encodes and scores as the trained one.
    std::vector<float> key(16, 0.25f), q(16, -0.5f);
    uint8_t c1[4], c2[4];
    idx.layers[0].books[1].Encode(key.data(), 1, 16, c1);
    back->layers[0].books[1].Encode(key.data(), 1, 16, c2);
    EXPECT_EQ(std::memcmp(c1, c2, 4), 0);
    std::vector<float> t1(4u << bits, 0.f), t2(4u << bits, 0.f);
    idx.layers[0].books[1].AddQueryTable(q.data(), 1.f, t1.data());
    back->layers[0].books[1].AddQueryTable(q.data(), 1.f, t2.data());
    EXPECT_EQ(t1, t2);
  }
}

TEST(PqIndex, TruncateKeepsAPrefixOfTheCodes) {
  PqIndex idx = RandomIndex(2, 2, 8, 2, 3, 50, 9);
  const std::vector<uint8_t> before = idx.layers[0].codes[1];
  idx.Truncate(20);
  EXPECT_EQ(idx.layers[0].n_coded, 20);
  EXPECT_EQ(idx.layers[0].codes[1], std::vector<uint8_t>(before.begin(), before.begin() + 40));
  idx.Truncate(30);  // never grows
  EXPECT_EQ(idx.layers[0].n_coded, 20);
  auto back = DeserializePqIndex(SerializePqIndex(idx));
  ASSERT_TRUE(back.ok());
  ExpectEqual(idx, *back);
}

TEST(PqIndex, EveryFlippedByteAndEveryTruncationIsRejected) {
  const PqIndex idx = RandomIndex(2, 1, 8, 2, 2, 9, 3);
  const std::string blob = SerializePqIndex(idx);
  ASSERT_TRUE(DeserializePqIndex(blob).ok());
  for (size_t i = 0; i < blob.size(); ++i) {
    std::string bad = blob;
    bad[i] ^= 0x10;
    auto r = DeserializePqIndex(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << "byte " << i;
  }
  for (size_t n = 0; n < blob.size(); ++n) {
    auto r = DeserializePqIndex(std::string_view(blob).substr(0, n));
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << "length " << n;
  }
  EXPECT_EQ(DeserializePqIndex(blob + "x").status().code(), StatusCode::kDataLoss);
}

// Blobs whose checksum is right but whose content is not (a writer's bug, or a forged
// blob): rejected by the bounds and range checks, not only by the checksum.
TEST(PqIndex, WellChecksummedButInvalidContentIsRejected) {
  const PqIndex idx = RandomIndex(1, 1, 8, 2, 2, 4, 11);
  const std::string blob = SerializePqIndex(idx);
  auto resum = [](std::string b) {
    const uint64_t sum = Hash64(b.data(), b.size() - 8, 0x7071);
    std::memcpy(b.data() + b.size() - 8, &sum, 8);
    return b;
  };
  ASSERT_TRUE(DeserializePqIndex(resum(blob)).ok());  // resum reproduces the writer's checksum
  auto with = [&](size_t at, uint8_t v) {
    std::string b = blob;
    b[at] = static_cast<char>(v);
    return DeserializePqIndex(resum(b)).status().code();
  };
  EXPECT_EQ(with(4, 2), StatusCode::kDataLoss);   // version
  EXPECT_EQ(with(5, 0), StatusCode::kDataLoss);   // bits 0
  EXPECT_EQ(with(5, 9), StatusCode::kDataLoss);   // bits 9
  EXPECT_EQ(with(6, 3), StatusCode::kDataLoss);   // m 3 does not divide head_dim 8
  EXPECT_EQ(with(20, 2), StatusCode::kDataLoss);  // built flag
  EXPECT_EQ(with(21, 200), StatusCode::kDataLoss);  // n_coded larger than what follows
  // The last code byte (bits 2: codes < 4) set to 4.
  EXPECT_EQ(with(blob.size() - 9, 4), StatusCode::kDataLoss);
  // A centroid that is not finite.
  std::string b = blob;
  const float nan = std::nanf("");
  std::memcpy(b.data() + 25, &nan, 4);
  EXPECT_EQ(DeserializePqIndex(resum(b)).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace attic::pq
