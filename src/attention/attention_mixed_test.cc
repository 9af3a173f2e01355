// Attention over a layer whose K and V are stored in different types (KvLayerView: each
// tensor its own pointer, block stride and q8_0 scale offset), every ISA's kernels and
// every pair of f32, f16, q8_0 and q4_0 (and q4_0 for both, which no few-row decode
// kernel reads): causal prefill across blocks, decode, per-query kv_end (linking's
// explicit KV sets), index lists and per-KV-head lists (sparse decoding).
//
// The reference is a float64 softmax over the values the storage holds (f16-rounded, or
// dequantized from q8_0 / q4_0), so only the kernels' own f32 arithmetic separates the
// two: the bound attention_test.cc checks every kernel against, |got - want| <= 1e-5
// (1 + |want|). What a storage type costs against the f32 values is
// attention_q8_test.cc's subject. A view of mixed types runs the general tile kernel,
// which never quantizes the query, except K in q8_0 with V in q4_0, which the AVX-512
// decode kernel reads (KernelSet::few_k8_v4): with VNNI it quantizes the query per 32
// values, and the bound then adds attention_q8_test.cc's term for that,
// (e^{2 deltaq} - 1) max_j |v_jt|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention/attention_internal.h"
#include "attention/attention_test_util.h"
#include "attic/attention/attention.h"
#include "attic/attention/kv_q4.h"
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

// One tensor (K or V) of a paged layer in the block pool's layout for `type`, its blocks
// at the shared block table's shuffled places. Rows that hold no slot are NaN (f32, f16)
// or have NaN scales (q8_0, q4_0), so a read outside the valid slots poisons the result.
struct PagedTensor {
  DType type = DType::kF32;
  int n_kv_heads = 0, block_size = 0, head_dim = 0, n_slots = 0;
  std::vector<float> f32;
  std::vector<uint16_t> f16;
  std::vector<int8_t> q8;  // q8_0 or q4_0: the block's bytes
  std::vector<float> held;  // [n_kv_heads][n_slots][head_dim]: the values the storage holds

  int64_t stride() const { return static_cast<int64_t>(n_kv_heads) * block_size * head_dim; }
  int group() const { return KvQ8Group(head_dim); }
  bool quantized() const { return type == DType::kQ8_0 || type == DType::kQ4_0; }
  // Bytes of a block's values (q8_0: one per value; q4_0: one per two); the scales follow.
  int64_t value_bytes() const { return type == DType::kQ4_0 ? stride() / 2 : stride(); }
  // A block's elements (f32, f16) or bytes (q8_0, q4_0: the values, then their f16 scales).
  int64_t block_stride() const { return quantized() ? value_bytes() + stride() / group() * 2 : stride(); }
  // Row (h, s)'s first element within its block (q8_0, q4_0: its index among the block's values).
  int64_t InBlock(int h, int s) const { return (static_cast<int64_t>(h) * block_size + s % block_size) * head_dim; }
  size_t Row(int h, int s) const { return (static_cast<size_t>(h) * n_slots + s) * head_dim; }

  void Fill(DType t, int n_kv_heads_, int block_size_, int head_dim_, int n_slots_,
            const std::vector<int32_t>& table, int pool_blocks, float outlier, std::mt19937& rng) {
    type = t;
    n_kv_heads = n_kv_heads_;
    block_size = block_size_;
    head_dim = head_dim_;
    n_slots = n_slots_;
    const size_t size = static_cast<size_t>(pool_blocks) * block_stride();
    if (t == DType::kF32) f32.assign(size, std::numeric_limits<float>::quiet_NaN());
    if (t == DType::kF16) f16.assign(size, 0x7E00);  // an f16 NaN
    if (quantized()) {
      q8.assign(size, 0);
      const uint16_t nan = 0x7E00;
      for (int b = 0; b < pool_blocks; ++b) {
        for (int64_t i = 0; i < stride() / group(); ++i) {
          std::memcpy(&q8[b * block_stride() + value_bytes() + 2 * i], &nan, 2);
        }
      }
    }
    held.resize(static_cast<size_t>(n_kv_heads) * n_slots * head_dim);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(head_dim);
    for (int h = 0; h < n_kv_heads; ++h) {
      for (int s = 0; s < n_slots; ++s) {
        for (int i = 0; i < head_dim; ++i) x[i] = u(rng) * (i == 3 ? outlier : 1.0f);  // K: an outlier channel
        const int64_t at = table[s / block_size] * block_stride() + InBlock(h, s);
        float* y = &held[Row(h, s)];
        if (t == DType::kF32) {
          std::copy(x.begin(), x.end(), &f32[at]);
          std::copy(x.begin(), x.end(), y);
        } else if (t == DType::kF16) {
          for (int i = 0; i < head_dim; ++i) {
            f16[at + i] = F32ToF16(x[i]);
            y[i] = F16ToF32(f16[at + i]);
          }
        } else if (t == DType::kQ8_0) {
          auto* scales = reinterpret_cast<uint16_t*>(
              &q8[table[s / block_size] * block_stride() + KvQ8ScaleAt(stride(), InBlock(h, s), head_dim)]);
          QuantizeKvRowQ8(x.data(), head_dim, &q8[at], scales);
          DequantizeKvRowQ8(&q8[at], scales, head_dim, y);
        } else {  // q4_0: half a byte per value
          const int64_t block = table[s / block_size] * block_stride();
          auto* scales = reinterpret_cast<uint16_t*>(&q8[block + KvQ8ScaleAt(value_bytes(), InBlock(h, s), head_dim)]);
          auto* codes = reinterpret_cast<uint8_t*>(&q8[block + InBlock(h, s) / 2]);
          QuantizeKvRowQ4(x.data(), head_dim, codes, scales);
          DequantizeKvRowQ4(codes, scales, head_dim, y);
        }
      }
    }
  }
};

