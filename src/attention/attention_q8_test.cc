// Attention over q8_0 KV (attention/kv_q8.h), every ISA's kernels: dense prefill, chunks
// after a prefix, decode, per-query kv_end (linking's explicit KV sets), index lists and
// per-KV-head lists (sparse decoding). Each result is checked twice:
//   1. against a float64 reference over the DEQUANTIZED rows (the values the kernels
//      must read): the kernels' own f32 error, the bound attention_test.cc uses;
//   2. against a float64 reference over the ORIGINAL f32 rows, within a bound derived from
//      the quantization step (QuantBound below): what q8_0 KV costs in accuracy.
// And the quantizer against a hand-computed block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "attention/attention_internal.h"
#include "attention/attention_test_util.h"
#include "attic/attention/attention.h"
#include "attic/attention/kv_q8.h"
#include "attic/backend/cpu_features.h"
#include "attic/backend/thread_pool.h"
#include "attic/tensor/dtype.h"

namespace attic::backend {
void PrintTo(Isa isa, std::ostream* os);  // attention_test.cc
}  // namespace attic::backend

namespace attic::attention {
namespace {

using backend::Isa;
using testing_util::Shape;

// The golden block: x below, max|x| = 1.27, so d = 1.27 / 127 = 0.01, stored as the f16
// 0x211F = (1 + 287/1024) * 2^-7 = 0.01000213623046875 (0.01 * 2^7 = 1.28, and
// 0.28 * 1024 = 286.72 rounds to 287). q = round(x / d'): 1.27 / d' = 126.97 -> 127,
// -0.635 / d' = -63.49 -> -63, 0 -> 0, 0.01 / d' = 0.9998 -> 1, 0.005 / d' = 0.49989 -> 0
// (just below the half), -127, 0.3175 / d' = 31.74 -> 32, 0.6 / d' = 59.99 -> 60.
constexpr float kGoldenX[8] = {1.27f, -0.635f, 0.0f, 0.01f, 0.005f, -1.27f, 0.3175f, 0.6f};
constexpr int8_t kGoldenQ[8] = {127, -63, 0, 1, 0, -127, 32, 60};
constexpr uint16_t kGoldenScale = 0x211F;

TEST(KvQ8, GoldenBlockHeadDim8) {
  int8_t q[8];
  uint16_t scale = 0;
  QuantizeKvRowQ8(kGoldenX, 8, q, &scale);
  EXPECT_EQ(scale, kGoldenScale);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q[i], kGoldenQ[i]) << "element " << i;
  float y[8];
  DequantizeKvRowQ8(q, &scale, 8, y);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(y[i], 0.01000213623046875f * kGoldenQ[i]) << "element " << i;
    EXPECT_LE(std::abs(y[i] - kGoldenX[i]), 0.01000213623046875 / 2) << "element " << i;
  }
}

TEST(KvQ8, GroupsOf32AreIndependent) {
  // head_dim 64: group 0 all zeros (scale 0), group 1 the golden values four times over.
  float x[64] = {};
  for (int i = 0; i < 32; ++i) x[32 + i] = kGoldenX[i % 8];
  int8_t q[64];
  uint16_t scales[2] = {1, 1};
  QuantizeKvRowQ8(x, 64, q, scales);
  EXPECT_EQ(scales[0], 0);
  EXPECT_EQ(scales[1], kGoldenScale);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[i], 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[32 + i], kGoldenQ[i % 8]) << "element " << 32 + i;
  EXPECT_EQ(KvQ8Group(8), 8);
  EXPECT_EQ(KvQ8Group(64), 32);
  EXPECT_TRUE(KvQ8Supports(8));
  EXPECT_TRUE(KvQ8Supports(128));
  EXPECT_FALSE(KvQ8Supports(48));
}

