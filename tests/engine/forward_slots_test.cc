// The forward pass with target slots (BatchEntry::slots) and kv::LayerHooks, against the
// naive float64 reference (tests/engine/tiny_llama.h, written from the HF formulas and
// sharing no code with the engine):
//  * recomputing any subset of slots in place, over correct KV, at their true positions
//    gives the full forward's logits and rewrites their K/V (the slots' KV is corrupted
//    first, so a row that was not recomputed, or saw a corrupted slot, fails);
//  * in-place rows and appended rows in one step; a chunk recomputed at new positions
//    equals the naive forward of the re-positioned sequence;
//  * each hook point: OnKv sees every layer's K (pre- and post-RoPE) and V, before they
//    enter the compute buffer; BeforeAttention's visibility (per-KV-head lists, a shared
//    list, lowered kv_end) equals the naive forward with that mask; AfterLayer's dropped
//    rows leave their slots' later-layer KV as it was (stale values planted there), and
//    the kept rows' logits equal the naive forward that reads those stale values.
// Models: GQA, MHA, Qwen2 q/k/v bias; f32 and bf16 weights; f32 and f16 KV cache (the
// reference then rounds the KV attention reads to f16, as the cache stores it).
// Errors are max |error| / max(1, max |reference|) of a row; tol() derives the bound
// from the arithmetic of the active kernels (ATTIC_ISA), see there.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "attic/backend/convert.h"
#include "attic/backend/kernels.h"
#include "attic/engine/transformer.h"
#include "engine/tiny_llama.h"

namespace attic::engine {
namespace {

using attic::testing::NaiveOptions;
using attic::testing::NaiveRun;
using attic::testing::TempDir;
using attic::testing::TinyModel;
using attic::testing::TinySpec;

struct Variant {
  std::string name;
  TinySpec spec;
  DType kv_dtype = DType::kF32;
  std::optional<DType> kv_dtype_v;  // V's own type (default: kv_dtype's)
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class ForwardSlotsTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    attic::testing::MakeTinyModel(GetParam().spec, dir_, &tm_);
    if (HasFatalFailure()) return;
    tf_ = std::make_unique<Transformer>(*tm_.model, pool_, 64);
    kv::KvShape shape = tf_->kv_shape(4);  // small blocks: runs of slots cross block boundaries
    shape.k_dtype = GetParam().kv_dtype;
    shape.v_dtype = GetParam().kv_dtype_v.value_or(GetParam().kv_dtype);
    kvp_ = std::make_unique<kv::BlockPool>(shape, 96);
    rounding_effect_ = RoundingEffect();
  }

  const model::ModelConfig& cfg() const { return tf_->config(); }
  bool k_f16() const { return GetParam().kv_dtype == DType::kF16; }
  bool v_f16() const { return GetParam().kv_dtype_v.value_or(GetParam().kv_dtype) == DType::kF16; }
  // Whether the kernels round the linear layers' inputs to bf16 (AVX-512 with
  // AVX512-BF16 on bf16 weights); the reference then rounds them too (Options).
  bool rounds_x() const {
    return GetParam().spec.dtype == DType::kBF16 && backend::LinearRoundsBf16Activations();
  }
  // The bound on a row's error (logits, q, and K/V as computed):
  //  * f32 arithmetic (f32 weights, or bf16 weights widened exactly: AVX2, generic):
  //    1e-4 for f32 sums over k <= 96 and three layers; 5e-4 over an f16 KV cache, where
  //    the reference rounds what attention reads to f16 too, but an element within f32
  //    error of an f16 rounding boundary may round the other way (one f16 ulp, 2^-10 of
  //    the element, at the scores and outputs that read it).
  //  * x rounded to bf16 (rounds_x()): the reference rounds the same inputs, so most
  //    rows agree to f32 precision; but an element within f32 error of a bf16 rounding
  //    midpoint may round the other way in the kernel: one bf16 ulp, twice the rounding
  //    error the reference gave that element, carried to every later row that attends
  //    to it. So the bound is the effect the rounding itself has on this model's rows
  //    (rounding_effect_: reference with rounding vs without, measured in SetUp), twice
  //    over, on top of the f32 bound.
  double tol() const {
    const double f32 = k_f16() || v_f16() ? 5e-4 : 1e-4;
    return rounds_x() ? f32 + 2 * rounding_effect_ : f32;
  }
  // K/V read back from an f16 compute buffer are the computed K/V rounded to f16:
  // within 2^-11 of each element (round to nearest) on top of tol(); K and V each by
  // their own type.
  double k_tol() const { return tol() + (k_f16() ? std::ldexp(1.0, -11) : 0.0); }
  double v_tol() const { return tol() + (v_f16() ? std::ldexp(1.0, -11) : 0.0); }
  // The reference's options for this variant's KV cache and kernels.
  NaiveOptions Options(std::vector<int> positions = {}) const {
    NaiveOptions o;
    o.positions = std::move(positions);
    auto f16 = [](double x) { return static_cast<double>(F16ToF32(F32ToF16(static_cast<float>(x)))); };
    if (k_f16()) o.k_round = f16;
    if (v_f16()) o.v_round = f16;
    if (rounds_x()) o.act_round = attic::testing::RoundToBf16;
    return o;
  }
  // Largest row error between the reference with bf16-rounded linear inputs and without,
  // over the logits, q, K and V of a 40-token random sequence (0 when the kernels do not
  // round).
  double RoundingEffect() const {
    if (!rounds_x()) return 0;
    std::mt19937 rng(99);
    const std::vector<int32_t> tokens = RandomTokens(40, rng);
    NaiveOptions plain = Options();
    plain.act_round = nullptr;
    const NaiveRun a = Naive(tokens, Options()), b = Naive(tokens, plain);
    auto row_err = [](const std::vector<double>& x, const std::vector<double>& y) { return RowError(x.data(), y); };
    double e = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      e = std::max(e, row_err(a.logits[t], b.logits[t]));
      for (int l = 0; l < cfg().n_layers; ++l) {
        e = std::max({e, row_err(a.q_rot[l][t], b.q_rot[l][t]), row_err(a.k_rot[l][t], b.k_rot[l][t]),
                      row_err(a.v[l][t], b.v[l][t])});
      }
    }
    return e;
  }
  // Makes `o` model a cache: attention reads `cache`'s K/V for every slot not in
  // `recomputed` (what the compute buffer holds there), and computes the rest.
  static void ReadCacheExcept(const NaiveRun& cache, std::set<int32_t> recomputed, NaiveOptions* o) {
    o->stale_kv = [&cache, recomputed](int l, int j, std::vector<double>* k, std::vector<double>* v) {
      if (recomputed.count(j)) return false;
      *k = cache.k_rot[l][j];
      *v = cache.v[l][j];
      return true;
    };
  }
  NaiveRun Naive(const std::vector<int32_t>& tokens, const NaiveOptions& o) const {
    return attic::testing::NaiveForwardEx(tm_.nc, tm_.nw, std::vector<int>(tokens.begin(), tokens.end()), o);
  }
  std::vector<int32_t> RandomTokens(int n, std::mt19937& rng) const {
    std::uniform_int_distribution<int> u(3, cfg().vocab_size - 1);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = u(rng);
    return t;
  }