struct MixedKv {
  int block_size, n_slots;
  std::vector<int32_t> block_table;
  PagedTensor k, v;

  MixedKv(DType kt, DType vt, int n_kv_heads, int block_size_, int head_dim, int n_slots_, std::mt19937& rng)
      : block_size(block_size_), n_slots(n_slots_) {
    const int n_blocks = (n_slots + block_size - 1) / block_size;
    const int pool_blocks = n_blocks * 2 + 3;
    std::vector<int32_t> perm(pool_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    block_table.assign(perm.begin(), perm.begin() + n_blocks);
    k.Fill(kt, n_kv_heads, block_size, head_dim, n_slots, block_table, pool_blocks, 4.0f, rng);
    v.Fill(vt, n_kv_heads, block_size, head_dim, n_slots, block_table, pool_blocks, 1.0f, rng);
  }

  KvLayerView View() const {
    KvLayerView view;
    if (k.type == DType::kF32) view.k_pool = k.f32.data();
    if (k.type == DType::kF16) view.k_f16 = k.f16.data();
    if (k.type == DType::kQ8_0) view.k_q8 = k.q8.data();
    if (k.type == DType::kQ4_0) view.k_q4 = reinterpret_cast<const uint8_t*>(k.q8.data());
    if (v.type == DType::kF32) view.v_pool = v.f32.data();
    if (v.type == DType::kF16) view.v_f16 = v.f16.data();
    if (v.type == DType::kQ8_0) view.v_q8 = v.q8.data();
    if (v.type == DType::kQ4_0) view.v_q4 = reinterpret_cast<const uint8_t*>(v.q8.data());
    view.block_stride = k.block_stride();
    view.q8_scales = k.value_bytes();
    view.v_block_stride = v.block_stride();
    view.v_q8_scales = v.value_bytes();
    view.block_size = block_size;
    view.block_table = block_table.data();
    view.n_slots = n_slots;
    return view;
  }
};

// Float64 softmax(q K^T * scale) V for one query head over `slots` (the held values).
// With q_quantized, bound[t] gets the query quantization's share (attention_q8_test.cc,
// ReferenceHead: deltaq_j = scale sum_i (1/2 + 2^-14) dq_i |k_ji|, dq_i the step of the
// query's 32-value group holding i); else 0.
std::vector<double> Reference(const AttentionShape& shape, const float* q, const std::vector<int32_t>& slots,
                              const MixedKv& kv, int kv_head, bool q_quantized, std::vector<double>* bound) {
  const int d = shape.head_dim;
  std::vector<double> out(d, 0.0);
  bound->assign(d, 0.0);
  if (slots.empty()) return out;
  if (q_quantized) {
    std::vector<double> dq(d, 0.0);
    const int group = KvQ8Group(d);
    for (int g0 = 0; g0 < d; g0 += group) {
      double amax = 0;
      for (int t = g0; t < g0 + group; ++t) amax = std::max(amax, std::abs(static_cast<double>(q[t])));
      for (int t = g0; t < g0 + group; ++t) dq[t] = amax / 127;
    }
    double deltaq_max = 0;
    std::vector<double> v_max(d, 0.0);
    for (int32_t slot : slots) {
      const float* kr = &kv.k.held[kv.k.Row(kv_head, slot)];
      const float* vr = &kv.v.held[kv.v.Row(kv_head, slot)];
      double deltaq = 0;
      for (int t = 0; t < d; ++t) {
        deltaq += (0.5 + 0x1p-14) * dq[t] * std::abs(static_cast<double>(kr[t]));
        v_max[t] = std::max(v_max[t], std::abs(static_cast<double>(vr[t])));
      }
      deltaq_max = std::max(deltaq_max, deltaq * shape.scale);
    }
    for (int t = 0; t < d; ++t) (*bound)[t] = std::expm1(2 * deltaq_max) * v_max[t];
  }
  std::vector<double> s(slots.size());
  double mx = -1e300;
  for (size_t j = 0; j < slots.size(); ++j) {
    const float* kr = &kv.k.held[kv.k.Row(kv_head, slots[j])];
    double dot = 0;
    for (int t = 0; t < d; ++t) dot += static_cast<double>(q[t]) * kr[t];
    s[j] = dot * shape.scale;
    mx = std::max(mx, s[j]);
  }
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  for (size_t j = 0; j < slots.size(); ++j) {
    const float* vr = &kv.v.held[kv.v.Row(kv_head, slots[j])];
    for (int t = 0; t < d; ++t) out[t] += s[j] / sum * vr[t];
  }
  return out;
}

// Queries uniform in [-1, 1].
std::vector<float> RandomQ(int n_q, int n_heads, int d, std::mt19937& rng) {
  return testing_util::RandomQ(n_q, n_heads, d, 1.0f, rng);
}

using Param = std::tuple<Isa, std::pair<DType, DType>>;  // ISA, (K's type, V's type)

class AttentionMixedTest : public ::testing::TestWithParam<Param> {
 protected:
  Isa isa() const { return std::get<0>(GetParam()); }
  DType kt() const { return std::get<1>(GetParam()).first; }
  DType vt() const { return std::get<1>(GetParam()).second; }
  void SetUp() override {
    if (const char* why = testing_util::IsaUnavailable(isa())) GTEST_SKIP() << why;
  }