// The quantizer against kv_q8.h's formula, written out here in scalar float arithmetic:
// d = f16(min(max|x| / 127, 65504)), q = round(x / d) (halves away from zero), clamped to
// +-127. Rows whose quotients land exactly on halves (x = (k + 1/2) d, exact in f32 for an
// f16 d), and groups whose scale is an f16 subnormal or zero, besides random ones: every
// ISA the table runs must give these bits (AVX2 and later quantize eight values at a time).
TEST(KvQ8, QuantizerFollowsTheFormulaBitForBit) {
  auto reference = [](const float* x, int n, int group, int8_t* q, uint16_t* s) {
    for (int g0 = 0; g0 < n; g0 += group) {
      float amax = 0;
      for (int i = g0; i < g0 + group; ++i) amax = std::max(amax, std::fabs(x[i]));
      const uint16_t h = F32ToF16(std::min(amax / 127.0f, 65504.0f));
      const float d = F16ToF32(h);
      s[g0 / group] = h;
      for (int i = g0; i < g0 + group; ++i) {
        const float r = d > 0 ? std::round(x[i] / d) : 0.0f;  // C's round: halves away from zero
        q[i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
      }
    }
  };
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> k(-127, 126);
  for (int d : {8, 16, 32, 64, 128}) {
    const int group = KvQ8Group(d);
    std::vector<float> x(d);
    std::vector<int8_t> q(d), want_q(d);
    std::vector<uint16_t> s(d / group), want_s(d / group);
    for (int rep = 0; rep < 400; ++rep) {
      const int kind = rep % 4;
      if (kind == 0) {  // random
        for (float& v : x) v = u(rng) * 3.0f;
      } else if (kind == 1) {  // halves: one value sets d exactly, the rest sit on (k + 1/2) d
        // or one f32 step nearer zero (0.5 - 2^-25 rounds to 0, where t + 0.5 would give 1)
        const float step = F16ToF32(static_cast<uint16_t>(0x1000 + rep * 37 % 0x3000));
        for (int i = 0; i < d; ++i) {
          const float half = (k(rng) + 0.5f) * step;
          x[i] = i % group == 0 ? 127 * step : i % 3 == 1 ? std::nextafter(half, 0.0f) : half;
        }
      } else if (kind == 2) {  // tiny: subnormal f16 scales, or zero
        for (float& v : x) v = u(rng) * (rep % 8 == 2 ? 1e-3f : 1e-9f);
      } else {  // huge: the scale clamps at 65504
        for (float& v : x) v = u(rng) * 1e8f;
      }
      QuantizeKvRowQ8(x.data(), d, q.data(), s.data());
      reference(x.data(), d, group, want_q.data(), want_s.data());
      ASSERT_EQ(s, want_s) << "d=" << d << " rep=" << rep;
      ASSERT_EQ(q, want_q) << "d=" << d << " rep=" << rep;
    }
  }
}

TEST(KvQ8, RoundTripWithinHalfAStep) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (int d : {8, 16, 32, 64, 128}) {
    std::vector<float> x(d), y(d);
    std::vector<int8_t> q(d);
    std::vector<uint16_t> s(d / KvQ8Group(d));
    for (int rep = 0; rep < 50; ++rep) {
      for (float& v : x) v = u(rng) * (rep % 5 == 0 ? 1e-3f : 1.0f);
      QuantizeKvRowQ8(x.data(), d, q.data(), s.data());
      DequantizeKvRowQ8(q.data(), s.data(), d, y.data());
      for (int i = 0; i < d; ++i) {
        // q = round(fl(x / step)): fl() is off by at most 2^-24 |x / step| <= 127 * 2^-24
        // steps before the rounding's half step; y = step q is exact, and the difference
        // below rounds once more (a relative 2^-24).
        const double step = F16ToF32(s[i / KvQ8Group(d)]);
        const double bound = (0.5 + 127 * 0x1p-24) * step * (1 + 0x1p-24);
        EXPECT_LE(std::abs(x[i] - y[i]), bound) << "d=" << d << " i=" << i;
        EXPECT_LE(std::abs(q[i]), 127);
      }
    }
  }
}