  // Appends `tokens` at `positions` in chunks of 16 (the ordinary append path).
  void Prefill(kv::SequenceKv* seq, const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions) {
    for (size_t p = 0; p < tokens.size(); p += 16) {
      const size_t e = std::min(tokens.size(), p + 16);
      std::vector<BatchEntry> b(1);
      b[0].seq = seq;
      b[0].tokens.assign(tokens.begin() + p, tokens.begin() + e);
      b[0].positions.assign(positions.begin() + p, positions.begin() + e);
      std::vector<float> logits;
      ASSERT_TRUE(tf_->Forward(b, &logits).ok());
    }
  }

  // Overwrites slot s's K and V at every layer with large random values (and its recorded
  // token and position), so only a real recomputation restores it.
  void Corrupt(kv::SequenceKv* seq, int32_t s, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> k(cfg().kv_dim()), v(cfg().kv_dim());
    for (int l = 0; l < cfg().n_layers; ++l) {
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      seq->WriteKv(l, s, 1, k.data(), v.data());
    }
    seq->SetSlot(s, (seq->tokens()[s] + 1) % cfg().vocab_size, seq->positions()[s] + 50);
  }

  // Logits row `got` against reference row `want`; returns the error scaled by max(1, max |want|).
  template <class T>
  static double RowError(const T* got, const std::vector<double>& want) {
    double max_ref = 1, err = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      max_ref = std::max(max_ref, std::abs(want[i]));
      err = std::max(err, std::abs(got[i] - want[i]));
    }
    return err / max_ref;
  }
  void ExpectRow(const float* got, const std::vector<double>& want, const std::string& what) const {
    const double e = RowError(got, want);
    EXPECT_LE(e, tol()) << what;
  }
  // The compute buffer's K (rotated) and V of `slot` at `layer` against the reference's.
  void ExpectKv(const kv::SequenceKv& seq, int layer, int32_t slot, const NaiveRun& ref, int ref_token,
                const std::string& what) const {
    std::vector<float> k(cfg().kv_dim()), v(cfg().kv_dim());
    seq.ReadKv(layer, slot, 1, k.data(), v.data());
    EXPECT_LE(RowError(k.data(), ref.k_rot[layer][ref_token]), k_tol()) << what << " K layer " << layer;
    EXPECT_LE(RowError(v.data(), ref.v[layer][ref_token]), v_tol()) << what << " V layer " << layer;
  }

  TempDir dir_;
  TinyModel tm_;
  backend::ThreadPool pool_{2};
  std::unique_ptr<Transformer> tf_;
  std::unique_ptr<kv::BlockPool> kvp_;
  double rounding_effect_ = 0;
};

std::vector<int32_t> Iota(int n, int first = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST_P(ForwardSlotsTest, RecomputingRandomSubsetsInPlaceGivesTheFullForward) {
  std::mt19937 rng(1);
  const int n = 40;
  const std::vector<int32_t> tokens = RandomTokens(n, rng);
  const NaiveRun ref = Naive(tokens, Options());
  kv::SequenceKv seq(kvp_.get());
  Prefill(&seq, tokens, Iota(n));
  ASSERT_FALSE(HasFatalFailure());

  std::vector<std::vector<int32_t>> subsets = {{0}, {n - 1}, Iota(12, 20), Iota(n)};  // first, last, a run, all
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<int32_t> all = Iota(n);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::uniform_int_distribution<int>(1, 20)(rng));
    subsets.push_back(all);
  }
  for (std::vector<int32_t> slots : subsets) {
    std::shuffle(slots.begin(), slots.end(), rng);  // rows in any order: slot order decides visibility
    for (int32_t s : slots) Corrupt(&seq, s, rng);
    std::vector<BatchEntry> b(1);
    b[0].seq = &seq;
    b[0].slots = slots;
    for (int32_t s : slots) {
      b[0].tokens.push_back(tokens[s]);
      b[0].positions.push_back(s);
    }
    b[0].all_logits = true;
    std::vector<float> logits;
    ASSERT_TRUE(tf_->Forward(b, &logits).ok());
    std::string what = "slots";
    for (int32_t s : slots) what += " " + std::to_string(s);
    ASSERT_EQ(logits.size(), slots.size() * cfg().vocab_size) << what;
    ASSERT_EQ(seq.n_slots(), n);
    for (size_t r = 0; r < slots.size(); ++r) {
      ExpectRow(logits.data() + r * cfg().vocab_size, ref.logits[slots[r]], what + ", row " + std::to_string(r));
      EXPECT_EQ(seq.tokens()[slots[r]], tokens[slots[r]]);
      EXPECT_EQ(seq.positions()[slots[r]], slots[r]);
      for (int l = 0; l < cfg().n_layers; ++l) ExpectKv(seq, l, slots[r], ref, slots[r], what);
    }
  }
}

