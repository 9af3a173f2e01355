// kv_quant_bench: which grouping a 4-bit KV type should use (issue 34, "choose the
// 4-bit grouping by measurement"), measured on a trained model's real K and V.
//
// A measurement, not a shipped KV type: the schemes below exist only in this program.
// For each window of --length tokens of --text (BOS first, as `attic eval perplexity`
// cuts them) the model runs one f32 forward pass whose hooks capture, per layer, the
// queries (rotated), K before and after RoPE, and V. Then, per layer:
//   * K's channel outliers: per (KV head, channel) the largest |k| over the windows'
//     tokens; reported as the largest channel's over the median channel's (pre- and
//     post-RoPE K, and V for comparison);
//   * per scheme, with the model's own queries, causal attention in float64 with the
//     scheme's round-tripped K (V exact), V (K exact), and both, against exact K and V:
//     relative error of the scores ||S~ - S|| / ||S|| over every (head, query, visible
//     slot); mean total variation of the softmax weights (1/2 sum_j |w~ - w| per query
//     row and head); relative error of the attention output ||O~ - O|| / ||O||.
// And downstream: the window is run again with every layer's K (V f32), and K and V,
// round-tripped through the scheme inside the pass (a LayerHooks view replaces what
// attention reads, kv::Visibility::view), and its next-token distributions compared with
// the f32 pass: perplexity, KL(f32 || scheme), top-1 agreement (eval/metrics.h). A window
// is one prefill step, so each token sees its own per-channel group already quantized with
// the group's later tokens (harsher than decoding, where the group is still the tail).
//
// Schemes (4-bit unless named; scales and minimums stored as f16, as a block type would):
//   q8_0      per token, blocks of 32 along head_dim (per row below 32): the engine's own
//             q8_0 KV (attention::QuantizeKvRowQ8), as a control against eval perplexity
//   q4_0      per token, blocks of 32 along head_dim, symmetric (llama.cpp q4_0:
//             d = signed max / -8, q = clamp(round(x / d) + 8, 0, 15); like Attic's
//             q8_0, x is divided by the stored f16 d, not by the unrounded one)
//   q4_1      per token, blocks of 32 along head_dim, asymmetric (llama.cpp q4_1:
//             d = (max - min) / 15, m = min, q = clamp(round((x - m) / d), 0, 15))
//   kivi-G    K per channel over groups of G consecutive tokens (slot-aligned), asymmetric
//             as q4_1 but along tokens; V per token as q4_1 (KIVI). The tail of a window
//             (length % G tokens) has no full group and stays f32, as KIVI keeps its
//             residual tokens in full precision until a group fills
//   kivi-G+tok  the same, but the tail's K per token as q4_1 (every value in 4 bits)
//   kivi-G+q8   the same, but the tail's K per token as q8_0 (a tail block kept in 8 bits
//               until it fills)
//   kivi-G+q8/vq4_0  kivi-G+q8 with V per token as q4_0 (symmetric: no minimum, 4.5 bits
//               a value instead of 5)
//   hq4_0, hq4_1  q4_0 / q4_1 per token after an orthogonal rotation of each head's row
//             (K and V): x -> H S x / sqrt(head_dim), H the Walsh-Hadamard matrix, S fixed
//             random signs (QuaRot's rotation). A rotation keeps q . k (the query is rotated
//             alike) and P V (the output is rotated back), but spreads an outlier channel's
//             energy over every channel of the head, so one scale per token block fits it.
//             Rows keep a fixed size, as the store's and the compute buffer's rows do.
//   q8_0/vq4_0  K per token as q8_0, V per token as q4_0: both rows of a fixed size
//             (8.5 + 4.5 bits a value at head_dim 32 and up).
//   kivi4     the store's kivi4 entry type itself (store::RoundTripRows):
//             K per channel over groups of store::kKivi4GroupTokens tokens from slot 0,
//             the tail (no whole group) a group of its own, as an entry saved at that
//             point holds it; V per token as q4_0 in the store's groups. Meaningful
//             `pre` (the store keeps K before RoPE).
// K is quantized either after RoPE (`post`: what a compute buffer of the type holds) or
// before it and then rotated (`pre`: what a store entry of the type holds, rotated on
// entry). V is the same in both.
//
// Usage: kv_quant_bench --model DIR [--text FILE] [--length 512] [--windows 4]
//          [--groups 32,128] [--schemes NAME,...] [--threads 2]
//          [--passkey-lengths 256,320,384 [--passkey-trials 16] [--passkey-seed 2] [--haystack DIR]]
//          [--json FILE]
// --passkey-lengths adds the pass-key grid (eval::RunNeedleGrid, retriever-1m's task):
// greedy exact match with every scheme's KV against the f32 control, decoding over KV whose
// per-channel groups form as their tokens arrive.
// --schemes keeps only the named schemes (default: all of them).
// Output: tables on stdout, then one JSON line (also to --json).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "attic/attention/kv_q8.h"
#include "attic/core/file.h"
#include "attic/engine/engine.h"
#include "attic/engine/sampler.h"
#include "attic/eval/metrics.h"
#include "attic/eval/needle.h"
#include "attic/eval/perplexity.h"
#include "attic/kv/layer_hooks.h"
#include "attic/store/entry.h"
#include "attic/tensor/dtype.h"
#include "bench/common/flags.h"
#include "bench/common/format.h"
#include "bench/common/measure.h"
#include "bench/common/output.h"