// A paged q8_0 KV layer in the block pool's layout, its blocks at shuffled places of a
// larger pool; the scales of rows that hold no slot are NaN, so any read outside the
// valid slots poisons the result. Keeps the original f32 rows and their dequantized form.
struct PagedQ8 {
  int n_kv_heads, block_size, head_dim, n_slots;
  std::vector<int32_t> block_table;
  std::vector<int8_t> k_bytes, v_bytes;
  std::vector<float> k_orig, v_orig, k_deq, v_deq;  // [n_kv_heads][n_slots][head_dim]

  PagedQ8(int n_kv_heads_, int block_size_, int head_dim_, int n_slots_, std::mt19937& rng)
      : n_kv_heads(n_kv_heads_), block_size(block_size_), head_dim(head_dim_), n_slots(n_slots_) {
    const int n_blocks = (n_slots + block_size - 1) / block_size;
    const int pool_blocks = n_blocks * 2 + 3;
    std::vector<int32_t> perm(pool_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    block_table.assign(perm.begin(), perm.begin() + n_blocks);
    k_bytes.assign(static_cast<size_t>(pool_blocks) * block_bytes(), 0);
    v_bytes.assign(k_bytes.size(), 0);
    const uint16_t nan = 0x7E00;  // an f16 NaN
    for (int b = 0; b < pool_blocks; ++b) {
      for (int64_t i = 0; i < stride() / group(); ++i) {
        std::memcpy(k_bytes.data() + b * block_bytes() + stride() + 2 * i, &nan, 2);
        std::memcpy(v_bytes.data() + b * block_bytes() + stride() + 2 * i, &nan, 2);
      }
    }
    const size_t n = static_cast<size_t>(n_kv_heads) * n_slots * head_dim;
    k_orig.resize(n);
    v_orig.resize(n);
    k_deq.resize(n);
    v_deq.resize(n);
    // Values of mixed magnitude per row (an outlier channel in K, as real keys have).
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int h = 0; h < n_kv_heads; ++h) {
      for (int s = 0; s < n_slots; ++s) {
        float* k = &k_orig[Row(h, s)];
        float* v = &v_orig[Row(h, s)];
        for (int i = 0; i < head_dim; ++i) {
          k[i] = u(rng) * (i == 3 ? 4.0f : 1.0f);
          v[i] = u(rng);
        }
        int8_t* kq = k_bytes.data() + ValueOffset(h, s);
        int8_t* vq = v_bytes.data() + ValueOffset(h, s);
        auto* ks = reinterpret_cast<uint16_t*>(k_bytes.data() + ScaleOffset(h, s));
        auto* vs = reinterpret_cast<uint16_t*>(v_bytes.data() + ScaleOffset(h, s));
        QuantizeKvRowQ8(k, head_dim, kq, ks);
        QuantizeKvRowQ8(v, head_dim, vq, vs);
        DequantizeKvRowQ8(kq, ks, head_dim, &k_deq[Row(h, s)]);
        DequantizeKvRowQ8(vq, vs, head_dim, &v_deq[Row(h, s)]);
      }
    }
  }
  int group() const { return KvQ8Group(head_dim); }
  int64_t stride() const { return static_cast<int64_t>(n_kv_heads) * block_size * head_dim; }
  int64_t block_bytes() const { return stride() + stride() / group() * 2; }
  size_t Row(int h, int s) const { return (static_cast<size_t>(h) * n_slots + s) * head_dim; }
  int64_t ValueOffset(int h, int s) const {
    return block_table[s / block_size] * block_bytes() + (static_cast<int64_t>(h) * block_size + s % block_size) * head_dim;
  }
  int64_t ScaleOffset(int h, int s) const {
    return block_table[s / block_size] * block_bytes() + stride() +
           (static_cast<int64_t>(h) * block_size + s % block_size) * head_dim / group() * 2;
  }
  // The stored scale of element i of (h, s)'s K (or V) row.
  float Scale(bool v, int h, int s, int i) const {
    uint16_t bits;
    std::memcpy(&bits, (v ? v_bytes : k_bytes).data() + ScaleOffset(h, s) + 2 * (i / group()), 2);
    return F16ToF32(bits);
  }
  KvLayerView View() const {
    KvLayerView view;
    view.k_q8 = k_bytes.data();
    view.v_q8 = v_bytes.data();
    view.q8_scales = stride();
    view.block_stride = block_bytes();
    view.v_q8_scales = stride();
    view.v_block_stride = block_bytes();
    view.block_size = block_size;
    view.block_table = block_table.data();
    view.n_slots = n_slots;
    return view;
  }
};