TEST_P(ForwardSlotsTest, InPlaceAndAppendedRowsInOneStepThenAppendAsUsual) {
  std::mt19937 rng(2);
  const std::vector<int32_t> tokens = RandomTokens(36, rng);
  const NaiveRun ref = Naive(tokens, Options());
  kv::SequenceKv seq(kvp_.get());
  Prefill(&seq, std::vector<int32_t>(tokens.begin(), tokens.begin() + 30), Iota(30));
  ASSERT_FALSE(HasFatalFailure());
  std::vector<int32_t> slots = {3, 17, 29, 30, 31, 32, 33, 34};
  std::shuffle(slots.begin(), slots.end(), rng);
  for (int32_t s : {3, 17, 29}) Corrupt(&seq, s, rng);
  std::vector<BatchEntry> b(1);
  b[0].seq = &seq;
  b[0].slots = slots;
  for (int32_t s : slots) {
    b[0].tokens.push_back(tokens[s]);
    b[0].positions.push_back(s);
  }
  b[0].all_logits = true;
  std::vector<float> logits;
  ASSERT_TRUE(tf_->Forward(b, &logits).ok());
  ASSERT_EQ(seq.n_slots(), 35);
  ASSERT_EQ(logits.size(), slots.size() * cfg().vocab_size);
  for (size_t r = 0; r < slots.size(); ++r) {
    ExpectRow(logits.data() + r * cfg().vocab_size, ref.logits[slots[r]], "slot " + std::to_string(slots[r]));
  }
  EXPECT_EQ(seq.tokens(), std::vector<int32_t>(tokens.begin(), tokens.begin() + 35));
  EXPECT_EQ(seq.positions(), Iota(35));
  // The next plain append continues after the last slot (position 35).
  b.assign(1, BatchEntry{});
  b[0].seq = &seq;
  b[0].tokens = {tokens[35]};
  ASSERT_TRUE(tf_->Forward(b, &logits).ok());
  ExpectRow(logits.data(), ref.logits[35], "decode after");
}

TEST_P(ForwardSlotsTest, StepPhasesTimeEveryStepWhileSetWithinItsWallTimeAndChangeNoResult) {
  // set_step_phases: the steps taken while it is set are counted, each phase's time is
  // within the wall time of those steps (measured here, around them), the attention, the
  // projections and the logits take some of it, and the logits are still the reference's.
  std::mt19937 rng(11);
  const std::vector<int32_t> tokens = RandomTokens(26, rng);
  const NaiveRun ref = Naive(tokens, Options());
  kv::SequenceKv seq(kvp_.get());
  Prefill(&seq, std::vector<int32_t>(tokens.begin(), tokens.begin() + 20), Iota(20));
  ASSERT_FALSE(HasFatalFailure());
  StepPhases phases;
  std::vector<float> logits;
  auto decode = [&](int t) {
    std::vector<BatchEntry> b(1);
    b[0].seq = &seq;
    b[0].tokens = {tokens[t]};
    ASSERT_TRUE(tf_->Forward(b, &logits).ok());
    ExpectRow(logits.data(), ref.logits[t], "decode " + std::to_string(t));
  };
  tf_->set_step_phases(&phases);
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 20; t < 25; ++t) decode(t);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  tf_->set_step_phases(nullptr);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(phases.steps, 5);
  double sum = 0;
  for (int i = 0; i < StepPhases::kCount; ++i) {
    EXPECT_GE(phases.seconds[i], 0.0) << StepPhases::Name(i);
    sum += phases.seconds[i];
  }
  EXPECT_LE(sum, wall);
  for (int i : {StepPhases::kNormQkv, StepPhases::kAttention, StepPhases::kFfnDown, StepPhases::kLogits})
    EXPECT_GT(phases.seconds[i], 0.0) << StepPhases::Name(i);
  // Unset: the next step adds nothing.
  const StepPhases before = phases;
  decode(25);
  EXPECT_EQ(phases.steps, before.steps);
  for (int i = 0; i < StepPhases::kCount; ++i) EXPECT_EQ(phases.seconds[i], before.seconds[i]) << StepPhases::Name(i);
  EXPECT_STREQ(StepPhases::Name(StepPhases::kAttention), "attention");
}

TEST_P(ForwardSlotsTest, RepositionedChunkEqualsTheNaiveForwardAtItsNewPositions) {
  // A chunk cached at positions 24..39 moves 9 positions on (a linked context whose
  // predecessor grew): its slots are recomputed in place at 33..48, once in one step and
  // once in two steps (the second step's rows see the first's fresh KV).
  std::mt19937 rng(3);
  const int n = 40, shift = 9, first = 24;
  const std::vector<int32_t> tokens = RandomTokens(n + 1, rng);
  std::vector<int> moved(n + 1);
  for (int j = 0; j <= n; ++j) moved[j] = j < first ? j : j + shift;
  const NaiveRun ref = Naive(tokens, Options(moved));
  for (int steps : {1, 2}) {
    kv::SequenceKv seq(kvp_.get());
    Prefill(&seq, std::vector<int32_t>(tokens.begin(), tokens.begin() + n), Iota(n));
    ASSERT_FALSE(HasFatalFailure());
    std::vector<float> logits;
    const int per_step = (n - first) / steps;
    for (int st = 0; st < steps; ++st) {
      std::vector<int32_t> slots = Iota(per_step, first + st * per_step);
      std::shuffle(slots.begin(), slots.end(), rng);
      std::vector<BatchEntry> b(1);
      b[0].seq = &seq;
      b[0].slots = slots;
      for (int32_t s : slots) {
        b[0].tokens.push_back(tokens[s]);
        b[0].positions.push_back(moved[s]);
      }
      b[0].all_logits = true;
      ASSERT_TRUE(tf_->Forward(b, &logits).ok());
      for (size_t r = 0; r < slots.size(); ++r) {
        ExpectRow(logits.data() + r * cfg().vocab_size, ref.logits[slots[r]],
                  std::to_string(steps) + " steps, slot " + std::to_string(slots[r]));
      }
    }
    EXPECT_EQ(seq.positions(), std::vector<int32_t>(moved.begin(), moved.begin() + n));
    // A decode token continues from the last slot's new position (49).
    std::vector<BatchEntry> b(1);
    b[0].seq = &seq;
    b[0].tokens = {tokens[n]};
    ASSERT_TRUE(tf_->Forward(b, &logits).ok());
    ExpectRow(logits.data(), ref.logits[n], "decode after the moved chunk");
    EXPECT_EQ(seq.positions().back(), n + shift);
  }
}