using namespace attic;
using bench::Fmt;

namespace {

constexpr const char* kProgram = "kv_quant_bench";

float Half(float x) { return F16ToF32(F32ToF16(x)); }

enum class Kind { kNone, kQ8_0, kQ4_0, kQ4_1, kKivi, kStoreKivi4 };

struct Scheme {
  std::string name;
  Kind kind = Kind::kNone;
  int group = 0;           // kivi: tokens per channel group
  enum Tail { kF32, kQ4_1, kQ8_0 } tail = kF32;  // kivi: the tail (no whole group) as f32, q4_1 or q8_0 per token
  Kind v = Kind::kQ4_1;                           // kivi: V per token as q4_1 or q4_0
  bool rotate = false;                            // per-token kinds: rotate each head's row first (hq4_*)
  Kind v_tok = Kind::kNone;                       // per-token kinds: V as this kind instead (q8_0/vq4_0)
};

// Values per block along head_dim: 32, or the whole row below 32.
int RowBlock(int head_dim) { return head_dim < 32 ? head_dim : 32; }

// Per-token 4-bit blocks of `x` [n, width] rows, blocks of b values along a row, in place.
void RoundTripTokens4(Kind kind, float* x, int64_t n_values, int b) {
  for (int64_t at = 0; at < n_values; at += b) {
    float* v = x + at;
    if (kind == Kind::kQ4_0) {
      float amax = 0, max = 0;
      for (int i = 0; i < b; ++i) {
        if (std::fabs(v[i]) > amax) amax = std::fabs(v[i]), max = v[i];
      }
      const float d = Half(max / -8.0f);
      const float id = d != 0 ? 1.0f / d : 0.0f;
      for (int i = 0; i < b; ++i) {
        const float q = std::clamp(std::nearbyint(v[i] * id) + 8.0f, 0.0f, 15.0f);
        v[i] = (q - 8.0f) * d;
      }
    } else {  // q4_1
      float mn = v[0], mx = v[0];
      for (int i = 1; i < b; ++i) mn = std::min(mn, v[i]), mx = std::max(mx, v[i]);
      const float d = Half((mx - mn) / 15.0f);
      const float m = Half(mn);
      const float id = d != 0 ? 1.0f / d : 0.0f;
      for (int i = 0; i < b; ++i) {
        const float q = std::clamp(std::nearbyint((v[i] - m) * id), 0.0f, 15.0f);
        v[i] = q * d + m;
      }
    }
  }
}

// Per-channel asymmetric 4-bit over groups of g tokens: x [n, width]; tokens past the last
// whole group stay as they are (the caller may quantize them otherwise).
void RoundTripChannels4(float* x, int n, int width, int g) {
  for (int t0 = 0; t0 + g <= n; t0 += g) {
    for (int c = 0; c < width; ++c) {
      float mn = x[static_cast<int64_t>(t0) * width + c], mx = mn;
      for (int t = t0; t < t0 + g; ++t) {
        const float v = x[static_cast<int64_t>(t) * width + c];
        mn = std::min(mn, v), mx = std::max(mx, v);
      }
      const float d = Half((mx - mn) / 15.0f);
      const float m = Half(mn);
      const float id = d != 0 ? 1.0f / d : 0.0f;
      for (int t = t0; t < t0 + g; ++t) {
        float& v = x[static_cast<int64_t>(t) * width + c];
        v = std::clamp(std::nearbyint((v - m) * id), 0.0f, 15.0f) * d + m;
      }
    }
  }
}

// The fixed signs S of the rotation: one per channel of a head, from a fixed seed.
float RotationSign(int i) {
  uint64_t z = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return ((z ^ (z >> 31)) & 1) != 0 ? -1.0f : 1.0f;
}

// In-place unnormalized Walsh-Hadamard transform of d values (d a power of two), in double.
void Hadamard(double* x, int d) {
  for (int h = 1; h < d; h *= 2)
    for (int i = 0; i < d; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b, x[j + h] = a - b;
      }
}

// Each head_dim row of x rotated (inverse = false: H S x / sqrt(d)) or rotated back
// (S H y / sqrt(d)); the matrix is orthogonal, so the pair is the identity up to rounding.
void RotateRows(float* x, int64_t n_values, int head_dim, bool inverse) {
  ATTIC_CHECK((head_dim & (head_dim - 1)) == 0);
  const double norm = 1.0 / std::sqrt(static_cast<double>(head_dim));
  std::vector<double> t(static_cast<size_t>(head_dim));
  for (int64_t at = 0; at < n_values; at += head_dim) {
    for (int i = 0; i < head_dim; ++i) t[i] = x[at + i] * (inverse ? 1.0 : RotationSign(i));
    Hadamard(t.data(), head_dim);
    for (int i = 0; i < head_dim; ++i)
      x[at + i] = static_cast<float>(t[i] * norm * (inverse ? RotationSign(i) : 1.0));
  }
}

// `x` [n, n_kv_heads * head_dim] (K or V of one layer) round-tripped through the scheme.
void RoundTrip(const Scheme& s, bool is_key, std::vector<float>* x, int n, int kv_dim, int head_dim) {
  const int64_t n_values = static_cast<int64_t>(n) * kv_dim;
  if (!is_key && s.v_tok != Kind::kNone) {
    RoundTrip(Scheme{"", s.v_tok, 0}, false, x, n, kv_dim, head_dim);
    return;
  }
  if (s.rotate) {
    Scheme inner = s;
    inner.rotate = false;
    RotateRows(x->data(), n_values, head_dim, false);
    RoundTrip(inner, is_key, x, n, kv_dim, head_dim);
    RotateRows(x->data(), n_values, head_dim, true);
    return;
  }
  switch (s.kind) {
    case Kind::kNone: return;
    case Kind::kQ8_0: {
      std::vector<int8_t> q(static_cast<size_t>(head_dim));
      std::vector<uint16_t> sc(static_cast<size_t>(head_dim / attention::KvQ8Group(head_dim)));
      for (int64_t at = 0; at < n_values; at += head_dim) {
        attention::QuantizeKvRowQ8(x->data() + at, head_dim, q.data(), sc.data());
        attention::DequantizeKvRowQ8(q.data(), sc.data(), head_dim, x->data() + at);
      }
      return;
    }
    case Kind::kQ4_0:
    case Kind::kQ4_1: RoundTripTokens4(s.kind, x->data(), n_values, RowBlock(head_dim)); return;
    case Kind::kStoreKivi4:
      store::RoundTripRows(store::KvDtype::kKivi4, !is_key, n, kv_dim, attention::KvQ8Group(head_dim), x->data());
      return;
    case Kind::kKivi:
      if (is_key) {
        RoundTripChannels4(x->data(), n, kv_dim, s.group);
        const int whole = n / s.group * s.group;
        if (s.tail != Scheme::kF32 && whole < n) {
          std::vector<float> tail(x->begin() + static_cast<std::ptrdiff_t>(whole) * kv_dim, x->end());
          RoundTrip(Scheme{"", s.tail == Scheme::kQ4_1 ? Kind::kQ4_1 : Kind::kQ8_0, 0}, true, &tail, n - whole, kv_dim,
                    head_dim);
          std::copy(tail.begin(), tail.end(), x->begin() + static_cast<std::ptrdiff_t>(whole) * kv_dim);
        }
      } else {
        RoundTripTokens4(s.v, x->data(), n_values, RowBlock(head_dim));
      }
      return;
  }
}

// One window's f32 pass: per layer the queries (rotated) [n, n_heads * head_dim], K pre-
// and post-RoPE and V [n, kv_dim], and the positions.
struct Capture : kv::LayerHooks {
  explicit Capture(int n_layers) : q(n_layers), k_pre(n_layers), k(n_layers), v(n_layers) {}
  void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kvs) override {
    const size_t n = static_cast<size_t>(rows.n_rows) * kv_dim;
    k_pre[layer].assign(kvs.k_pre_rope, kvs.k_pre_rope + n);
    k[layer].assign(kvs.k, kvs.k + n);
    v[layer].assign(kvs.v, kvs.v + n);
    positions.assign(rows.positions, rows.positions + rows.n_rows);
  }
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    q[layer].assign(vis->q, vis->q + static_cast<size_t>(rows.n_rows) * q_dim);
  }
  size_t kv_dim = 0, q_dim = 0;
  std::vector<std::vector<float>> q, k_pre, k, v;
  std::vector<int32_t> positions;
};