// The references for one query head over its visible slots: out_deq over the dequantized
// rows, out_orig over the original rows, and bound[t], how far q8_0 may move out_orig[t].
//
// Derivation of the bound. Each stored value is x + e with |e| <= d_b / 2, d_b the scale of
// its group (kv_q8.h). Scores s_j = c q . k_j (c = shape.scale) then move by
//   |s'_j - s_j| <= c sum_i |q_i| |e_ji| <= c sum_b (d_b / 2) sum_{i in b} |q_i| =: delta_j,
// computed here from the stored scales, and D = max_j delta_j. The softmax weights
// p_j = e^{s_j} / sum_k e^{s_k} then change by a factor within [e^{-2D}, e^{2D}], so
// |p'_j - p_j| <= p_j (e^{2D} - 1). The output o_t = sum_j p_j v_jt becomes
// o'_t = sum_j p'_j v'_jt, and
//   |o'_t - o_t| <= sum_j |p'_j - p_j| |v'_jt| + sum_j p_j |v'_jt - v_jt|
//                <= (e^{2D} - 1) max_j |v'_jt| + max_j dv_j(t) / 2,
// dv_j(t) the scale of V_j's group holding t. The kernels' own f32 error is added on top.
//
// A kernel that quantizes the query (KernelSet::few_q8_quantizes_query; as llama.cpp's
// q8_0 dot product) reads q~ with |q~_i - q_i| <= (1/2 + e) dq_g per element, dq_g =
// max_{i in g} |q_i| / 127 over q's q8_0 group g. e: the kernel scales q to log2 units
// (one f32 rounding), takes dq = fl(max / 127) (one more) and q / dq before rounding to an
// integer (one more, of a value <= 127 (1 + 2^-23)): the distance to the integer grows by at
// most 127 * 2^-23 per rounding of the quotient and the scale is off by 3 * 2^-24
// relative, so (1/2 + 2 * 127 * 2^-23)(1 + 3 * 2^-24) < 1/2 + 2^-14 =: (1/2 + e). Then
// q~ . k' - q . k = (q~ - q) . k' + q . (k' - k), so each score moves by at most
//   deltaq_j = c sum_g (1/2 + e) dq_g sum_{i in g} |k'_ji|
// more, against the dequantized rows (bound_deq) and the original ones (bound, with
// delta_j + deltaq_j in place of delta_j), through the same e^{2D} - 1 factor.
struct Reference {
  std::vector<double> out_deq, out_orig, bound, bound_deq;
};