// Records what OnKv sees, and what the compute buffer held for the rows' slots then.
class RecordingHooks : public kv::LayerHooks {
 public:
  struct Call {
    int layer, entry;
    std::vector<int32_t> rows, slots, positions;
    std::vector<float> k_pre, k, v, buffer_k;  // [n_rows, kv_dim]
  };
  RecordingHooks(const std::vector<BatchEntry>& batch, int kv_dim) : batch_(batch), kv_dim_(kv_dim) {}
  void OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kv) override {
    Call c;
    c.layer = layer;
    c.entry = rows.entry;
    c.rows.assign(rows.rows, rows.rows + rows.n_rows);
    c.slots.assign(rows.slots, rows.slots + rows.n_rows);
    c.positions.assign(rows.positions, rows.positions + rows.n_rows);
    const size_t n = static_cast<size_t>(rows.n_rows) * kv_dim_;
    c.k_pre.assign(kv.k_pre_rope, kv.k_pre_rope + n);
    c.k.assign(kv.k, kv.k + n);
    c.v.assign(kv.v, kv.v + n);
    c.buffer_k.resize(n);
    std::vector<float> v(kv_dim_);
    const kv::SequenceKv& seq = *batch_[rows.entry].seq;
    for (int r = 0; r < rows.n_rows; ++r) {
      if (rows.slots[r] < seq.n_slots()) seq.ReadKv(layer, rows.slots[r], 1, c.buffer_k.data() + r * kv_dim_, v.data());
    }
    calls.push_back(std::move(c));
  }
  std::vector<Call> calls;

 private:
  const std::vector<BatchEntry>& batch_;
  int kv_dim_;
};

TEST_P(ForwardSlotsTest, OnKvSeesEveryLayersKvBeforeItEntersTheBuffer) {
  std::mt19937 rng(4);
  const int kvd = cfg().kv_dim();
  // Entry 0 recomputes slots {5, 6, 20} of a 24-slot sequence at positions moved by 3;
  // entry 1 appends 7 tokens to a fresh sequence.
  const std::vector<int32_t> tokens_a = RandomTokens(24, rng), tokens_b = RandomTokens(7, rng);
  std::vector<int> pos_a(24);
  for (int j = 0; j < 24; ++j) pos_a[j] = j + (j == 5 || j == 6 || j == 20 ? 3 : 0);
  // The other slots keep the KV cached at their old positions.
  const NaiveRun cached_a = Naive(tokens_a, Options());
  NaiveOptions o = Options(pos_a);
  ReadCacheExcept(cached_a, {5, 6, 20}, &o);
  const NaiveRun ref_a = Naive(tokens_a, o), ref_b = Naive(tokens_b, Options());
  kv::SequenceKv a(kvp_.get()), bseq(kvp_.get());
  Prefill(&a, tokens_a, Iota(24));
  ASSERT_FALSE(HasFatalFailure());
  // Known old K at the recomputed slots: OnKv must run before the fresh rows replace it.
  std::vector<std::vector<std::vector<float>>> old_k(cfg().n_layers);
  for (int32_t s : {20, 5, 6}) Corrupt(&a, s, rng);
  const std::vector<int32_t> slots = {20, 5, 6};
  for (int l = 0; l < cfg().n_layers; ++l) {
    for (int32_t s : slots) {
      std::vector<float> k(kvd), v(kvd);
      a.ReadKv(l, s, 1, k.data(), v.data());
      old_k[l].push_back(k);
    }
  }
  std::vector<BatchEntry> b(2);
  b[0].seq = &a;
  b[0].slots = slots;
  for (int32_t s : slots) {
    b[0].tokens.push_back(tokens_a[s]);
    b[0].positions.push_back(pos_a[s]);
  }
  b[1].seq = &bseq;
  b[1].tokens = tokens_b;
  RecordingHooks hooks(b, kvd);
  std::vector<float> logits;
  ASSERT_TRUE(tf_->Forward(b, &logits, &hooks).ok());
  ASSERT_EQ(hooks.calls.size(), static_cast<size_t>(2 * cfg().n_layers));
  const double kv_tol = tol();
  for (size_t ci = 0; ci < hooks.calls.size(); ++ci) {
    const auto& c = hooks.calls[ci];
    EXPECT_EQ(c.layer, static_cast<int>(ci / 2));
    EXPECT_EQ(c.entry, static_cast<int>(ci % 2));
    const NaiveRun& ref = c.entry == 0 ? ref_a : ref_b;
    const int n_rows = c.entry == 0 ? 3 : 7;
    EXPECT_EQ(c.rows, Iota(n_rows));
    for (int r = 0; r < n_rows; ++r) {
      const int slot = c.entry == 0 ? slots[r] : r;
      EXPECT_EQ(c.slots[r], slot);
      EXPECT_EQ(c.positions[r], c.entry == 0 ? pos_a[slot] : r);
      const std::string what = "layer " + std::to_string(c.layer) + " entry " + std::to_string(c.entry) + " slot " +
                               std::to_string(slot);
      EXPECT_LE(RowError(c.k_pre.data() + r * kvd, ref.k_pre[c.layer][slot]), kv_tol) << what << " K pre-RoPE";
      EXPECT_LE(RowError(c.k.data() + r * kvd, ref.k_rot[c.layer][slot]), kv_tol) << what << " K";
      EXPECT_LE(RowError(c.v.data() + r * kvd, ref.v[c.layer][slot]), kv_tol) << what << " V";
      if (c.entry == 0) {
        EXPECT_TRUE(std::equal(old_k[c.layer][r].begin(), old_k[c.layer][r].end(), c.buffer_k.begin() + r * kvd))
            << what << ": the buffer no longer held the old K when OnKv ran";
      }
    }
  }
  ExpectRow(logits.data(), ref_a.logits[6], "entry 0 (last row: slot 6)");
  ExpectRow(logits.data() + cfg().vocab_size, ref_b.logits[6], "entry 1");
}