// K and V of every layer round-tripped through a scheme, inside the pass: attention reads
// them from this hook's one-block f32 view instead of the compute buffer. One sequence,
// appended from slot 0 in any number of steps (a prefill, then decode steps): each step
// round-trips every row so far from its exact K and V, so that per-channel groups form as
// their tokens arrive (the tail, no whole group yet, as the scheme's tail rule says) --
// what a decode over a 4-bit cache with an 8-bit tail block would read.
struct RoundTripHooks : kv::LayerHooks {
  RoundTripHooks(const Scheme& s, bool pre_rope, bool quantize_v, const attention::RopeTable& rope, int n_layers,
                 int n_kv_heads, int head_dim)
      : scheme(s), pre(pre_rope), with_v(quantize_v), rope(rope), n_kv_heads(n_kv_heads), head_dim(head_dim),
        raw_k(n_layers), raw_v(n_layers) {}
  void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kvs) override {
    const size_t kv_dim = static_cast<size_t>(n_kv_heads) * head_dim;
    const size_t n = static_cast<size_t>(rows.n_rows) * kv_dim;
    // Appended in slot order: the rows continue the sequence.
    ATTIC_CHECK(rows.slots[0] * kv_dim == raw_k[layer].size());
    const float* k = pre ? kvs.k_pre_rope : kvs.k;
    raw_k[layer].insert(raw_k[layer].end(), k, k + n);
    raw_v[layer].insert(raw_v[layer].end(), kvs.v, kvs.v + n);
    if (layer == 0) positions.insert(positions.end(), rows.positions, rows.positions + rows.n_rows);
  }
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    const int kv_dim = n_kv_heads * head_dim;
    const int n = vis->n_slots;
    ATTIC_CHECK(static_cast<size_t>(n) * kv_dim == raw_k[layer].size());
    std::vector<float> k = raw_k[layer], v = raw_v[layer];
    RoundTrip(scheme, true, &k, n, kv_dim, head_dim);
    if (with_v) RoundTrip(scheme, false, &v, n, kv_dim, head_dim);
    if (pre) rope.Apply(k.data(), n, n_kv_heads, positions.data());
    // The compute buffer's block layout, one block of n slots: [n_kv_heads][n][head_dim].
    kb.assign(static_cast<size_t>(n) * kv_dim, 0.0f);
    vb.assign(kb.size(), 0.0f);
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < n_kv_heads; ++h) {
        const size_t src = (static_cast<size_t>(t) * n_kv_heads + h) * head_dim;
        const size_t dst = (static_cast<size_t>(h) * n + t) * head_dim;
        std::copy(k.begin() + src, k.begin() + src + head_dim, kb.begin() + dst);
        std::copy(v.begin() + src, v.begin() + src + head_dim, vb.begin() + dst);
      }
    }
    view = attention::KvLayerView{};
    view.k_pool = kb.data();
    view.v_pool = vb.data();
    view.block_stride = static_cast<int64_t>(kb.size());
    view.v_block_stride = view.block_stride;
    view.block_size = n;
    view.block_table = &block0;
    view.n_slots = n;
    vis->view = &view;
    vis->kv = &view;
  }
  Scheme scheme;
  bool pre, with_v;
  const attention::RopeTable& rope;
  int n_kv_heads, head_dim;
  std::vector<std::vector<float>> raw_k, raw_v;  // [layer]: every row so far, exact (K pre- or post-RoPE)
  std::vector<int32_t> positions;
  std::vector<float> kb, vb;
  attention::KvLayerView view;
  int32_t block0 = 0;
};