  // Runs the ISA's kernels on `req` and checks every output element; visible(i, kv_head)
  // lists the slots query i's heads of that KV head see.
  template <class Visible>
  void Check(const std::string& what, backend::ThreadPool& pool, const AttentionShape& shape, const MixedKv& kv,
             AttendRequest req, const std::vector<float>& q, Visible visible) {
    std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
    req.q = q.data();
    req.out = out.data();
    req.kv = kv.View();
    internal::AttendBatchIsa(isa(), pool, shape, &req, 1);
    const int d = shape.head_dim, g = shape.n_heads / shape.n_kv_heads;
    // Whether the request ran a few-row kernel that quantizes the query.
    const internal::KernelSet ks = isa() == Isa::kAvx512 ? internal::Avx512Kernels()
                                   : isa() == Isa::kAvx2 ? internal::Avx2Kernels()
                                                         : internal::GenericKernels();
    const bool q_quantized = ks.few_q8_quantizes_query && kt() == DType::kQ8_0 &&
                             internal::UsesFewKernel(ks, true, static_cast<int64_t>(req.n_q) * g, d, kt(), vt());
    double worst = 0;
    std::string at;
    std::vector<double> bound;
    for (int i = 0; i < req.n_q; ++i) {
      for (int h = 0; h < shape.n_heads; ++h) {
        const size_t row = (static_cast<size_t>(i) * shape.n_heads + h) * d;
        const std::vector<double> want = Reference(shape, &q[row], visible(i, h / g), kv, h / g, q_quantized, &bound);
        for (int t = 0; t < d; ++t) {
          // Relative to the allowance 1e-5 (1 + |want|), plus the query's share where quantized.
          const double err = std::abs(out[row + t] - want[t]) / (1.0 + std::abs(want[t]) + 1e5 * bound[t]);
          if (!(err <= worst)) {  // also catches NaN
            worst = std::isnan(err) ? 1e30 : err;
            at = "q " + std::to_string(i) + " head " + std::to_string(h) + " dim " + std::to_string(t) + ": got " +
                 std::to_string(out[row + t]) + " want " + std::to_string(want[t]);
          }
        }
      }
    }
    EXPECT_LE(worst, 1e-5) << what << ": " << at;
  }