Reference ReferenceHead(const AttentionShape& shape, const float* q, const std::vector<int32_t>& slots,
                        const PagedQ8& kv, int kv_head, bool q_quantized = false) {
  const int d = shape.head_dim;
  Reference r;
  r.out_deq.assign(d, 0.0);
  r.out_orig.assign(d, 0.0);
  r.bound.assign(d, 0.0);
  r.bound_deq.assign(d, 0.0);
  if (slots.empty()) return r;
  for (int pass = 0; pass < 2; ++pass) {
    const std::vector<float>& ks = pass == 0 ? kv.k_deq : kv.k_orig;
    const std::vector<float>& vs = pass == 0 ? kv.v_deq : kv.v_orig;
    std::vector<double> s(slots.size());
    double mx = -1e300;
    for (size_t j = 0; j < slots.size(); ++j) {
      const float* k = &ks[kv.Row(kv_head, slots[j])];
      double dot = 0;
      for (int t = 0; t < d; ++t) dot += static_cast<double>(q[t]) * k[t];
      s[j] = dot * shape.scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - mx));
    std::vector<double>& out = pass == 0 ? r.out_deq : r.out_orig;
    for (size_t j = 0; j < slots.size(); ++j) {
      const float* v = &vs[kv.Row(kv_head, slots[j])];
      for (int t = 0; t < d; ++t) out[t] += s[j] / sum * v[t];
    }
  }
  std::vector<double> dq(d, 0.0);  // the query's quantization step per element
  if (q_quantized) {
    const int group = KvQ8Group(d);
    for (int g0 = 0; g0 < d; g0 += group) {
      double amax = 0;
      for (int t = g0; t < g0 + group; ++t) amax = std::max(amax, std::abs(static_cast<double>(q[t])));
      for (int t = g0; t < g0 + group; ++t) dq[t] = amax / 127;
    }
  }
  double delta_max = 0, deltaq_max = 0;
  std::vector<double> v_max(d, 0.0), v_step(d, 0.0);
  for (int32_t slot : slots) {
    double delta = 0, deltaq = 0;
    const float* kd = &kv.k_deq[kv.Row(kv_head, slot)];
    for (int t = 0; t < d; ++t) {
      delta += kv.Scale(false, kv_head, slot, t) / 2 * std::abs(static_cast<double>(q[t]));
      deltaq += (0.5 + 0x1p-14) * dq[t] * std::abs(static_cast<double>(kd[t]));
    }
    delta_max = std::max(delta_max, (delta + deltaq) * shape.scale);
    deltaq_max = std::max(deltaq_max, deltaq * shape.scale);
    const float* v = &kv.v_deq[kv.Row(kv_head, slot)];
    for (int t = 0; t < d; ++t) {
      v_max[t] = std::max(v_max[t], std::abs(static_cast<double>(v[t])));
      v_step[t] = std::max(v_step[t], static_cast<double>(kv.Scale(true, kv_head, slot, t)));
    }
  }
  for (int t = 0; t < d; ++t) {
    r.bound[t] = std::expm1(2 * delta_max) * v_max[t] + v_step[t] / 2;
    r.bound_deq[t] = std::expm1(2 * deltaq_max) * v_max[t];
  }
  return r;
}

// Queries uniform in [-1, 1].
std::vector<float> RandomQ(int n_q, int n_heads, int d, std::mt19937& rng) {
  return testing_util::RandomQ(n_q, n_heads, d, 1.0f, rng);
}