// Per KV head h, from layer 1 on: slots j with j % (h + 2) == 0, plus the last 3 slots.
class PerHeadListHooks : public kv::LayerHooks {
 public:
  explicit PerHeadListHooks(int n_kv_heads) : n_kv_heads_(n_kv_heads) {}
  static bool Sees(int layer, int h, int j, int n_slots) { return layer == 0 || j % (h + 2) == 0 || j >= n_slots - 3; }
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    if (layer == 0) return;
    // Per entry: the lists must outlive every entry's call (attention runs after them all).
    if (static_cast<int>(entries_.size()) <= rows.entry) entries_.resize(rows.entry + 1);
    Lists& e = entries_[rows.entry];
    e.lists.assign(n_kv_heads_, {});
    e.ptrs.resize(n_kv_heads_);
    e.counts.resize(n_kv_heads_);
    for (int h = 0; h < n_kv_heads_; ++h) {
      for (int j = 0; j < vis->n_slots; ++j) {
        if (Sees(layer, h, j, vis->n_slots)) e.lists[h].push_back(j);
      }
      e.ptrs[h] = e.lists[h].data();
      e.counts[h] = static_cast<int32_t>(e.lists[h].size());
    }
    vis->head_indices = e.ptrs.data();
    vis->n_head_indices = e.counts.data();
  }

 private:
  struct Lists {
    std::vector<std::vector<int32_t>> lists;
    std::vector<const int32_t*> ptrs;
    std::vector<int32_t> counts;
  };
  int n_kv_heads_;
  std::vector<Lists> entries_;
};

// At layer 1 only: one list for every head (slots >= 5), and rows at odd slots stop
// seeing their own slot (kv_end = slot): the row at slot 1 then sees nothing.
class SharedListHooks : public kv::LayerHooks {
 public:
  static bool Sees(int layer, int t, int j) {
    if (layer != 1) return j <= t;
    return j >= 5 && (t % 2 == 1 ? j < t : j <= t);
  }
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    if (layer != 1) return;
    if (static_cast<int>(lists_.size()) <= rows.entry) lists_.resize(rows.entry + 1);
    std::vector<int32_t>& list = lists_[rows.entry];
    list.clear();
    for (int j = 5; j < vis->n_slots; ++j) list.push_back(j);
    vis->indices = list.data();
    vis->n_indices = static_cast<int>(list.size());
    for (int r = 0; r < rows.n_rows; ++r) {
      if (rows.slots[r] % 2 == 1) vis->kv_end[r] = rows.slots[r];
    }
  }

 private:
  std::vector<std::vector<int32_t>> lists_;  // per entry
};

TEST_P(ForwardSlotsTest, BeforeAttentionVisibilityEqualsTheMaskedNaiveForward) {
  std::mt19937 rng(5);
  const int n = 24;
  const std::vector<int32_t> tokens = RandomTokens(n, rng);
  for (int which = 0; which < 2; ++which) {
    PerHeadListHooks per_head(cfg().n_kv_heads);
    SharedListHooks shared;
    kv::LayerHooks* hooks = which == 0 ? static_cast<kv::LayerHooks*>(&per_head) : &shared;
    NaiveOptions o = Options();
    // A query sees slots below its own + 1 that exist when it runs: chunk of 16, then 8.
    if (which == 0) {
      o.visible = [](int l, int t, int h, int j) {
        const int n_slots = t < 16 ? 16 : 24;
        return j <= t && PerHeadListHooks::Sees(l, h, j, n_slots);
      };
    } else {
      o.visible = [](int l, int t, int, int j) { return SharedListHooks::Sees(l, t, j); };
    }
    const NaiveRun ref = Naive(tokens, o);
    kv::SequenceKv seq(kvp_.get());
    for (int p = 0; p < n; p += 16) {
      std::vector<BatchEntry> b(1);
      b[0].seq = &seq;
      b[0].tokens.assign(tokens.begin() + p, tokens.begin() + std::min(n, p + 16));
      b[0].all_logits = true;
      std::vector<float> logits;
      ASSERT_TRUE(tf_->Forward(b, &logits, hooks).ok());
      for (size_t r = 0; r < b[0].tokens.size(); ++r) {
        ExpectRow(logits.data() + r * cfg().vocab_size, ref.logits[p + r],
                  (which == 0 ? "per-head lists, slot " : "shared list, slot ") + std::to_string(p + r));
      }
    }
  }
}

// Drops the rows writing slots in `drop` after layer `after` (and every row of entries in
// `drop_all`).
class DropHooks : public kv::LayerHooks {
 public:
  DropHooks(int after, std::set<int32_t> drop, std::set<int> drop_all)
      : after_(after), drop_(std::move(drop)), drop_all_(std::move(drop_all)) {}
  void AfterLayer(int layer, const kv::EntryRows& rows, uint8_t* keep) override {
    seen_rows.push_back(rows.n_rows);
    if (layer != after_) return;
    for (int r = 0; r < rows.n_rows; ++r) {
      if (drop_all_.count(rows.entry) || (rows.entry == 0 && drop_.count(rows.slots[r]))) keep[r] = 0;
    }
  }
  std::vector<int> seen_rows;  // n_rows per AfterLayer call

 private:
  int after_;
  std::set<int32_t> drop_;
  std::set<int> drop_all_;
};

// What BeforeAttention may read to choose slots: its rows' queries (rotated) and the
// layer's KV as attention reads it, this step's rows included.
class QueryKvRecorder : public kv::LayerHooks {
 public:
  struct Seen {
    int layer, n_slots, view_slots;
    std::vector<int32_t> slots;   // the rows' slots
    std::vector<float> q;         // [n_rows, q_dim]
    std::vector<float> k;         // [view_slots, kv_dim] read through the view
  };
  QueryKvRecorder(int q_dim, int n_kv_heads, int head_dim) : q_dim_(q_dim), n_kv_heads_(n_kv_heads), head_dim_(head_dim) {}
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    Seen s{layer, vis->n_slots, vis->kv->n_slots, {rows.slots, rows.slots + rows.n_rows}, {}, {}};
    s.q.assign(vis->q, vis->q + static_cast<size_t>(rows.n_rows) * q_dim_);
    const attention::KvLayerView& kv = *vis->kv;
    s.k.resize(static_cast<size_t>(kv.n_slots) * n_kv_heads_ * head_dim_);
    for (int j = 0; j < kv.n_slots; ++j) {
      const int64_t block = kv.block_table[j / kv.block_size];
      for (int h = 0; h < n_kv_heads_; ++h) {
        const int64_t at = block * kv.block_stride + (static_cast<int64_t>(h) * kv.block_size + j % kv.block_size) * head_dim_;
        float* dst = s.k.data() + (static_cast<size_t>(j) * n_kv_heads_ + h) * head_dim_;
        if (kv.k_pool != nullptr) {
          std::copy(kv.k_pool + at, kv.k_pool + at + head_dim_, dst);
        } else {
          backend::ConvertF16ToF32(kv.k_f16 + at, dst, head_dim_);
        }
      }
    }
    seen.push_back(std::move(s));
  }
  std::vector<Seen> seen;

 private:
  int q_dim_, n_kv_heads_, head_dim_;
};