  // Queries limited by kv_end (through `indices` when set).
  void CheckKvEnd(const std::string& what, backend::ThreadPool& pool, const AttentionShape& shape, const MixedKv& kv,
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
      for (int s = 0; s < kv_end[i]; ++s) {
        if (indices == nullptr || std::binary_search(indices->begin(), indices->end(), s)) slots.push_back(s);
      }
      return slots;
    });
  }
};

TEST_P(AttentionMixedTest, CausalPrefillAcrossBlocks) {
  backend::ThreadPool pool(2);
  std::mt19937 rng(1);
  for (int d : {8, 64, 128}) {
    const AttentionShape shape = Shape(6, 2, d);
    const MixedKv kv(kt(), vt(), 2, 32, d, 150, rng);
    const int n_q = 40;  // the last 40 slots' queries, after 110 cached ones
    std::vector<int32_t> kv_end(n_q);
    for (int i = 0; i < n_q; ++i) kv_end[i] = 110 + i + 1;
    CheckKvEnd("prefill d=" + std::to_string(d), pool, shape, kv, RandomQ(n_q, 6, d, rng), kv_end);
  }
}

TEST_P(AttentionMixedTest, DecodeOneQuery) {
  for (int threads : {1, 2}) {
    backend::ThreadPool pool(threads);
    std::mt19937 rng(2);
    for (int d : {8, 64, 128}) {
      for (int n_slots : {1, 77, 700}) {  // one slot; a partial block; slots split across threads
        const AttentionShape shape = Shape(8, 2, d);
        const MixedKv kv(kt(), vt(), 2, 64, d, n_slots, rng);
        CheckKvEnd("decode d=" + std::to_string(d) + " slots=" + std::to_string(n_slots) +
                       " threads=" + std::to_string(threads),
                   pool, shape, kv, RandomQ(1, 8, d, rng), {n_slots});
      }
    }
  }
}

TEST_P(AttentionMixedTest, ArbitraryKvEndAndIndexLists) {
  backend::ThreadPool pool(2);
  std::mt19937 rng(3);
  const int d = 64;
  const AttentionShape shape = Shape(4, 4, d);
  const MixedKv kv(kt(), vt(), 4, 16, d, 200, rng);
  // Linking's explicit KV sets: each query sees its own prefix, in any order.
  const std::vector<int32_t> kv_end = {200, 3, 150, 17, 64, 199, 1};
  CheckKvEnd("kv_end", pool, shape, kv, RandomQ(7, 4, d, rng), kv_end);
  // Sparse decoding: an index list (decode and a few rows).
  std::vector<int32_t> indices;
  for (int s = 0; s < 200; s += 1 + s % 5) indices.push_back(s);
  CheckKvEnd("index list, decode", pool, shape, kv, RandomQ(1, 4, d, rng), {200}, &indices);
  CheckKvEnd("index list, rows", pool, shape, kv, RandomQ(5, 4, d, rng), {200, 190, 50, 120, 7}, &indices);
}

TEST_P(AttentionMixedTest, PerKvHeadIndexLists) {
  backend::ThreadPool pool(2);
  std::mt19937 rng(4);
  const int d = 64, n_kv_heads = 3;
  const AttentionShape shape = Shape(6, n_kv_heads, d);
  const MixedKv kv(kt(), vt(), n_kv_heads, 32, d, 300, rng);
  std::vector<std::vector<int32_t>> lists(n_kv_heads);
  for (int h = 0; h < n_kv_heads; ++h) {
    for (int s = h; s < 300; s += 3 + h * 4) lists[h].push_back(s);
  }
  lists[2].clear();  // a head that sees nothing gets zero rows
  std::vector<const int32_t*> heads(n_kv_heads);
  std::vector<int32_t> n_heads(n_kv_heads);
  for (int h = 0; h < n_kv_heads; ++h) {
    heads[h] = lists[h].data();
    n_heads[h] = static_cast<int>(lists[h].size());
  }
  const std::vector<int32_t> kv_end = {300};
  AttendRequest req;
  req.n_q = 1;
  req.kv_end = kv_end.data();
  req.head_indices = heads.data();
  req.n_head_indices = n_heads.data();
  Check("per-head lists", pool, shape, kv, req, RandomQ(1, 6, d, rng), [&](int, int h) { return lists[h]; });
}