class AttentionQ8Test : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (const char* why = testing_util::IsaUnavailable(GetParam())) GTEST_SKIP() << why;
  }

  // Runs the ISA's kernels on one request and checks every output element against both
  // references. visible(i, kv_head) lists the slots query i's heads of that KV head see.
  template <class Visible>
  void Check(const std::string& what, backend::ThreadPool& pool, const AttentionShape& shape, const PagedQ8& kv,
             AttendRequest req, const std::vector<float>& q, Visible visible) {
    std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
    req.q = q.data();
    req.out = out.data();
    req.kv = kv.View();
    internal::AttendBatchIsa(GetParam(), pool, shape, &req, 1);
    const int d = shape.head_dim, g = shape.n_heads / shape.n_kv_heads;
    // Whether the request ran the few-row kernel, and that kernel quantizes the query.
    const internal::KernelSet ks = GetParam() == Isa::kAvx512 ? internal::Avx512Kernels()
                                   : GetParam() == Isa::kAvx2 ? internal::Avx2Kernels()
                                                              : internal::GenericKernels();
    const bool q_quantized = ks.few_q8_quantizes_query && ks.few != nullptr && req.n_q * g <= ks.few_rows_max &&
                             d % ks.few_head_dim_multiple == 0;
    CheckOutput(what, shape, kv, req.n_q, q, out, q_quantized, visible);
  }

  // Checks out (Attend's result for queries q) against both references.
  template <class Visible>
  static void CheckOutput(const std::string& what, const AttentionShape& shape, const PagedQ8& kv, int n_q,
                          const std::vector<float>& q, const std::vector<float>& out, bool q_quantized,
                          Visible visible) {
    const int d = shape.head_dim, g = shape.n_heads / shape.n_kv_heads;
    double worst_exact = 0, worst_quant = 0;  // error / allowed
    std::string at_exact, at_quant;
    for (int i = 0; i < n_q; ++i) {
      for (int h = 0; h < shape.n_heads; ++h) {
        const size_t row = (static_cast<size_t>(i) * shape.n_heads + h) * d;
        const Reference r = ReferenceHead(shape, &q[row], visible(i, h / g), kv, h / g, q_quantized);
        for (int t = 0; t < d; ++t) {
          const double got = out[row + t];
          // 1. The kernels' f32 error over the values they read (attention_test.cc's bound),
          //    plus the query's quantization where the kernel quantizes it.
          const double exact =
              std::abs(got - r.out_deq[t]) / (r.bound_deq[t] + 1e-5 * (1.0 + std::abs(r.out_deq[t])));
          // 2. q8_0's error (derived above) plus the same f32 allowance.
          const double quant =
              std::abs(got - r.out_orig[t]) / (r.bound[t] + 1e-5 * (1.0 + std::abs(r.out_orig[t])));
          if (!(exact <= worst_exact)) {  // also catches NaN
            worst_exact = std::isnan(exact) ? 1e30 : exact;
            at_exact = "q " + std::to_string(i) + " head " + std::to_string(h) + " dim " + std::to_string(t) +
                       ": got " + std::to_string(got) + " want " + std::to_string(r.out_deq[t]);
          }
          if (!(quant <= worst_quant)) {
            worst_quant = std::isnan(quant) ? 1e30 : quant;
            at_quant = "q " + std::to_string(i) + " head " + std::to_string(h) + " dim " + std::to_string(t) +
                       ": got " + std::to_string(got) + " want " + std::to_string(r.out_orig[t]) + " bound " +
                       std::to_string(r.bound[t]);
          }
        }
      }
    }
    EXPECT_LE(worst_exact, 1.0) << what << " (against the dequantized rows): " << at_exact;
    EXPECT_LE(worst_quant, 1.0) << what << " (against the original rows): " << at_quant;
  }

  // Causal / kv_end-limited requests over every slot below kv_end (optionally through an
  // index list).
  void CheckKvEnd(const std::string& what, backend::ThreadPool& pool, const AttentionShape& shape, const PagedQ8& kv,
                  const std::vector<float>& q, const std::vector<int32_t>& kv_end,
                  const std::vector<int32_t>* indices = nullptr) {
    AttendRequest req;
    req.n_q = static_cast<int>(kv_end.size());
    req.kv_end = kv_end.data();
    if (indices != nullptr) {
      req.indices = indices->data();
      req.n_indices = static_cast<int>(indices->size());
    }
    Check(what, pool, shape, kv, req, q, [&](int i, int /*kv_head*/) {
      std::vector<int32_t> slots;
      if (indices != nullptr) {
        for (int32_t s : *indices)
          if (s < kv_end[i]) slots.push_back(s);
      } else {
        for (int s = 0; s < kv_end[i]; ++s) slots.push_back(s);
      }
      return slots;
    });
  }
};

TEST_P(AttentionQ8Test, CausalPrefill) {
  std::mt19937 rng(21);
  backend::ThreadPool pool(2);
  for (int d : {8, 32, 64, 128}) {
    for (int g : {1, 3}) {
      for (int n_q : {1, 17, 100}) {
        const AttentionShape shape = Shape(2 * g, 2, d);
        PagedQ8 kv(2, 16, d, n_q, rng);
        const std::vector<float> q = RandomQ(n_q, shape.n_heads, d, rng);
        std::vector<int32_t> kv_end(n_q);
        for (int i = 0; i < n_q; ++i) kv_end[i] = i + 1;
        CheckKvEnd("prefill d=" + std::to_string(d) + " g=" + std::to_string(g) + " n_q=" + std::to_string(n_q), pool,
                   shape, kv, q, kv_end);
      }
    }
  }
}