TEST_P(ForwardSlotsTest, BeforeAttentionSeesTheRowsQueriesAndTheLayersKv) {
  std::mt19937 rng(6);
  const int n = 20;
  const std::vector<int32_t> tokens = RandomTokens(n, rng);
  const NaiveRun ref = Naive(tokens, Options());
  kv::SequenceKv seq(kvp_.get());
  QueryKvRecorder hooks(cfg().q_dim(), cfg().n_kv_heads, cfg().head_dim);
  for (int p = 0; p < n; p += 12) {  // a chunk of 12, then 8: the view holds the earlier chunk too
    std::vector<BatchEntry> b(1);
    b[0].seq = &seq;
    b[0].tokens.assign(tokens.begin() + p, tokens.begin() + std::min(n, p + 12));
    std::vector<float> logits;
    ASSERT_TRUE(tf_->Forward(b, &logits, &hooks).ok());
  }
  ASSERT_EQ(hooks.seen.size(), static_cast<size_t>(2 * cfg().n_layers));
  const double k_tol = this->k_tol();
  const int kvd = cfg().kv_dim(), qd = cfg().q_dim();
  for (const auto& s : hooks.seen) {
    const std::string what = "layer " + std::to_string(s.layer) + ", " + std::to_string(s.n_slots) + " slots";
    EXPECT_EQ(s.view_slots, s.n_slots) << what;
    EXPECT_EQ(s.n_slots, s.slots.back() + 1) << what;
    for (size_t r = 0; r < s.slots.size(); ++r)
      EXPECT_LE(RowError(s.q.data() + r * qd, ref.q_rot[s.layer][s.slots[r]]), tol()) << what << " q row " << r;
    for (int j = 0; j < s.view_slots; ++j)
      EXPECT_LE(RowError(s.k.data() + static_cast<size_t>(j) * kvd, ref.k_rot[s.layer][j]), k_tol) << what << " K slot " << j;
  }
}

// For one-row steps, stages the row's own slot and the even slots before it into
// buffers of its own, renumbered 0..m-1 (what an offloading hook does with the slots it
// fetched), and points attention there: the compute buffer's rows are not read.
class CompactViewHooks : public kv::LayerHooks {
 public:
  static bool Sees(int t, int j) { return j == t || (j < t && j % 2 == 0); }
  void BeforeAttention(int layer, const kv::EntryRows& rows, kv::Visibility* vis) override {
    if (rows.n_rows != 1) return;
    const attention::KvLayerView& kv = *vis->kv;
    const int own = rows.slots[0];
    std::vector<int> slots;
    for (int j = 0; j <= own; ++j)
      if (Sees(own, j)) slots.push_back(j);
    const int m = static_cast<int>(slots.size()), bs = kv.block_size;
    const int n_blocks = (m + bs - 1) / bs;
    // f32 and f16 storage (the variants' types), K and V each by its own; both tensors'
    // block strides count elements.
    const int k_eb = kv.k_f16 != nullptr ? 2 : 4, v_eb = kv.v_f16 != nullptr ? 2 : 4;
    const int64_t stride = kv.block_stride;
    const int head_dim = static_cast<int>(stride / bs) / n_kv_heads_;
    k_.assign(static_cast<size_t>(n_blocks * stride) * k_eb, 0xFF);  // NaN where nothing is staged
    v_.assign(static_cast<size_t>(n_blocks * stride) * v_eb, 0xFF);
    const auto* kp = reinterpret_cast<const char*>(kv.k_f16 != nullptr ? static_cast<const void*>(kv.k_f16) : kv.k_pool);
    const auto* vp = reinterpret_cast<const char*>(kv.v_f16 != nullptr ? static_cast<const void*>(kv.v_f16) : kv.v_pool);
    for (int i = 0; i < m; ++i) {
      const int j = slots[i];
      for (int h = 0; h < n_kv_heads_; ++h) {
        const int64_t from = kv.block_table[j / bs] * stride + (static_cast<int64_t>(h) * bs + j % bs) * head_dim;
        const int64_t to = (i / bs) * stride + (static_cast<int64_t>(h) * bs + i % bs) * head_dim;
        std::memcpy(k_.data() + to * k_eb, kp + from * k_eb, static_cast<size_t>(head_dim) * k_eb);
        std::memcpy(v_.data() + to * v_eb, vp + from * v_eb, static_cast<size_t>(head_dim) * v_eb);
      }
    }
    table_.resize(n_blocks);
    for (int b = 0; b < n_blocks; ++b) table_[b] = b;
    view_ = kv;
    view_.k_pool = view_.v_pool = nullptr;
    view_.k_f16 = view_.v_f16 = nullptr;
    if (k_eb == 2) {
      view_.k_f16 = reinterpret_cast<const uint16_t*>(k_.data());
    } else {
      view_.k_pool = reinterpret_cast<const float*>(k_.data());
    }
    if (v_eb == 2) {
      view_.v_f16 = reinterpret_cast<const uint16_t*>(v_.data());
    } else {
      view_.v_pool = reinterpret_cast<const float*>(v_.data());
    }
    view_.block_table = table_.data();
    view_.n_slots = m;
    vis->kv_end[0] = m;
    vis->view = &view_;
    vis->kv = &view_;
    ++staged;
  }
  explicit CompactViewHooks(int n_kv_heads) : n_kv_heads_(n_kv_heads) {}
  int staged = 0;

 private:
  int n_kv_heads_;
  std::vector<uint8_t> k_, v_;
  std::vector<int32_t> table_;
  attention::KvLayerView view_;
};