// The decode kernels' K8/V4 forms (K in q8_0, V in q4_0), each called directly on one
// TileJob per KV head: AVX-512's whatever this CPU would pick, with VNNI (the query
// quantized, scores as int8 dot products) and without, and AVX2's. Every head_dim they
// take (multiples of 32:
// 32, half a 64-byte piece; 96, a last piece of one group; 64, 128), slot counts that end
// inside a 16-slot group and a 64-slot step, blocks of 24 slots (a block edge inside a
// group), and index lists with gaps.
TEST(AttentionMixedK8V4, DecodeKernelForms) {
  struct Form {
    const char* name;
    internal::TileKernel kernel;
    bool q_quantized;
  };
  std::vector<Form> forms;
  if (testing_util::IsaUnavailable(Isa::kAvx512) == nullptr) {
    forms.push_back({"avx512 no-vnni", internal::Avx512DecodeK8V4NoVnni, false});
    if (backend::GetCpuFeatures().avx512_vnni) forms.push_back({"avx512 vnni", internal::Avx512DecodeK8V4Vnni, true});
  }
  if (testing_util::IsaUnavailable(Isa::kAvx2) == nullptr) {
    ASSERT_TRUE(internal::Avx2Kernels().few_k8_v4);
    forms.push_back({"avx2", internal::Avx2Kernels().few, internal::Avx2Kernels().few_q8_quantizes_query});
  }
  if (forms.empty()) GTEST_SKIP() << "no AVX2: the generic kernels have no decode form";
  std::mt19937 rng(28);
  for (const Form& form : forms) {
    for (int d : {32, 64, 96, 128}) {
      for (int g : {1, 3, 8}) {
        for (int n_slots : {1, 15, 64, 65, 130, 333}) {
          for (bool list : {false, true}) {
            const int n_kv_heads = 2;
            const AttentionShape shape = Shape(n_kv_heads * g, n_kv_heads, d);
            const MixedKv kv(DType::kQ8_0, DType::kQ4_0, n_kv_heads, 24, d, n_slots, rng);
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
            const std::string what = std::string(form.name) + " d=" + std::to_string(d) + " g=" + std::to_string(g) +
                                     " n=" + std::to_string(n_slots) + (list ? " list" : "");
            double worst = 0;
            std::vector<double> bound;
            for (int h = 0; h < n_kv_heads; ++h) {
              internal::TileJob job;
              job.kv_head = h;
              job.n_rows = g;
              job.slot_end = n_vis;
              std::vector<float> o(static_cast<size_t>(g) * d), m(g), l(g);
              form.kernel(p, job, o.data(), m.data(), l.data());
              for (int r = 0; r < g; ++r) {
                const std::vector<double> want =
                    Reference(shape, &q[(static_cast<size_t>(h) * g + r) * d], slots, kv, h, form.q_quantized, &bound);
                for (int t = 0; t < d; ++t) {
                  const double got = o[r * d + t] / l[r];
                  const double err = std::abs(got - want[t]) / (1.0 + std::abs(want[t]) + 1e5 * bound[t]);
                  worst = std::isnan(err) ? 1e30 : std::max(worst, err);
                }
              }
            }
            EXPECT_LE(worst, 1e-5) << what;
          }
        }
      }
    }
  }
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return std::string(backend::IsaName(std::get<0>(info.param))) + "_k_" + DTypeName(std::get<1>(info.param).first) +
         "_v_" + DTypeName(std::get<1>(info.param).second);
}

INSTANTIATE_TEST_SUITE_P(Isas, AttentionMixedTest,
                         ::testing::Combine(::testing::Values(Isa::kAvx512, Isa::kAvx2, Isa::kGeneric),
                                            ::testing::Values(std::pair{DType::kF32, DType::kF16},
                                                              std::pair{DType::kF32, DType::kQ8_0},
                                                              std::pair{DType::kF16, DType::kF32},
                                                              std::pair{DType::kF16, DType::kQ8_0},
                                                              std::pair{DType::kQ8_0, DType::kF32},
                                                              std::pair{DType::kQ8_0, DType::kF16},
                                                              std::pair{DType::kF32, DType::kQ4_0},
                                                              std::pair{DType::kF16, DType::kQ4_0},
                                                              std::pair{DType::kQ8_0, DType::kQ4_0},
                                                              std::pair{DType::kQ4_0, DType::kF16},
                                                              std::pair{DType::kQ4_0, DType::kQ8_0},
                                                              std::pair{DType::kQ4_0, DType::kQ4_0})),
                         ParamName);

}  // namespace
}  // namespace attic::attention