// Greedy decoding with a scheme's KV (RoundTripHooks), for the pass-key grid
// (eval::RunNeedleGrid): the prompt in one step, then one token a step.
class SchemeMethod : public eval::Method {
 public:
  SchemeMethod(engine::Engine& e, Scheme s, bool pre) : e_(e), scheme_(std::move(s)), pre_(pre) {}
  std::string name() const override {
    return scheme_.kind == Kind::kNone ? "f32" : scheme_.name + (pre_ ? "/pre" : "/post");
  }
  Status Score(const std::vector<int32_t>&, int, std::vector<float>*) override {
    return UnimplementedError("only Greedy");
  }
  StatusOr<std::vector<int32_t>> Greedy(const std::vector<int32_t>& prompt, int max_new) override {
    const auto& c = e_.model().config();
    if (prompt.size() > static_cast<size_t>(e_.transformer().max_batch_tokens()))
      return OutOfRangeError("a prompt longer than --length");
    ATTIC_RETURN_IF_ERROR(eval::CheckFits(e_, prompt.size() + static_cast<size_t>(max_new)));
    RoundTripHooks hooks(scheme_, pre_, true, e_.transformer().rope(), c.n_layers, c.n_kv_heads, c.head_dim);
    kv::SequenceKv seq(&e_.kv_pool());
    std::vector<float> logits;
    auto step = [&](const int32_t* t, size_t n) {
      std::vector<engine::BatchEntry> batch(1);
      batch[0].seq = &seq;
      batch[0].tokens.assign(t, t + n);
      return e_.transformer().Forward(batch, &logits, &hooks);
    };
    ATTIC_RETURN_IF_ERROR(step(prompt.data(), prompt.size()));
    std::vector<int32_t> out;
    const auto& stops = e_.stop_token_ids();
    for (int i = 0; i < max_new; ++i) {
      const int32_t tok = engine::Argmax(logits.data(), c.vocab_size);
      if (std::find(stops.begin(), stops.end(), tok) != stops.end()) break;
      out.push_back(tok);
      if (i + 1 == max_new) break;
      ATTIC_RETURN_IF_ERROR(step(&tok, 1));
    }
    return out;
  }

 private:
  engine::Engine& e_;
  Scheme scheme_;
  bool pre_;
};

// Sums of one (layer, scheme, K placement)'s attention errors over windows.
struct AttnErr {
  double s_num = 0, s_den = 0;  // scores
  double tv = 0;                // softmax total variation, summed over (row, head)
  int64_t rows = 0;
  double ok_num = 0, ov_num = 0, okv_num = 0, o_den = 0;  // outputs: K only, V only, both
};

