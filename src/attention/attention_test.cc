#include "attic/attention/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention/attention_internal.h"
#include "attention/attention_test_util.h"
#include "attic/backend/cpu_features.h"
#include "attic/backend/thread_pool.h"
#include "attic/tensor/dtype.h"

namespace attic::backend {
// Readable parameter names in gtest output.
void PrintTo(Isa isa, std::ostream* os) { *os << IsaName(isa); }
}  // namespace attic::backend

namespace attic::attention {
namespace {

using backend::Isa;
using testing_util::RandomQ;
using testing_util::Shape;

// Whether the AttentionTest being run stores KV as f16 (set by the fixture).
bool g_kv_f16 = false;

// A paged KV layer with its blocks placed at shuffled positions of a larger pool. Rows
// that hold no slot (unused blocks, the tail of the last block) are NaN, so any read
// outside the valid slots poisons the result. With g_kv_f16 the values are f16-exact (so
// the f32 reference sees what the kernels read) and View() hands out an f16 copy.
struct PagedKv {
  int n_kv_heads, block_size, head_dim, n_slots;
  std::vector<float> k_pool, v_pool;
  std::vector<int32_t> block_table;
  mutable std::vector<uint16_t> k_half, v_half;

  PagedKv(int n_kv_heads_, int block_size_, int head_dim_, int n_slots_, std::mt19937& rng)
      : n_kv_heads(n_kv_heads_), block_size(block_size_), head_dim(head_dim_), n_slots(n_slots_) {
    const int n_blocks = (n_slots + block_size - 1) / block_size;
    const int pool_blocks = n_blocks * 2 + 3;
    std::vector<int32_t> perm(pool_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    block_table.assign(perm.begin(), perm.begin() + n_blocks);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    k_pool.assign(static_cast<size_t>(pool_blocks) * stride(), nan);
    v_pool.assign(k_pool.size(), nan);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int s = 0; s < n_slots; ++s) {
      for (int h = 0; h < n_kv_heads; ++h) {
        for (int i = 0; i < head_dim; ++i) {
          k_pool[Offset(h, s) + i] = Representable(u(rng));
          v_pool[Offset(h, s) + i] = Representable(u(rng));
        }
      }
    }
  }
  static float Representable(float x) { return g_kv_f16 ? F16ToF32(F32ToF16(x)) : x; }
  int64_t stride() const { return static_cast<int64_t>(n_kv_heads) * block_size * head_dim; }
  size_t Offset(int h, int s) const {
    return static_cast<size_t>(block_table[s / block_size]) * stride() +
           (static_cast<size_t>(h) * block_size + s % block_size) * head_dim;
  }
  // Marks every slot not in `keep` as NaN (sparse tests: those must never be read).
  void PoisonAllBut(const std::vector<int32_t>& keep) {
    std::vector<bool> kept(n_slots, false);
    for (int32_t s : keep) kept[s] = true;
    for (int s = 0; s < n_slots; ++s) {
      if (kept[s]) continue;
      for (int h = 0; h < n_kv_heads; ++h) {
        for (int i = 0; i < head_dim; ++i) {
          k_pool[Offset(h, s) + i] = std::numeric_limits<float>::quiet_NaN();
          v_pool[Offset(h, s) + i] = std::numeric_limits<float>::quiet_NaN();
        }
      }
    }
  }
  KvLayerView View() const {
    KvLayerView v;
    if (g_kv_f16) {
      k_half.resize(k_pool.size());
      v_half.resize(v_pool.size());
      for (size_t i = 0; i < k_pool.size(); ++i) {
        k_half[i] = F32ToF16(k_pool[i]);
        v_half[i] = F32ToF16(v_pool[i]);
      }
      v.k_f16 = k_half.data();
      v.v_f16 = v_half.data();
    } else {
      v.k_pool = k_pool.data();
      v.v_pool = v_pool.data();
    }
    v.block_stride = stride();
    v.v_block_stride = stride();
    v.block_size = block_size;
    v.block_table = block_table.data();
    v.n_slots = n_slots;
    return v;
  }
};

// Dense softmax(q K^T * scale) V in double over the visible slots of each query.
std::vector<double> NaiveAttention(const AttentionShape& shape, const std::vector<float>& q, int n_q,
                                   const std::vector<int32_t>& kv_end, const std::vector<int32_t>* indices,
                                   const PagedKv& kv) {
  const int d = shape.head_dim, g = shape.n_heads / shape.n_kv_heads;
  std::vector<double> out(static_cast<size_t>(n_q) * shape.n_heads * d, 0.0);
  for (int i = 0; i < n_q; ++i) {
    std::vector<int32_t> slots;
    if (indices) {
      for (int32_t s : *indices) {
        if (s < kv_end[i]) slots.push_back(s);
      }
    } else {
      for (int s = 0; s < kv_end[i]; ++s) slots.push_back(s);
    }
    if (slots.empty()) continue;
    for (int h = 0; h < shape.n_heads; ++h) {
      const float* qr = &q[(static_cast<size_t>(i) * shape.n_heads + h) * d];
      std::vector<double> s(slots.size());
      double mx = -1e300;
      for (size_t j = 0; j < slots.size(); ++j) {
        const float* kr = &kv.k_pool[kv.Offset(h / g, slots[j])];
        double dot = 0;
        for (int t = 0; t < d; ++t) dot += static_cast<double>(qr[t]) * kr[t];
        s[j] = dot * shape.scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      double* o = &out[(static_cast<size_t>(i) * shape.n_heads + h) * d];
      for (size_t j = 0; j < slots.size(); ++j) {
        const float* vr = &kv.v_pool[kv.Offset(h / g, slots[j])];
        for (int t = 0; t < d; ++t) o[t] += s[j] / sum * vr[t];
      }
    }
  }
  return out;
}

// The same reference with one visible-slot list per KV head (head_lists[h], ascending):
// query head h sees the slots of head_lists[h / group] below its kv_end.
std::vector<double> NaivePerHeadAttention(const AttentionShape& shape, const std::vector<float>& q, int n_q,
                                          const std::vector<int32_t>& kv_end,
                                          const std::vector<std::vector<int32_t>>& head_lists, const PagedKv& kv) {
  const int d = shape.head_dim, g = shape.n_heads / shape.n_kv_heads;
  std::vector<double> out(static_cast<size_t>(n_q) * shape.n_heads * d, 0.0);
  for (int i = 0; i < n_q; ++i) {
    for (int h = 0; h < shape.n_heads; ++h) {
      std::vector<int32_t> slots;
      for (int32_t s : head_lists[h / g]) {
        if (s < kv_end[i]) slots.push_back(s);
      }
      if (slots.empty()) continue;
      const float* qr = &q[(static_cast<size_t>(i) * shape.n_heads + h) * d];
      std::vector<double> sc(slots.size());
      double mx = -1e300;
      for (size_t j = 0; j < slots.size(); ++j) {
        const float* kr = &kv.k_pool[kv.Offset(h / g, slots[j])];
        double dot = 0;
        for (int t = 0; t < d; ++t) dot += static_cast<double>(qr[t]) * kr[t];
        sc[j] = dot * shape.scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      for (double& x : sc) sum += (x = std::exp(x - mx));
      double* o = &out[(static_cast<size_t>(i) * shape.n_heads + h) * d];
      for (size_t j = 0; j < slots.size(); ++j) {
        const float* vr = &kv.v_pool[kv.Offset(h / g, slots[j])];
        for (int t = 0; t < d; ++t) o[t] += sc[j] / sum * vr[t];
      }
    }
  }
  return out;
}

// Each ISA's kernels, over f32 and over f16 KV storage.
class AttentionTest : public ::testing::TestWithParam<std::tuple<Isa, bool>> {
 protected:
  Isa isa() const { return std::get<0>(GetParam()); }
  void SetUp() override {
    g_kv_f16 = std::get<1>(GetParam());
    if (const char* why = testing_util::IsaUnavailable(isa())) GTEST_SKIP() << why;
  }
  void TearDown() override { g_kv_f16 = false; }

  // Runs the ISA's Attend and checks it against the naive reference.
  void Check(const std::string& what, backend::ThreadPool& pool, const AttentionShape& shape, const PagedKv& kv,
             const std::vector<float>& q, int n_q, const std::vector<int32_t>& kv_end,
             const std::vector<int32_t>* indices = nullptr) {
    std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
    internal::AttendIsa(isa(), pool, shape, q.data(), n_q, kv_end.data(), indices ? indices->data() : nullptr,
                        indices ? static_cast<int>(indices->size()) : 0, kv.View(), out.data());
    const std::vector<double> want = NaiveAttention(shape, q, n_q, kv_end, indices, kv);
    double worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const double err = std::abs(out[i] - want[i]) / (1.0 + std::abs(want[i]));
      if (!(err <= worst)) {  // also catches NaN
        worst = std::isnan(err) ? 1e30 : err;
        worst_i = i;
      }
    }
    EXPECT_LE(worst, 1e-5) << what << ": element " << worst_i << " got " << out[worst_i] << " want " << want[worst_i];
  }
};

TEST_P(AttentionTest, CausalPrefillAcrossBlockBoundaries) {
  std::mt19937 rng(11);
  backend::ThreadPool pool(2);
  for (int block_size : {16, 32}) {
    for (int g : {1, 2, 3, 4}) {
      for (int n_q : {1, 2, 3, 5, 15, 16, 17, 31, 33, 47, 48, 49, 64, 100, 129, 255, 300}) {
        const int n_kv_heads = g == 1 ? 3 : 2;
        const AttentionShape shape = Shape(n_kv_heads * g, n_kv_heads, 64);
        PagedKv kv(n_kv_heads, block_size, 64, n_q, rng);
        std::vector<float> q = RandomQ(n_q, shape.n_heads, 64, 1.0f, rng);
        std::vector<int32_t> kv_end(n_q);
        for (int i = 0; i < n_q; ++i) kv_end[i] = i + 1;
        Check("prefill bs=" + std::to_string(block_size) + " g=" + std::to_string(g) + " n_q=" + std::to_string(n_q),
              pool, shape, kv, q, n_q, kv_end);
      }
    }
  }
}

TEST_P(AttentionTest, ChunkedPrefillAfterCachedPrefix) {
  std::mt19937 rng(12);
  backend::ThreadPool pool(2);
  for (int n_past : {1, 15, 100, 700}) {
    for (int n_q : {1, 7, 40, 130}) {
      const AttentionShape shape = Shape(9, 3, 64);
      PagedKv kv(3, 16, 64, n_past + n_q, rng);
      std::vector<float> q = RandomQ(n_q, 9, 64, 1.0f, rng);
      std::vector<int32_t> kv_end(n_q);
      for (int i = 0; i < n_q; ++i) kv_end[i] = n_past + i + 1;
      Check("chunk n_past=" + std::to_string(n_past) + " n_q=" + std::to_string(n_q), pool, shape, kv, q, n_q, kv_end);
    }
  }
}

TEST_P(AttentionTest, HeadDims) {
  std::mt19937 rng(13);
  backend::ThreadPool pool(2);
  for (int d : {8, 24, 64, 80, 128}) {
    for (int g : {1, 2, 3, 4}) {
      for (int n_q : {1, 2, 20, 77}) {
        const AttentionShape shape = Shape(2 * g, 2, d);
        PagedKv kv(2, 16, d, n_q + 50, rng);
        std::vector<float> q = RandomQ(n_q, shape.n_heads, d, 1.0f, rng);
        std::vector<int32_t> kv_end(n_q);
        for (int i = 0; i < n_q; ++i) kv_end[i] = 50 + i + 1;
        Check("d=" + std::to_string(d) + " g=" + std::to_string(g) + " n_q=" + std::to_string(n_q), pool, shape, kv, q,
              n_q, kv_end);
      }
    }
  }
}

TEST_P(AttentionTest, DecodeSingleQuery) {
  std::mt19937 rng(14);
  for (int threads : {1, 2, 3}) {
    backend::ThreadPool pool(threads);
    for (int d : {8, 64, 128}) {
      for (int g : {1, 2, 3, 4, 8}) {
        for (int n_slots : {1, 17, 100, 300, 512, 1000, 2048}) {
          const int n_kv_heads = g == 8 ? 1 : 3;
          const AttentionShape shape = Shape(n_kv_heads * g, n_kv_heads, d);
          PagedKv kv(n_kv_heads, 32, d, n_slots, rng);
          std::vector<float> q = RandomQ(1, shape.n_heads, d, 1.0f, rng);
          std::vector<int32_t> kv_end = {n_slots};
          Check("decode threads=" + std::to_string(threads) + " d=" + std::to_string(d) + " g=" + std::to_string(g) +
                    " n=" + std::to_string(n_slots),
                pool, shape, kv, q, 1, kv_end);
        }
      }
    }
  }
}

TEST_P(AttentionTest, LargeGroupsAndOddRatios) {
  std::mt19937 rng(15);
  backend::ThreadPool pool(2);
  struct Case {
    int n_heads, n_kv_heads;
  };
  for (const Case& c : {Case{14, 2}, Case{16, 1}, Case{32, 8}, Case{9, 3}, Case{5, 5}}) {
    for (int n_q : {1, 2, 3, 10, 50}) {
      const AttentionShape shape = Shape(c.n_heads, c.n_kv_heads, 64);
      PagedKv kv(c.n_kv_heads, 16, 64, 400, rng);
      std::vector<float> q = RandomQ(n_q, c.n_heads, 64, 1.0f, rng);
      std::vector<int32_t> kv_end(n_q);
      for (int i = 0; i < n_q; ++i) kv_end[i] = 400 - n_q + i + 1;
      Check("heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " n_q=" + std::to_string(n_q),
            pool, shape, kv, q, n_q, kv_end);
    }
  }
}

TEST_P(AttentionTest, ArbitraryKvEndPerQuery) {
  // Partial recompute: queries at scattered positions, each with its own visible prefix.
  std::mt19937 rng(16);
  backend::ThreadPool pool(2);
  for (int g : {1, 3, 4}) {
    for (int n_q : {1, 4, 19, 64, 150}) {
      const int n_slots = 333;
      const AttentionShape shape = Shape(2 * g, 2, 64);
      PagedKv kv(2, 16, 64, n_slots, rng);
      std::vector<float> q = RandomQ(n_q, shape.n_heads, 64, 1.0f, rng);
      std::vector<int32_t> kv_end(n_q);
      std::uniform_int_distribution<int> u(1, n_slots);
      for (int32_t& e : kv_end) e = u(rng);
      Check("kv_end g=" + std::to_string(g) + " n_q=" + std::to_string(n_q), pool, shape, kv, q, n_q, kv_end);
    }
  }
}

TEST_P(AttentionTest, SparseIndexList) {
  std::mt19937 rng(17);
  backend::ThreadPool pool(2);
  for (int g : {1, 3, 4}) {
    for (int n_q : {1, 3, 30}) {
      for (double density : {0.02, 0.2, 0.7}) {
        const int n_slots = 1500;
        const AttentionShape shape = Shape(3 * g, 3, 64);
        PagedKv kv(3, 16, 64, n_slots, rng);
        std::vector<int32_t> indices;
        std::bernoulli_distribution keep(density);
        for (int s = 0; s < n_slots; ++s) {
          if (s < 4 || s >= n_slots - 16 || keep(rng)) indices.push_back(s);  // initial + local + top-k-like
        }
        kv.PoisonAllBut(indices);
        std::vector<float> q = RandomQ(n_q, shape.n_heads, 64, 1.0f, rng);
        std::vector<int32_t> kv_end(n_q);
        for (int i = 0; i < n_q; ++i) kv_end[i] = n_slots - n_q + i + 1;
        Check("sparse g=" + std::to_string(g) + " n_q=" + std::to_string(n_q) + " density=" + std::to_string(density),
              pool, shape, kv, q, n_q, kv_end, &indices);
      }
    }
  }
}

TEST_P(AttentionTest, SparseWithArbitraryKvEndIncludingNothingVisible) {
  std::mt19937 rng(18);
  backend::ThreadPool pool(2);
  const int n_slots = 500, n_q = 40;
  const AttentionShape shape = Shape(4, 2, 64);
  PagedKv kv(2, 32, 64, n_slots, rng);
  std::vector<int32_t> indices;
  for (int s = 37; s < n_slots; s += 7) indices.push_back(s);
  kv.PoisonAllBut(indices);
  std::vector<float> q = RandomQ(n_q, 4, 64, 1.0f, rng);
  std::vector<int32_t> kv_end(n_q);
  std::uniform_int_distribution<int> u(1, n_slots);
  for (int32_t& e : kv_end) e = u(rng);
  kv_end[0] = 10;  // sees no listed slot: output is zero
  kv_end[5] = 37;
  kv_end[6] = 38;  // exactly one
  Check("sparse kv_end", pool, shape, kv, q, n_q, kv_end, &indices);
}

TEST_P(AttentionTest, LargeScoresStayStable) {
  std::mt19937 rng(19);
  backend::ThreadPool pool(2);
  for (int n_q : {1, 64}) {
    const AttentionShape shape = Shape(6, 2, 64);
    PagedKv kv(2, 16, 64, 600, rng);
    std::vector<float> q = RandomQ(n_q, 6, 64, 12.0f, rng);  // scores up to ~hundreds
    std::vector<int32_t> kv_end(n_q);
    for (int i = 0; i < n_q; ++i) kv_end[i] = 600 - n_q + i + 1;
    Check("large scores n_q=" + std::to_string(n_q), pool, shape, kv, q, n_q, kv_end);
  }
}

TEST_P(AttentionTest, LongPrefill) {
  std::mt19937 rng(20);
  backend::ThreadPool pool(2);
  const int n = 1100;
  const AttentionShape shape = Shape(9, 3, 64);
  PagedKv kv(3, 16, 64, n, rng);
  std::vector<float> q = RandomQ(n, 9, 64, 1.0f, rng);
  std::vector<int32_t> kv_end(n);
  for (int i = 0; i < n; ++i) kv_end[i] = i + 1;
  Check("long prefill", pool, shape, kv, q, n, kv_end);
}

TEST_P(AttentionTest, BatchOfMixedRequests) {
  // Continuous batching: decode steps, a prefill chunk, a sparse decode and a partial
  // recompute in one call, each over its own paged KV; each also alone.
  std::mt19937 rng(24);
  backend::ThreadPool pool(2);
  const AttentionShape shape = Shape(9, 3, 64);
  struct Case {
    int n_slots, n_q;
    bool sparse, scattered;
  };
  const std::vector<Case> cases = {{700, 1, false, false}, {40, 1, false, false},  {300, 64, false, false},
                                   {1200, 1, true, false}, {500, 20, false, true}, {2000, 1, false, false}};
  std::vector<PagedKv> kvs;
  std::vector<std::vector<float>> qs, outs;
  std::vector<std::vector<int32_t>> ends, idx;
  for (const Case& c : cases) {
    kvs.emplace_back(3, 16, 64, c.n_slots, rng);
    qs.push_back(RandomQ(c.n_q, 9, 64, 1.0f, rng));
    outs.emplace_back(qs.back().size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<int32_t> e(c.n_q);
    std::uniform_int_distribution<int> u(1, c.n_slots);
    for (int i = 0; i < c.n_q; ++i) e[i] = c.scattered ? u(rng) : c.n_slots - c.n_q + i + 1;
    ends.push_back(e);
    std::vector<int32_t> ix;
    if (c.sparse) {
      for (int s = 0; s < c.n_slots; s += 3) ix.push_back(s);
      kvs.back().PoisonAllBut(ix);
    }
    idx.push_back(ix);
  }
  std::vector<AttendRequest> reqs(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    reqs[i] = AttendRequest{qs[i].data(), cases[i].n_q, ends[i].data(), cases[i].sparse ? idx[i].data() : nullptr,
                            static_cast<int>(idx[i].size()), kvs[i].View(), outs[i].data()};
  }
  internal::AttendBatchIsa(isa(), pool, shape, reqs.data(), static_cast<int>(reqs.size()));
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<double> want = NaiveAttention(shape, qs[i], cases[i].n_q, ends[i], cases[i].sparse ? &idx[i] : nullptr, kvs[i]);
    double worst = 0;
    for (size_t e = 0; e < want.size(); ++e) {
      const double err = std::abs(outs[i][e] - want[e]) / (1.0 + std::abs(want[e]));
      worst = std::isnan(err) ? 1e30 : std::max(worst, err);
    }
    EXPECT_LE(worst, 1e-5) << "request " << i;
    // The same bits as the request alone: what shares a step does not change a sequence's
    // output (seeded sampling stays reproducible under load).
    std::vector<float> alone(outs[i].size());
    AttendRequest r = reqs[i];
    r.out = alone.data();
    internal::AttendBatchIsa(isa(), pool, shape, &r, 1);
    EXPECT_EQ(alone, outs[i]) << "request " << i << " alone";
  }
}

TEST_P(AttentionTest, RowInvariantModeGivesAQueryTheSameBitsAnywhere) {
  // AttendMode::kRowInvariant: the last query of a causal chunk over a long context gives
  // the same bits alone (decode-sized), in chunks of any length (one tile or several),
  // next to other requests, and with one or two threads; and stays within the reference.
  std::mt19937 rng(31);
  backend::ThreadPool pool1(1), pool2(2);
  const AttentionShape shape = Shape(8, 4, 64);
  const int n_slots = 2500;  // several 1024-slot pieces
  PagedKv kv(4, 16, 64, n_slots, rng), other_kv(4, 16, 64, 900, rng);
  const int max_q = 150;
  std::vector<float> q = RandomQ(max_q, 8, 64, 1.0f, rng), other_q = RandomQ(40, 8, 64, 1.0f, rng);
  const size_t row = 8 * 64;
  std::vector<int32_t> ends(max_q), other_ends(40);
  for (int i = 0; i < max_q; ++i) ends[i] = n_slots - max_q + i + 1;
  for (int i = 0; i < 40; ++i) other_ends[i] = 900 - 40 + i + 1;
  std::vector<float> want;
  for (int n_q : {1, 3, 50, 150}) {
    for (bool company : {false, true}) {
      for (backend::ThreadPool* pool : {&pool1, &pool2}) {
        std::vector<float> out(static_cast<size_t>(n_q) * row), other_out(other_q.size());
        std::vector<AttendRequest> reqs;
        if (company) reqs.push_back(AttendRequest{other_q.data(), 40, other_ends.data(), nullptr, 0, other_kv.View(), other_out.data()});
        reqs.push_back(AttendRequest{q.data() + (max_q - n_q) * row, n_q, ends.data() + (max_q - n_q), nullptr, 0,
                                     kv.View(), out.data()});
        internal::AttendBatchIsa(isa(), *pool, shape, reqs.data(), static_cast<int>(reqs.size()),
                                 AttendMode::kRowInvariant);
        const std::vector<float> last(out.end() - row, out.end());
        if (want.empty()) {
          want = last;
          const std::vector<float> q1(q.end() - row, q.end());
          const std::vector<double> ref = NaiveAttention(shape, q1, 1, {n_slots}, nullptr, kv);
          for (size_t e = 0; e < ref.size(); ++e) EXPECT_NEAR(last[e], ref[e], 1e-5 * (1.0 + std::abs(ref[e]))) << e;
        }
        EXPECT_EQ(last, want) << "n_q=" << n_q << (company ? " with company" : "") << " threads=" << pool->n_threads();
      }
    }
  }
}

TEST_P(AttentionTest, PerKvHeadIndexLists) {
  // PQCache-style decode and partial recompute: each KV head sees its own slots (lists of
  // different lengths, one empty), next to a dense request in the same call. Every slot
  // in no list is NaN, so a head reading another head's list poisons the result.
  std::mt19937 rng(32);
  backend::ThreadPool pool(2);
  const int n_kv_heads = 3, n_slots = 700;
  for (int g : {1, 2, 4}) {
    for (int n_q : {1, 3, 30}) {
      for (bool scattered_ends : {false, true}) {
        const AttentionShape shape = Shape(n_kv_heads * g, n_kv_heads, 64);
        PagedKv kv(n_kv_heads, 16, 64, n_slots, rng);
        std::vector<std::vector<int32_t>> lists(n_kv_heads);
        const double density[] = {0.05, 0.0, 0.5};  // head 1: empty list
        for (int h = 0; h < n_kv_heads; ++h) {
          if (density[h] == 0) continue;
          std::bernoulli_distribution keep(density[h]);
          for (int s = 0; s < n_slots; ++s) {
            if (s < 4 || s >= n_slots - 16 || keep(rng)) lists[h].push_back(s);  // initial + local + top-k-like
          }
        }
        // Poison per head: slot s of head h is NaN unless s is in lists[h].
        for (int h = 0; h < n_kv_heads; ++h) {
          std::vector<bool> in(n_slots, false);
          for (int32_t s : lists[h]) in[s] = true;
          for (int s = 0; s < n_slots; ++s) {
            if (in[s]) continue;
            for (int i = 0; i < 64; ++i) {
              kv.k_pool[kv.Offset(h, s) + i] = std::numeric_limits<float>::quiet_NaN();
              kv.v_pool[kv.Offset(h, s) + i] = std::numeric_limits<float>::quiet_NaN();
            }
          }
        }
        std::vector<const int32_t*> ptrs(n_kv_heads);
        std::vector<int32_t> counts(n_kv_heads);
        for (int h = 0; h < n_kv_heads; ++h) {
          ptrs[h] = lists[h].empty() ? nullptr : lists[h].data();
          counts[h] = static_cast<int32_t>(lists[h].size());
        }
        std::vector<float> q = RandomQ(n_q, shape.n_heads, 64, 1.0f, rng);
        std::vector<int32_t> kv_end(n_q);
        std::uniform_int_distribution<int> u(1, n_slots);
        for (int i = 0; i < n_q; ++i) kv_end[i] = scattered_ends ? u(rng) : n_slots - n_q + i + 1;
        // A dense request alongside.
        PagedKv dense_kv(n_kv_heads, 16, 64, 300, rng);
        std::vector<float> dense_q = RandomQ(5, shape.n_heads, 64, 1.0f, rng);
        std::vector<int32_t> dense_end = {296, 297, 298, 299, 300};
        std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
        std::vector<float> dense_out(dense_q.size(), std::numeric_limits<float>::quiet_NaN());
        std::vector<AttendRequest> reqs(2);
        reqs[0] = AttendRequest{dense_q.data(), 5, dense_end.data(), nullptr, 0, dense_kv.View(), dense_out.data()};
        reqs[1] = AttendRequest{q.data(), n_q, kv_end.data(), nullptr, 0, kv.View(), out.data()};
        reqs[1].head_indices = ptrs.data();
        reqs[1].n_head_indices = counts.data();
        internal::AttendBatchIsa(isa(), pool, shape, reqs.data(), 2);
        const std::string what = "g=" + std::to_string(g) + " n_q=" + std::to_string(n_q) +
                                 (scattered_ends ? " scattered kv_end" : " causal");
        const std::vector<double> want = NaivePerHeadAttention(shape, q, n_q, kv_end, lists, kv);
        double worst = 0;
        size_t worst_i = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          const double err = std::abs(out[i] - want[i]) / (1.0 + std::abs(want[i]));
          if (!(err <= worst)) {
            worst = std::isnan(err) ? 1e30 : err;
            worst_i = i;
          }
        }
        EXPECT_LE(worst, 1e-5) << what << ": element " << worst_i << " got " << out[worst_i] << " want "
                               << want[worst_i];
        // Head 1's list is empty: its query heads' rows are exactly zero.
        for (int i = 0; i < n_q; ++i) {
          for (int qh = g; qh < 2 * g; ++qh) {
            for (int t = 0; t < 64; ++t) {
              ASSERT_EQ(out[(static_cast<size_t>(i) * shape.n_heads + qh) * 64 + t], 0.0f) << what;
            }
          }
        }
        const std::vector<double> dense_want = NaiveAttention(shape, dense_q, 5, dense_end, nullptr, dense_kv);
        for (size_t i = 0; i < dense_out.size(); ++i) {
          ASSERT_NEAR(dense_out[i], dense_want[i], 1e-5 * (1.0 + std::abs(dense_want[i]))) << what << " dense " << i;
        }
      }
    }
  }
}

TEST_P(AttentionTest, PerKvHeadListsAllEqualGiveTheSharedListsBits) {
  // The same list for every KV head is the shared `indices` list, bit for bit.
  std::mt19937 rng(33);
  backend::ThreadPool pool(2);
  const AttentionShape shape = Shape(8, 2, 64);
  PagedKv kv(2, 16, 64, 900, rng);
  std::vector<int32_t> list;
  for (int s = 0; s < 900; s += 5) list.push_back(s);
  for (int n_q : {1, 40}) {
    std::vector<float> q = RandomQ(n_q, 8, 64, 1.0f, rng);
    std::vector<int32_t> kv_end(n_q);
    for (int i = 0; i < n_q; ++i) kv_end[i] = 900 - n_q + i + 1;
    std::vector<float> shared(q.size()), per_head(q.size());
    AttendRequest r{q.data(), n_q, kv_end.data(), list.data(), static_cast<int>(list.size()), kv.View(), shared.data()};
    internal::AttendBatchIsa(isa(), pool, shape, &r, 1);
    const int32_t* ptrs[2] = {list.data(), list.data()};
    const int32_t counts[2] = {static_cast<int32_t>(list.size()), static_cast<int32_t>(list.size())};
    AttendRequest rh{q.data(), n_q, kv_end.data(), nullptr, 0, kv.View(), per_head.data()};
    rh.head_indices = ptrs;
    rh.n_head_indices = counts;
    internal::AttendBatchIsa(isa(), pool, shape, &rh, 1);
    EXPECT_EQ(shared, per_head) << n_q;
  }
}

TEST_P(AttentionTest, DecodeIndexListEqualsDenseOverTheSameRowsBitForBit) {
  // A PQCache-shaped selection per KV head (initial slots, runs, scattered slots, the
  // local window) against the same rows copied in order into a compact KV of their own
  // and attended densely: the kernel must read each selected row where it lies and do
  // exactly what it does for consecutive slots, so the outputs are the same bits.
  std::mt19937 rng(34);
  backend::ThreadPool pool(2);
  const int n_kv_heads = 3, n_slots = 1400;
  for (int block_size : {16, 128}) {
    for (int g : {1, 3}) {
      for (double density : {0.03, 0.2, 0.6}) {
        const AttentionShape shape = Shape(n_kv_heads * g, n_kv_heads, 64);
        PagedKv kv(n_kv_heads, block_size, 64, n_slots, rng);
        std::vector<std::vector<int32_t>> lists(n_kv_heads);
        std::bernoulli_distribution keep(density), run(0.02);
        for (int h = 0; h < n_kv_heads; ++h) {
          for (int s = 0; s < n_slots; ++s) {
            if (s < 4 || s >= n_slots - 70 || keep(rng)) {
              lists[h].push_back(s);
            } else if (run(rng)) {  // a run of consecutive slots, as neighbouring keys often score alike
              for (int e = std::min(n_slots - 70, s + 1 + static_cast<int>(rng() % 40)); s < e; ++s) lists[h].push_back(s);
              --s;
            }
          }
        }
        // Every list the same length, so one compact KV (slot j = list entry j) serves all heads.
        size_t len = lists[0].size();
        for (const auto& l : lists) len = std::min(len, l.size());
        for (auto& l : lists) l.erase(l.begin() + 4, l.begin() + 4 + (l.size() - len));  // keep initial and local
        PagedKv compact(n_kv_heads, block_size, 64, static_cast<int>(len), rng);
        for (int h = 0; h < n_kv_heads; ++h) {
          for (size_t j = 0; j < len; ++j) {
            std::copy_n(&kv.k_pool[kv.Offset(h, lists[h][j])], 64, &compact.k_pool[compact.Offset(h, static_cast<int>(j))]);
            std::copy_n(&kv.v_pool[kv.Offset(h, lists[h][j])], 64, &compact.v_pool[compact.Offset(h, static_cast<int>(j))]);
          }
        }
        std::vector<float> q = RandomQ(1, shape.n_heads, 64, 1.0f, rng);
        const int32_t end = n_slots, compact_end = static_cast<int32_t>(len);
        std::vector<const int32_t*> ptrs;
        std::vector<int32_t> counts;
        for (const auto& l : lists) {
          ptrs.push_back(l.data());
          counts.push_back(static_cast<int32_t>(l.size()));
        }
        std::vector<float> sparse(q.size()), dense(q.size());
        AttendRequest r{q.data(), 1, &end, nullptr, 0, kv.View(), sparse.data()};
        r.head_indices = ptrs.data();
        r.n_head_indices = counts.data();
        internal::AttendBatchIsa(isa(), pool, shape, &r, 1);
        AttendRequest rd{q.data(), 1, &compact_end, nullptr, 0, compact.View(), dense.data()};
        internal::AttendBatchIsa(isa(), pool, shape, &rd, 1);
        EXPECT_EQ(sparse, dense) << "block " << block_size << " g " << g << " density " << density;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, AttentionTest,
                         ::testing::Combine(::testing::Values(Isa::kGeneric, Isa::kAvx2, Isa::kAvx512),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<Isa, bool>>& info) {
                           return std::string(backend::IsaName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_f16" : "_f32");
                         });

TEST(AttentionPublicTest, AttendMatchesActiveIsaKernels) {
  std::mt19937 rng(21);
  backend::ThreadPool pool(2);
  const int n_q = 37;
  const AttentionShape shape = Shape(9, 3, 64);
  PagedKv kv(3, 16, 64, 90, rng);
  std::vector<float> q = RandomQ(n_q, 9, 64, 1.0f, rng);
  std::vector<int32_t> kv_end(n_q);
  for (int i = 0; i < n_q; ++i) kv_end[i] = 90 - n_q + i + 1;
  std::vector<float> a(q.size()), b(q.size());
  Attend(pool, shape, q.data(), n_q, kv_end.data(), nullptr, 0, kv.View(), a.data());
  internal::AttendIsa(backend::ActiveIsa(), pool, shape, q.data(), n_q, kv_end.data(), nullptr, 0, kv.View(), b.data());
  EXPECT_EQ(a, b);
}

TEST(AttentionPublicTest, RepeatableForAGivenPool) {
  std::mt19937 rng(23);
  backend::ThreadPool pool(2);
  const AttentionShape shape = Shape(9, 3, 64);
  PagedKv kv(3, 16, 64, 1500, rng);
  for (int n_q : {1, 200}) {
    std::vector<float> q = RandomQ(n_q, 9, 64, 1.0f, rng);
    std::vector<int32_t> kv_end(n_q);
    for (int i = 0; i < n_q; ++i) kv_end[i] = 1500 - n_q + i + 1;
    std::vector<float> a(q.size()), b(q.size());
    Attend(pool, shape, q.data(), n_q, kv_end.data(), nullptr, 0, kv.View(), a.data());
    Attend(pool, shape, q.data(), n_q, kv_end.data(), nullptr, 0, kv.View(), b.data());
    EXPECT_EQ(a, b) << n_q;
  }
}

TEST(AttentionPublicTest, IndexListOfAllSlotsEqualsDense) {
  std::mt19937 rng(22);
  backend::ThreadPool pool(2);
  const int n_q = 5, n_slots = 260;
  const AttentionShape shape = Shape(8, 2, 64);
  PagedKv kv(2, 16, 64, n_slots, rng);
  std::vector<float> q = RandomQ(n_q, 8, 64, 1.0f, rng);
  std::vector<int32_t> kv_end(n_q, n_slots), all(n_slots);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> a(q.size()), b(q.size());
  Attend(pool, shape, q.data(), n_q, kv_end.data(), nullptr, 0, kv.View(), a.data());
  Attend(pool, shape, q.data(), n_q, kv_end.data(), all.data(), n_slots, kv.View(), b.data());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace attic::attention