TEST_P(ForwardSlotsTest, BeforeAttentionMayPointAttentionAtAViewOfItsOwn) {
  std::mt19937 rng(8);
  const int n = 20, prefill = 9;
  const std::vector<int32_t> tokens = RandomTokens(n, rng);
  NaiveOptions o = Options();
  o.visible = [](int, int t, int, int j) { return t < prefill ? j <= t : CompactViewHooks::Sees(t, j); };
  const NaiveRun ref = Naive(tokens, o);
  kv::SequenceKv seq(kvp_.get());
  CompactViewHooks hooks(cfg().n_kv_heads);
  for (int p = 0; p < n; p = p == 0 ? prefill : p + 1) {  // a prefill chunk, then one row at a time
    std::vector<BatchEntry> b(1);
    b[0].seq = &seq;
    b[0].tokens.assign(tokens.begin() + p, tokens.begin() + (p == 0 ? prefill : p + 1));
    b[0].all_logits = true;
    std::vector<float> logits;
    ASSERT_TRUE(tf_->Forward(b, &logits, &hooks).ok());
    for (size_t r = 0; r < b[0].tokens.size(); ++r)
      ExpectRow(logits.data() + r * cfg().vocab_size, ref.logits[p + r], "slot " + std::to_string(p + r));
  }
  EXPECT_EQ(hooks.staged, (n - prefill) * cfg().n_layers);
}

TEST_P(ForwardSlotsTest, AfterLayerDroppedRowsKeepTheCachedKvOfLaterLayers) {
  // CacheBlend's shape: entry 0 recomputes 10 slots of a 32-slot sequence in place and
  // keeps only 6 after layer 0. The 4 dropped slots' K/V of layers 1.. is not computed:
  // they keep what the cache held, planted here as known stale values, and the kept
  // rows after them read those. Entry 1 appends to another sequence and wants its last
  // row's logits; entry 2 recomputes 3 slots and drops them all.
  std::mt19937 rng(6);
  const int n = 32, kvd = cfg().kv_dim(), after = 0;
  const std::vector<int32_t> tokens = RandomTokens(n, rng), tokens_b = RandomTokens(5, rng),
                             tokens_c = RandomTokens(12, rng);
  const std::vector<int32_t> slots = {30, 2, 9, 10, 11, 17, 25, 26, 4, 31};
  const std::set<int32_t> dropped = {9, 17, 4, 30};
  // Stale KV (f16-representable) for the dropped slots at layers > after.
  std::map<std::pair<int, int32_t>, std::pair<std::vector<float>, std::vector<float>>> stale;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int l = after + 1; l < cfg().n_layers; ++l) {
    for (int32_t s : dropped) {
      std::vector<float> k(kvd), v(kvd);
      for (auto& x : k) x = F16ToF32(F32ToF16(nd(rng)));
      for (auto& x : v) x = F16ToF32(F32ToF16(nd(rng)));
      stale[{l, s}] = {k, v};
    }
  }
  // The reference: slots not recomputed read the cached (full forward's) KV, dropped
  // slots the stale rows at layers > after, the kept rows what they compute.
  const NaiveRun fresh = Naive(tokens, Options()), ref_b = Naive(tokens_b, Options());
  NaiveOptions o = Options();
  ReadCacheExcept(fresh, std::set<int32_t>(slots.begin(), slots.end()), &o);
  const auto read_cache = o.stale_kv;
  o.stale_kv = [&](int l, int j, std::vector<double>* k, std::vector<double>* v) {
    auto it = stale.find({l, j});
    if (it == stale.end()) return read_cache(l, j, k, v);
    k->assign(it->second.first.begin(), it->second.first.end());
    v->assign(it->second.second.begin(), it->second.second.end());
    return true;
  };
  const NaiveRun ref = Naive(tokens, o);

  kv::SequenceKv a(kvp_.get()), bseq(kvp_.get()), c(kvp_.get());
  Prefill(&a, tokens, Iota(n));
  Prefill(&c, tokens_c, Iota(12));
  ASSERT_FALSE(HasFatalFailure());
  for (int32_t s : slots) Corrupt(&a, s, rng);
  for (const auto& [key, kv] : stale) a.WriteKv(key.first, key.second, 1, kv.first.data(), kv.second.data());
  std::vector<std::vector<float>> c_before(cfg().n_layers, std::vector<float>(2 * kvd));
  for (int l = 0; l < cfg().n_layers; ++l) c.ReadKv(l, 7, 1, c_before[l].data(), c_before[l].data() + kvd);

  std::vector<BatchEntry> b(3);
  b[0].seq = &a;
  b[0].slots = slots;
  for (int32_t s : slots) {
    b[0].tokens.push_back(tokens[s]);
    b[0].positions.push_back(s);
  }
  b[0].all_logits = true;
  b[1].seq = &bseq;
  b[1].tokens = tokens_b;
  b[2].seq = &c;
  b[2].slots = {7, 3, 8};
  b[2].tokens = {tokens_c[7], tokens_c[3], tokens_c[8]};
  b[2].positions = {7, 3, 8};
  DropHooks hooks(after, dropped, {2});
  std::vector<float> logits;
  ASSERT_TRUE(tf_->Forward(b, &logits, &hooks).ok());

  // Logits: entry 0's kept rows (in row order), then entry 1's last row; none for entry 2.
  std::vector<int32_t> kept_rows, kept_slots;
  for (int r = 0; r < static_cast<int>(slots.size()); ++r) {
    if (!dropped.count(slots[r])) kept_rows.push_back(r), kept_slots.push_back(slots[r]);
  }
  const auto k0 = tf_->kept_rows(0);
  EXPECT_EQ(std::vector<int32_t>(k0.begin(), k0.end()), kept_rows);
  EXPECT_EQ(tf_->kept_rows(1).size(), 5u);
  EXPECT_TRUE(tf_->kept_rows(2).empty());
  ASSERT_EQ(logits.size(), (kept_rows.size() + 1) * cfg().vocab_size);
  for (size_t r = 0; r < kept_slots.size(); ++r) {
    ExpectRow(logits.data() + r * cfg().vocab_size, ref.logits[kept_slots[r]],
              "kept slot " + std::to_string(kept_slots[r]));
  }
  ExpectRow(logits.data() + kept_rows.size() * cfg().vocab_size, ref_b.logits[4], "entry 1 after the drops");
  // AfterLayer saw every row at layer 0, then only the kept ones: [10, 5, 3], [6, 5, 0], ...
  const std::vector<int> want_seen = {10, 5, 3, 6, 5, 0};
  for (size_t i = 0; i < want_seen.size(); ++i) EXPECT_EQ(hooks.seen_rows.at(i), want_seen[i]) << "call " << i;

  // The dropped slots: fresh K/V at layers <= after, the planted stale rows after it.
  std::vector<float> k(kvd), v(kvd);
  for (int32_t s : dropped) {
    for (int l = 0; l < cfg().n_layers; ++l) {
      if (l <= after) {
        ExpectKv(a, l, s, fresh, s, "dropped slot " + std::to_string(s));
        continue;
      }
      a.ReadKv(l, s, 1, k.data(), v.data());
      EXPECT_EQ(k, (stale[{l, s}].first)) << "dropped slot " << s << " layer " << l << " K was overwritten";
      EXPECT_EQ(v, (stale[{l, s}].second)) << "dropped slot " << s << " layer " << l << " V was overwritten";
    }
  }
  // Entry 2 dropped everything after layer 0: slot 7's later layers are as before.
  for (int l = after + 1; l < cfg().n_layers; ++l) {
    std::vector<float> now(2 * kvd);
    c.ReadKv(l, 7, 1, now.data(), now.data() + kvd);
    EXPECT_EQ(now, c_before[l]) << "layer " << l;
  }
}