// Causal attention of one layer in float64: queries q [n, H, D]; K, V [n, KVH, D].
// Accumulates the errors of (kq, vq) against (k, v) into e.
void AttentionErrors(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                     const std::vector<float>& kq, const std::vector<float>& vq, int n, int n_heads, int n_kv_heads,
                     int head_dim, AttnErr* e) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const int group = n_heads / n_kv_heads;
  std::vector<double> s(static_cast<size_t>(n)), sq(static_cast<size_t>(n));
  std::vector<double> o(head_dim), ok(head_dim), ov(head_dim), okv(head_dim);
  for (int h = 0; h < n_heads; ++h) {
    const int kh = h / group;
    for (int i = 0; i < n; ++i) {
      const float* qi = q.data() + (static_cast<size_t>(i) * n_heads + h) * head_dim;
      double mx = -std::numeric_limits<double>::infinity(), mxq = mx;
      for (int j = 0; j <= i; ++j) {
        const size_t at = (static_cast<size_t>(j) * n_kv_heads + kh) * head_dim;
        double a = 0, b = 0;
        for (int d = 0; d < head_dim; ++d) a += double{qi[d]} * k[at + d], b += double{qi[d]} * kq[at + d];
        s[j] = a * scale, sq[j] = b * scale;
        e->s_num += (sq[j] - s[j]) * (sq[j] - s[j]);
        e->s_den += s[j] * s[j];
        mx = std::max(mx, s[j]), mxq = std::max(mxq, sq[j]);
      }
      double z = 0, zq = 0;
      for (int j = 0; j <= i; ++j) s[j] = std::exp(s[j] - mx), z += s[j], sq[j] = std::exp(sq[j] - mxq), zq += sq[j];
      std::fill(o.begin(), o.end(), 0.0), std::fill(ok.begin(), ok.end(), 0.0);
      std::fill(ov.begin(), ov.end(), 0.0), std::fill(okv.begin(), okv.end(), 0.0);
      double tv = 0;
      for (int j = 0; j <= i; ++j) {
        const double w = s[j] / z, wq = sq[j] / zq;
        tv += std::fabs(wq - w);
        const size_t at = (static_cast<size_t>(j) * n_kv_heads + kh) * head_dim;
        for (int d = 0; d < head_dim; ++d) {
          o[d] += w * v[at + d], ok[d] += wq * v[at + d];
          ov[d] += w * vq[at + d], okv[d] += wq * vq[at + d];
        }
      }
      e->tv += tv / 2;
      ++e->rows;
      for (int d = 0; d < head_dim; ++d) {
        e->ok_num += (ok[d] - o[d]) * (ok[d] - o[d]);
        e->ov_num += (ov[d] - o[d]) * (ov[d] - o[d]);
        e->okv_num += (okv[d] - o[d]) * (okv[d] - o[d]);
        e->o_den += o[d] * o[d];
      }
    }
  }
}

// Largest |x| per column of x [n, width], folded into `acc`.
void ColumnMax(const std::vector<float>& x, int width, std::vector<double>* acc) {
  acc->resize(static_cast<size_t>(width), 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    double& a = (*acc)[i % static_cast<size_t>(width)];
    a = std::max(a, static_cast<double>(std::fabs(x[i])));
  }
}