TEST_P(AttentionQ8Test, ChunkAfterPrefix) {
  std::mt19937 rng(22);
  backend::ThreadPool pool(2);
  for (int n_past : {15, 300}) {
    for (int n_q : {1, 7, 60}) {
      const AttentionShape shape = Shape(9, 3, 64);
      PagedQ8 kv(3, 32, 64, n_past + n_q, rng);
      const std::vector<float> q = RandomQ(n_q, 9, 64, rng);
      std::vector<int32_t> kv_end(n_q);
      for (int i = 0; i < n_q; ++i) kv_end[i] = n_past + i + 1;
      CheckKvEnd("chunk n_past=" + std::to_string(n_past) + " n_q=" + std::to_string(n_q), pool, shape, kv, q, kv_end);
    }
  }
}

TEST_P(AttentionQ8Test, Decode) {
  std::mt19937 rng(23);
  for (int threads : {1, 2}) {
    backend::ThreadPool pool(threads);
    for (int d : {8, 16, 32, 64, 96, 128}) {
      for (int g : {1, 3, 8}) {
        for (int n_slots : {1, 65, 100, 700}) {
          const int n_kv_heads = g == 8 ? 1 : 2;
          const AttentionShape shape = Shape(n_kv_heads * g, n_kv_heads, d);
          PagedQ8 kv(n_kv_heads, 32, d, n_slots, rng);
          const std::vector<float> q = RandomQ(1, shape.n_heads, d, rng);
          CheckKvEnd("decode threads=" + std::to_string(threads) + " d=" + std::to_string(d) + " g=" +
                         std::to_string(g) + " n=" + std::to_string(n_slots),
                     pool, shape, kv, q, {n_slots});
        }
      }
    }
  }
}

TEST_P(AttentionQ8Test, ArbitraryKvEndPerQuery) {
  // Linking's explicit KV sets: queries at scattered positions, each its own visible prefix.
  std::mt19937 rng(24);
  backend::ThreadPool pool(2);
  for (int n_q : {1, 3, 40}) {
    const AttentionShape shape = Shape(6, 2, 64);
    PagedQ8 kv(2, 16, 64, 333, rng);
    const std::vector<float> q = RandomQ(n_q, 6, 64, rng);
    std::vector<int32_t> kv_end(n_q);
    for (int i = 0; i < n_q; ++i) kv_end[i] = 1 + static_cast<int32_t>(rng() % 333);
    CheckKvEnd("kv_end n_q=" + std::to_string(n_q), pool, shape, kv, q, kv_end);
  }
}

TEST_P(AttentionQ8Test, IndexList) {
  std::mt19937 rng(25);
  backend::ThreadPool pool(2);
  for (int d : {8, 16, 64, 128}) {
    for (int n_q : {1, 2, 30}) {
      const int n_slots = 500;
      const AttentionShape shape = Shape(6, 2, d);
      PagedQ8 kv(2, 32, d, n_slots, rng);
      std::vector<int32_t> indices;
      for (int s = 0; s < n_slots; ++s)
        if (rng() % 5 == 0 || s < 4) indices.push_back(s);
      const std::vector<float> q = RandomQ(n_q, 6, d, rng);
      std::vector<int32_t> kv_end(n_q, n_slots);
      CheckKvEnd("indices d=" + std::to_string(d) + " n_q=" + std::to_string(n_q), pool, shape, kv, q, kv_end,
                 &indices);
    }
  }
}

TEST_P(AttentionQ8Test, PerHeadLists) {
  std::mt19937 rng(26);
  backend::ThreadPool pool(2);
  const int n_slots = 900, d = 64;
  const AttentionShape shape = Shape(9, 3, d);
  PagedQ8 kv(3, 128, d, n_slots, rng);
  std::vector<std::vector<int32_t>> lists(3);
  for (int h = 0; h < 3; ++h)
    for (int s = 0; s < n_slots; ++s)
      if (rng() % (h + 2) == 0) lists[h].push_back(s);
  std::vector<const int32_t*> ptrs;
  std::vector<int32_t> lens;
  for (const auto& l : lists) {
    ptrs.push_back(l.data());
    lens.push_back(static_cast<int32_t>(l.size()));
  }
  const std::vector<float> q = RandomQ(1, 9, d, rng);
  const int32_t kv_end = n_slots;
  AttendRequest req;
  req.n_q = 1;
  req.kv_end = &kv_end;
  req.head_indices = ptrs.data();
  req.n_head_indices = lens.data();
  Check("per-head lists", pool, shape, kv, req, q, [&](int, int kv_head) { return lists[kv_head]; });
}