TEST_P(ForwardSlotsTest, BadSlotsAreRejectedAndChangeNothing) {
  std::mt19937 rng(7);
  const std::vector<int32_t> tokens = RandomTokens(10, rng);
  kv::SequenceKv seq(kvp_.get()), other(kvp_.get());
  Prefill(&seq, tokens, Iota(10));
  ASSERT_FALSE(HasFatalFailure());
  struct Case {
    std::string name;
    std::vector<int32_t> slots, positions;
  };
  const std::vector<Case> cases = {
      {"slots/tokens size mismatch", {1, 2}, {1, 2, 3}},
      {"no positions", {1, 2, 3}, {}},
      {"negative slot", {-1, 2, 3}, {1, 2, 3}},
      {"gap before the appended slots", {10, 12, 2}, {10, 12, 2}},
      {"appended slots not starting at n_slots", {11, 12, 13}, {11, 12, 13}},
      {"duplicate slot", {4, 5, 4}, {4, 5, 4}},
      {"negative position", {4, 5, 6}, {4, -5, 6}},
  };
  for (const Case& c : cases) {
    std::vector<BatchEntry> b(2);
    b[0].seq = &other;  // appends first: must be rolled back
    b[0].tokens = {5, 6};
    b[1].seq = &seq;
    b[1].tokens = {tokens[1], tokens[2], tokens[3]};
    b[1].slots = c.slots;
    b[1].positions = c.positions;
    std::vector<float> logits;
    const Status st = tf_->Forward(b, &logits);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.name << ": " << st.ToString();
    EXPECT_EQ(seq.n_slots(), 10) << c.name;
    EXPECT_EQ(seq.tokens(), tokens) << c.name;
    EXPECT_EQ(seq.positions(), Iota(10)) << c.name;
    EXPECT_EQ(other.n_slots(), 0) << c.name;
  }
  // One sequence in two entries of a step that names slots.
  std::vector<BatchEntry> b(2);
  b[0].seq = &seq;
  b[0].tokens = {tokens[1]};
  b[0].slots = {1};
  b[0].positions = {1};
  b[1].seq = &seq;
  b[1].tokens = {7};
  std::vector<float> logits;
  EXPECT_EQ(tf_->Forward(b, &logits).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(seq.n_slots(), 10);
  // A full pool: the appended slots of every entry are rolled back, and no in-place
  // slot's token or position changed.
  kv::BlockPool tiny(tf_->kv_shape(4), 3);
  kv::SequenceKv s1(&tiny), s2(&tiny);
  std::vector<BatchEntry> fill(1);
  fill[0].seq = &s2;
  fill[0].tokens = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(tf_->Forward(fill, &logits).ok());  // 2 blocks
  b.assign(2, BatchEntry{});
  b[0].seq = &s2;
  b[0].tokens = {9, 8};
  b[0].slots = {0, 6};
  b[0].positions = {40, 6};
  b[1].seq = &s1;
  b[1].tokens = {1, 2, 3, 4, 5};  // needs 2 blocks, 1 left
  EXPECT_EQ(tf_->Forward(b, &logits).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s2.n_slots(), 6);
  EXPECT_EQ(s2.tokens()[0], 1);
  EXPECT_EQ(s2.positions()[0], 0);
  EXPECT_EQ(s1.n_slots(), 0);
}

std::vector<Variant> Variants() {
  std::vector<Variant> vs;
  Variant gqa;
  gqa.name = "gqa_f32_kv_f32";
  vs.push_back(gqa);
  Variant gqa16 = gqa;
  gqa16.name = "gqa_f32_kv_f16", gqa16.kv_dtype = DType::kF16;
  vs.push_back(gqa16);
  Variant qwen = gqa;
  qwen.name = "qwen2_qkv_bias_f32_kv_f32", qwen.spec.arch = "Qwen2ForCausalLM", qwen.spec.bias = true;
  vs.push_back(qwen);
  Variant qwen16 = qwen;
  qwen16.name = "qwen2_qkv_bias_f32_kv_f16", qwen16.kv_dtype = DType::kF16;
  vs.push_back(qwen16);
  Variant gqa4 = gqa;
  gqa4.name = "gqa4_bf16_kv_f32", gqa4.spec.heads = 8, gqa4.spec.kv_heads = 2, gqa4.spec.head_dim = 8,
  gqa4.spec.dtype = DType::kBF16;
  vs.push_back(gqa4);
  Variant mha = gqa;
  mha.name = "mha_bf16_kv_f16", mha.spec.kv_heads = 4, mha.spec.dtype = DType::kBF16, mha.kv_dtype = DType::kF16;
  vs.push_back(mha);
  // K and V of different types (--kv-dtype-k / --kv-dtype-v).
  Variant k16 = gqa;
  k16.name = "gqa_f32_kv_k_f16_v_f32", k16.kv_dtype = DType::kF16, k16.kv_dtype_v = DType::kF32;
  vs.push_back(k16);
  Variant v16 = gqa;
  v16.name = "gqa_f32_kv_k_f32_v_f16", v16.kv_dtype = DType::kF32, v16.kv_dtype_v = DType::kF16;
  vs.push_back(v16);
  return vs;
}

INSTANTIATE_TEST_SUITE_P(Tiny, ForwardSlotsTest, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace attic::engine