// Largest over median of the per-channel maxima.
double OutlierRatio(std::vector<double> m) {
  const double mx = *std::max_element(m.begin(), m.end());
  std::nth_element(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(m.size() / 2), m.end());
  const double med = m[m.size() / 2];
  return med > 0 ? mx / med : std::numeric_limits<double>::infinity();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, text, json_out, groups_text = "32,128", passkey_lengths_text, haystack, schemes_text;
  int length = 512, windows = 4, threads = 2, passkey_trials = 16, passkey_seed = 2;
  bench::FlagParser flags(kProgram,
                          "--model DIR [--text FILE] [--length 512] [--windows 4] [--groups 32,128] "
                          "[--schemes NAME,...] [--threads 2] [--passkey-lengths 256,320,384 [--passkey-trials 16] "
                          "[--passkey-seed 2] [--haystack DIR]] "
                          "[--json FILE]");
  flags.String("--model", &model);
  flags.String("--text", &text);
  flags.Int("--length", &length);
  flags.Int("--windows", &windows);
  flags.String("--groups", &groups_text);
  flags.String("--schemes", &schemes_text);
  flags.Int("--threads", &threads);
  flags.String("--json", &json_out);
  flags.String("--passkey-lengths", &passkey_lengths_text);
  flags.Int("--passkey-trials", &passkey_trials);
  flags.Int("--passkey-seed", &passkey_seed);
  flags.String("--haystack", &haystack);
  flags.ParseOrExit(argc, argv);
  if (model.empty()) flags.UsageError("--model is required");
  if (text.empty()) text = bench::SharedDir() + "/datasets/tinystories_valid_sample/TinyStories-valid-sample.txt";
  if (length < 8 || windows < 1) flags.UsageError("--length must be at least 8 and --windows at least 1");
  auto groups = bench::ParseIntList(groups_text, 2);
  if (!groups.ok()) flags.UsageError("--groups: " + groups.status().message());
  std::vector<int> passkey_lengths;
  if (!passkey_lengths_text.empty()) {
    auto pl = bench::ParseIntList(passkey_lengths_text, 16);
    if (!pl.ok()) flags.UsageError("--passkey-lengths: " + pl.status().message());
    passkey_lengths = *pl;
    if (passkey_trials < 1) flags.UsageError("--passkey-trials must be at least 1");
  }
  if (haystack.empty()) haystack = bench::SharedDir() + "/datasets/paul_graham_essays";
  bench::CheckOutput(kProgram, json_out);
  const int longest = passkey_lengths.empty() ? length
                                              : std::max(length, *std::max_element(passkey_lengths.begin(),
                                                                                   passkey_lengths.end()));

  engine::EngineOptions eo;
  eo.model_path = model;
  eo.n_threads = threads;
  eo.context_length = longest + eval::kMaxAnswerTokens;
  eo.max_batch_tokens = longest;  // a window, or a pass-key prompt, is one step: every hook sees all its rows
  auto eng = engine::Engine::Load(eo);
  bench::DieOnError(kProgram, eng.status());
  engine::Engine& e = **eng;
  const auto& cfg = e.model().config();
  const int n_layers = cfg.n_layers, n_heads = cfg.n_heads, n_kv_heads = cfg.n_kv_heads, head_dim = cfg.head_dim;
  const int kv_dim = n_kv_heads * head_dim, vocab = cfg.vocab_size;
  auto body = ReadFileToString(text);
  bench::DieOnError(kProgram, body.status());
  auto tokens = e.Tokenize(*body, false);
  bench::DieOnError(kProgram, tokens.status());
  const int32_t bos = e.tokenizer().add_bos() ? e.tokenizer().bos_id() : -1;
  const auto wins = eval::MakeWindows(*tokens, bos, length, windows);
  if (wins.empty()) bench::DieOnError(kProgram, InvalidArgumentError(text + ": not one window of " + std::to_string(length)));

  std::vector<Scheme> schemes = {{"q8_0", Kind::kQ8_0, 0}, {"q4_0", Kind::kQ4_0, 0}, {"q4_1", Kind::kQ4_1, 0}};
  for (int g : *groups) {
    schemes.push_back({"kivi-" + std::to_string(g), Kind::kKivi, g, Scheme::kF32});
    schemes.push_back({"kivi-" + std::to_string(g) + "+q8", Kind::kKivi, g, Scheme::kQ8_0});
    schemes.push_back({"kivi-" + std::to_string(g) + "+tok", Kind::kKivi, g, Scheme::kQ4_1});
    schemes.push_back({"kivi-" + std::to_string(g) + "+q8/vq4_0", Kind::kKivi, g, Scheme::kQ8_0, Kind::kQ4_0});
  }
  schemes.push_back({"hq4_0", Kind::kQ4_0, 0, Scheme::kF32, Kind::kQ4_1, true});
  schemes.push_back({"hq4_1", Kind::kQ4_1, 0, Scheme::kF32, Kind::kQ4_1, true});
  schemes.push_back({"q8_0/vq4_0", Kind::kQ8_0, 0, Scheme::kF32, Kind::kQ4_1, false, Kind::kQ4_0});
  schemes.push_back({"kivi4", Kind::kStoreKivi4, store::kKivi4GroupTokens});
  if (!schemes_text.empty()) {
    std::vector<Scheme> kept;
    for (const std::string& name : bench::SplitList(schemes_text)) {
      auto it = std::find_if(schemes.begin(), schemes.end(), [&](const Scheme& sc) { return sc.name == name; });
      if (it == schemes.end()) flags.UsageError("--schemes: no scheme named '" + name + "'");
      kept.push_back(*it);
    }
    schemes = kept;
  }
  const char* placements[2] = {"post", "pre"};
  const size_t n_s = schemes.size();

  std::fprintf(stderr, "%s: %s: %d layers, %d q / %d KV heads of %d; %zu windows of %d tokens of %s\n", kProgram,
               model.c_str(), n_layers, n_heads, n_kv_heads, head_dim, wins.size(), length, text.c_str());
  // [layer][scheme][placement]
  std::vector<std::vector<std::vector<AttnErr>>> err(
      static_cast<size_t>(n_layers), std::vector<std::vector<AttnErr>>(n_s, std::vector<AttnErr>(2)));
  std::vector<std::vector<double>> colmax_pre(n_layers), colmax_post(n_layers), colmax_v(n_layers);
  // Downstream: [0] the f32 pass read through a hook's view (the control), then
  // [scheme][placement][V f32, V quantized] at 1 + 4 s + 2 placement + v.
  std::vector<eval::ScoreAccumulator> ds(1 + 4 * n_s);
  eval::ScoreAccumulator ref_acc;
  const auto& rope = e.transformer().rope();

  auto run = [&](const std::vector<int32_t>& w, kv::LayerHooks* hooks, std::vector<float>* logits) {
    kv::SequenceKv seq(&e.kv_pool());
    std::vector<engine::BatchEntry> batch(1);
    batch[0].seq = &seq;
    batch[0].tokens.assign(w.begin(), w.end() - 1);  // the last token predicts nothing scored
    batch[0].all_logits = true;
    bench::DieOnError(kProgram, e.transformer().Forward(batch, logits, hooks));
  };
  for (size_t wi = 0; wi < wins.size(); ++wi) {
    const auto& w = wins[wi];
    const int n = static_cast<int>(w.size()) - 1;
    Capture cap(n_layers);
    cap.kv_dim = static_cast<size_t>(kv_dim);
    cap.q_dim = static_cast<size_t>(n_heads) * head_dim;
    std::vector<float> ref;
    run(w, &cap, &ref);
    ref_acc.BeginWindow();
    for (int i = 0; i < n; ++i) {
      const float* p = ref.data() + static_cast<size_t>(i) * vocab;
      ref_acc.Add(eval::NegLogLikelihood(p, vocab, w[static_cast<size_t>(i) + 1]), 0, true);
    }
    for (int l = 0; l < n_layers; ++l) {
      ColumnMax(cap.k_pre[l], kv_dim, &colmax_pre[l]);
      ColumnMax(cap.k[l], kv_dim, &colmax_post[l]);
      ColumnMax(cap.v[l], kv_dim, &colmax_v[l]);
      for (size_t s = 0; s < n_s; ++s) {
        std::vector<float> vq = cap.v[l];
        RoundTrip(schemes[s], false, &vq, n, kv_dim, head_dim);
        for (int pl = 0; pl < 2; ++pl) {
          std::vector<float> kq = pl == 0 ? cap.k[l] : cap.k_pre[l];
          RoundTrip(schemes[s], true, &kq, n, kv_dim, head_dim);
          if (pl == 1) rope.Apply(kq.data(), n, n_kv_heads, cap.positions.data());
          AttentionErrors(cap.q[l], cap.k[l], cap.v[l], kq, vq, n, n_heads, n_kv_heads, head_dim, &err[l][s][pl]);
        }
      }
    }
    for (size_t d = 0; d < ds.size(); ++d) {
      const Scheme sc = d == 0 ? Scheme{"f32", Kind::kNone, 0} : schemes[(d - 1) / 4];
      RoundTripHooks hooks(sc, d > 0 && (d - 1) / 2 % 2 == 1, d > 0 && (d - 1) % 2 == 1, rope, n_layers, n_kv_heads,
                           head_dim);
      std::vector<float> got;
      run(w, &hooks, &got);
      ds[d].BeginWindow();
      for (int i = 0; i < n; ++i) {
        const float* p = ref.data() + static_cast<size_t>(i) * vocab;
        const float* q = got.data() + static_cast<size_t>(i) * vocab;
        ds[d].Add(eval::NegLogLikelihood(q, vocab, w[static_cast<size_t>(i) + 1]), eval::KlDivergence(p, q, vocab),
                  engine::Argmax(p, vocab) == engine::Argmax(q, vocab));
      }
    }
    std::fprintf(stderr, "%s: window %zu of %zu done\n", kProgram, wi + 1, wins.size());
  }

  // Output.
  nlohmann::json js;
  js["program"] = kProgram;
  js["model"] = model;
  js["text"] = text;
  js["length"] = length;
  js["windows"] = wins.size();
  js["cpu"] = bench::CpuName();
  js["shape"] = {{"n_layers", n_layers}, {"n_heads", n_heads}, {"n_kv_heads", n_kv_heads}, {"head_dim", head_dim}};
  std::string out = Fmt("# %s: %s (%d layers, %d q / %d KV heads, head_dim %d), %zu windows of %d tokens of %s; CPU %s\n\n",
                        kProgram, model.c_str(), n_layers, n_heads, n_kv_heads, head_dim, wins.size(), length,
                        text.c_str(), bench::CpuName().c_str());
  out += "K channel outliers: per (KV head, channel) the largest |x| over the tokens; largest channel / median channel\n\n";
  out += bench::TableHeader({"layer", "K pre-RoPE", "K post-RoPE", "V"});
  nlohmann::json outl = nlohmann::json::array();
  for (int l = 0; l < n_layers; ++l) {
    const double a = OutlierRatio(colmax_pre[l]), b = OutlierRatio(colmax_post[l]), c = OutlierRatio(colmax_v[l]);
    out += bench::TableRow({std::to_string(l), Fmt("%.2f", a), Fmt("%.2f", b), Fmt("%.2f", c)});
    outl.push_back({{"layer", l}, {"k_pre_rope_max_over_median", a}, {"k_post_rope_max_over_median", b},
                    {"v_max_over_median", c}});
  }
  js["channel_outliers"] = outl;
  out += "\nAttention errors per layer (float64 attention with the model's queries; K placement: post = "
         "quantized after RoPE, pre = before it, then rotated)\n\n";
  out += Fmt("K tokens left f32 (a window's %d rows past the last whole group):", length - 1);
  for (const Scheme& sc : schemes) {
    if (sc.kind == Kind::kKivi && sc.tail == Scheme::kF32)
      out += Fmt(" %s %.1f%%", sc.name.c_str(), 100.0 * ((length - 1) % sc.group) / (length - 1));
  }
  out += "\n\n";
  out += bench::TableHeader({"layer", "scheme", "K", "score rel. err", "softmax TV", "out rel. err (K)",
                             "out rel. err (V)", "out rel. err (K+V)"});
  nlohmann::json attn = nlohmann::json::array();
  std::vector<std::vector<AttnErr>> total(n_s, std::vector<AttnErr>(2));
  for (int l = 0; l <= n_layers; ++l) {  // l == n_layers: all layers pooled
    for (size_t s = 0; s < n_s; ++s) {
      for (int pl = 0; pl < 2; ++pl) {
        AttnErr a;
        if (l < n_layers) {
          a = err[l][s][pl];
          AttnErr& t = total[s][pl];
          t.s_num += a.s_num, t.s_den += a.s_den, t.tv += a.tv, t.rows += a.rows;
          t.ok_num += a.ok_num, t.ov_num += a.ov_num, t.okv_num += a.okv_num, t.o_den += a.o_den;
        } else {
          a = total[s][pl];
        }
        const double se = std::sqrt(a.s_num / a.s_den), tv = a.tv / static_cast<double>(a.rows);
        const double ek = std::sqrt(a.ok_num / a.o_den), ev = std::sqrt(a.ov_num / a.o_den),
                     ekv = std::sqrt(a.okv_num / a.o_den);
        const std::string layer = l < n_layers ? std::to_string(l) : "all";
        out += bench::TableRow({layer, schemes[s].name, placements[pl], Fmt("%.4f", se), Fmt("%.4f", tv),
                                Fmt("%.4f", ek), Fmt("%.4f", ev), Fmt("%.4f", ekv)});
        attn.push_back({{"layer", layer}, {"scheme", schemes[s].name}, {"k_placement", placements[pl]},
                        {"score_rel_err", se}, {"softmax_tv", tv}, {"out_rel_err_k", ek}, {"out_rel_err_v", ev},
                        {"out_rel_err_kv", ekv}});
      }
    }
  }
  js["attention"] = attn;
  out += Fmt("\nDownstream: every layer's K and V round-tripped inside the pass; %lld tokens scored; f32 "
             "perplexity %.4f\n\n",
             static_cast<long long>(ref_acc.n_tokens()), ref_acc.perplexity());
  out += bench::TableHeader({"scheme", "K", "V", "perplexity", "vs f32", "KL(f32 || scheme)", "top-1 vs f32"});
  nlohmann::json down = nlohmann::json::array();
  for (size_t d = 0; d < ds.size(); ++d) {
    const std::string name = d == 0 ? "f32 (through the view)" : schemes[(d - 1) / 4].name;
    const std::string pl = d == 0 ? "-" : placements[(d - 1) / 2 % 2];
    const bool v_quantized = d > 0 && (d - 1) % 2 == 1;
    const double ppl = ds[d].perplexity(), pct = 100 * (ppl / ref_acc.perplexity() - 1);
    out += bench::TableRow({name, pl, v_quantized ? "quantized" : "f32", Fmt("%.4f", ppl), Fmt("%+.3f%%", pct),
                            Fmt("%.3g", ds[d].mean_kl()), Fmt("%.4f", ds[d].top1_agreement())});
    down.push_back({{"scheme", d == 0 ? "f32" : name}, {"k_placement", pl}, {"v_quantized", v_quantized},
                    {"perplexity", ppl},
                    {"perplexity_vs_f32_pct", pct}, {"kl_mean", ds[d].mean_kl()}, {"kl_max", ds[d].max_kl()},
                    {"top1_agreement", ds[d].top1_agreement()}});
  }
  if (!passkey_lengths.empty()) {
    // Pass keys (retriever-1m's task): greedy exact match with each scheme's KV, prefill
    // and decode, against the same prompts through the f32 view.
    auto hay = eval::LoadHaystack(haystack);
    bench::DieOnError(kProgram, hay.status());
    std::vector<std::unique_ptr<SchemeMethod>> owned;
    owned.push_back(std::make_unique<SchemeMethod>(e, Scheme{"f32", Kind::kNone, 0}, false));
    for (const Scheme& sc : schemes)
      for (bool pre : {false, true}) owned.push_back(std::make_unique<SchemeMethod>(e, sc, pre));
    std::vector<eval::Method*> methods;
    for (auto& m : owned) methods.push_back(m.get());
    eval::NeedleOptions no;
    no.lengths = passkey_lengths;
    no.kinds = {eval::NeedleKind::kPassKey};
    no.trials = passkey_trials;
    no.seed = static_cast<uint64_t>(passkey_seed);
    auto grid = eval::RunNeedleGrid(methods, e.tokenizer(), *hay, no, [](const std::string& line) {
      std::fprintf(stderr, "%s: pass keys: %s\n", kProgram, line.c_str());
    });
    bench::DieOnError(kProgram, grid.status());
    // Outputs of the f32 control, by (length, depth, trial).
    std::map<std::tuple<int, double, int>, std::string> control;
    for (const auto& t : grid->trials)
      if (t.method == "f32") control[{t.length, t.depth, t.trial}] = t.output;
    out += Fmt("\nPass keys: greedy exact match, %zu prompts per method (lengths %s, %d trials per length and depth, "
               "seed %d, haystack %s); prefill then decode with the scheme's KV (per-channel groups formed as "
               "their tokens arrive)\n\n",
               grid->trials.size() / methods.size(), passkey_lengths_text.c_str(), passkey_trials, passkey_seed,
               haystack.c_str());
    out += bench::TableHeader({"method", "exact match", "vs f32", "outputs unlike f32's"});
    nlohmann::json pk = nlohmann::json::array();
    int f32_correct = 0;
    for (const auto& t : grid->trials) f32_correct += t.method == "f32" && t.correct ? 1 : 0;
    for (eval::Method* m : methods) {
      int n = 0, correct = 0, differ = 0;
      for (const auto& t : grid->trials) {
        if (t.method != m->name()) continue;
        ++n;
        correct += t.correct ? 1 : 0;
        differ += control[{t.length, t.depth, t.trial}] != t.output ? 1 : 0;
      }
      const double rate = static_cast<double>(correct) / n, delta = static_cast<double>(correct - f32_correct) / n;
      out += bench::TableRow({m->name(), Fmt("%d/%d (%.3f)", correct, n, rate), Fmt("%+.3f", delta),
                              Fmt("%d", differ)});
      pk.push_back({{"method", m->name()}, {"prompts", n}, {"correct", correct}, {"exact_match", rate},
                    {"vs_f32", delta}, {"outputs_unlike_f32", differ}});
    }
    js["passkeys"] = {{"lengths", passkey_lengths}, {"trials", passkey_trials}, {"seed", passkey_seed},
                      {"haystack", haystack}, {"methods", pk}};
  }
  js["f32_perplexity"] = ref_acc.perplexity();
  js["scored_tokens"] = ref_acc.n_tokens();
  js["downstream"] = down;
  std::printf("%s\n%s\n", out.c_str(), js.dump().c_str());
  bench::WriteOutput(kProgram, json_out, js.dump(2) + "\n");
  return 0;
}