// The decode kernels on q8_0 KV, each called directly on one TileJob per KV head: on
// AVX-512 both forms whatever this CPU would pick (with VNNI: the query quantized, scores
// as int8 dot products; without: K widened in registers), on AVX2 its one form. Every
// head_dim the kernels take (16: one scale per row; 32: half a 64-byte piece; 96: a last
// piece of one group; 64, 128), slot counts that end inside a 16-slot group and a
// 64-slot step, blocks of 24 slots (a block edge inside a group), and index lists with
// gaps.
TEST_P(AttentionQ8Test, DecodeKernelForms) {
  struct Form {
    const char* name;
    internal::TileKernel kernel;
    bool q_quantized;
  };
  std::vector<Form> forms;
  if (GetParam() == Isa::kAvx512) {
    forms.push_back({"avx512 no-vnni", internal::Avx512DecodeQ8NoVnni, false});
    if (backend::GetCpuFeatures().avx512_vnni) forms.push_back({"avx512 vnni", internal::Avx512DecodeQ8Vnni, true});
  } else if (GetParam() == Isa::kAvx2) {
    forms.push_back({"avx2", internal::Avx2Kernels().few, internal::Avx2Kernels().few_q8_quantizes_query});
  } else {
    GTEST_SKIP() << "the generic kernels have no decode form";
  }
  std::mt19937 rng(27);
  for (const Form& form : forms) {
    for (int d : {16, 32, 64, 96, 128}) {
      for (int g : {1, 3, 8}) {
        for (int n_slots : {1, 15, 64, 65, 130, 333}) {
          for (bool list : {false, true}) {
            const int n_kv_heads = 2;
            const AttentionShape shape = Shape(n_kv_heads * g, n_kv_heads, d);
            PagedQ8 kv(n_kv_heads, 24, d, n_slots, rng);
            const std::vector<float> q = RandomQ(1, shape.n_heads, d, rng);
            std::vector<int32_t> slots;
            for (int s = 0; s < n_slots; ++s)
              if (!list || s == 0 || rng() % 3 != 0) slots.push_back(s);
            const int32_t n_vis = static_cast<int32_t>(slots.size());
            internal::AttendParams p;
            p.shape = shape;
            p.group = g;
            p.q = q.data();
            p.n_q = 1;
            p.n_vis = &n_vis;
            p.indices = list ? slots.data() : nullptr;
            p.kv = kv.View();
            std::vector<float> out(q.size());
            for (int h = 0; h < n_kv_heads; ++h) {
              internal::TileJob job;
              job.kv_head = h;
              job.n_rows = g;
              job.slot_end = n_vis;
              std::vector<float> o(static_cast<size_t>(g) * d), m(g), l(g);
              form.kernel(p, job, o.data(), m.data(), l.data());
              for (int r = 0; r < g; ++r)
                for (int t = 0; t < d; ++t) out[(static_cast<size_t>(h) * g + r) * d + t] = o[r * d + t] / l[r];
            }
            CheckOutput(std::string(form.name) + " d=" + std::to_string(d) + " g=" + std::to_string(g) +
                            " n=" + std::to_string(n_slots) + (list ? " list" : ""),
                        shape, kv, 1, q, out, form.q_quantized, [&](int, int) { return slots; });
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, AttentionQ8Test, ::testing::Values(Isa::kGeneric, Isa::kAvx2, Isa::kAvx512),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(backend::IsaName(info.param));
                         });

}  // namespace
}  // namespace attic::attention
