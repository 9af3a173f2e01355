// Perplexity and the comparison against full attention, checked against independent
// references:
//  * stories260K's perplexity of held-out TinyStories text (2 windows of 64 tokens, BOS
//    first) through Attic's engine vs the same figure from the float64 naive forward
//    (tests/reference/naive_llama.h) given the checkpoint's weights read straight from
//    model.safetensors by this file (not by Attic's loader). Tolerance: relative 1e-5 on
//    perplexity, i.e. 1e-5 nats of mean NLL. The engine computes in f32: measured
//    difference ~6e-8 (printed); 1e-5 leaves two orders of magnitude for other kernels'
//    summation order (AVX-512 vs AVX2) while catching any scoring mistake (a position
//    off by one moves the perplexity by tens of percent, a wrong KV slot by percents).
//  * hand-checkable methods: full against itself (KL 0, top-1 1.0), and a method whose
//    logits are all zero (perplexity = vocabulary size exactly; KL from full = log V -
//    H(full), with H taken from the naive reference).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "attic/core/file.h"
#include "attic/engine/engine.h"
#include "attic/eval/method.h"
#include "attic/eval/perplexity.h"
#include "reference/naive_llama.h"
#include "test_util.h"

namespace attic::eval {
namespace {

using attic::testing::NaiveConfig;
using attic::testing::NaiveWeights;
using attic::testing::SharedDir;

std::string Stories() { return SharedDir() + "/models/stories260K-hf"; }

// The f32 tensors of an HF model.safetensors, by name (a format small enough to read
// here: u64 header length, JSON header of {name: {dtype, shape, data_offsets}}, data).
std::map<std::string, std::vector<float>> ReadSafetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  const auto h = nlohmann::json::parse(header);
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : h.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(t["dtype"], "F32") << name;
    const uint64_t b = t["data_offsets"][0], e = t["data_offsets"][1];
    std::vector<float> v((e - b) / 4);
    f.seekg(static_cast<std::streamoff>(8 + n + b));
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(e - b));
    out[name] = std::move(v);
  }
  return out;
}

// stories260K's config.json, read here.
NaiveConfig StoriesConfig() {
  const auto c = nlohmann::json::parse(*ReadFileToString(Stories() + "/config.json"));
  NaiveConfig nc;
  nc.hidden = c["hidden_size"], nc.intermediate = c["intermediate_size"], nc.n_layers = c["num_hidden_layers"];
  nc.n_heads = c["num_attention_heads"], nc.n_kv_heads = c["num_key_value_heads"];
  nc.head_dim = nc.hidden / nc.n_heads, nc.vocab = c["vocab_size"];
  nc.eps = c["rms_norm_eps"], nc.theta = c["rope_theta"];
  return nc;
}

NaiveWeights StoriesWeights(int n_layers) {
  auto t = ReadSafetensors(Stories() + "/model.safetensors");
  NaiveWeights w;
  w.embed = t["model.embed_tokens.weight"];
  w.final_norm = t["model.norm.weight"];
  if (t.count("lm_head.weight")) w.lm_head = t["lm_head.weight"];
  w.layers.resize(static_cast<size_t>(n_layers));
  for (int l = 0; l < n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = t[p + "input_layernorm.weight"];
    L.wq = t[p + "self_attn.q_proj.weight"];
    L.wk = t[p + "self_attn.k_proj.weight"];
    L.wv = t[p + "self_attn.v_proj.weight"];
    L.wo = t[p + "self_attn.o_proj.weight"];
    L.ffn_norm = t[p + "post_attention_layernorm.weight"];
    L.gate = t[p + "mlp.gate_proj.weight"];
    L.up = t[p + "mlp.up_proj.weight"];
    L.down = t[p + "mlp.down_proj.weight"];
  }
  return w;
}

// log softmax in double, written out here rather than taken from metrics.h.
std::vector<double> RefLogProbs(const std::vector<double>& logits) {
  double mx = logits[0];
  for (double x : logits) mx = std::max(mx, x);
  double s = 0;
  for (double x : logits) s += std::exp(x - mx);
  std::vector<double> out;
  for (double x : logits) out.push_back(x - mx - std::log(s));
  return out;
}

// A method whose every row of logits is zero: the uniform distribution.
class UniformMethod : public Method {
 public:
  explicit UniformMethod(int vocab) : vocab_(vocab) {}
  std::string name() const override { return "uniform"; }
  Status Score(const std::vector<int32_t>& tokens, int first_scored, std::vector<float>* logits) override {
    logits->assign((tokens.size() - static_cast<size_t>(first_scored)) * static_cast<size_t>(vocab_), 0.0f);
    return OkStatus();
  }
  StatusOr<std::vector<int32_t>> Greedy(const std::vector<int32_t>&, int) override { return std::vector<int32_t>{}; }

 private:
  int vocab_;
};

class PerplexityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine::EngineOptions o;
    o.model_path = Stories();
    o.n_threads = 2;
    o.context_length = 128;
    o.max_batch_tokens = 24;  // a 64-token window runs in 3 chunks; scored rows straddle them
    auto e = engine::Engine::Load(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e).release();
    auto text = ReadFileToString(SharedDir() + "/datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    auto tokens = engine_->Tokenize(*text, false);
    ASSERT_TRUE(tokens.ok());
    text_tokens_ = new std::vector<int32_t>(std::move(*tokens));
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete text_tokens_;
  }
  static engine::Engine* engine_;
  static std::vector<int32_t>* text_tokens_;
};
engine::Engine* PerplexityTest::engine_ = nullptr;
std::vector<int32_t>* PerplexityTest::text_tokens_ = nullptr;

TEST(MakeWindows, NonOverlappingWithBosAndTheTailDropped) {
  const std::vector<int32_t> t = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  const auto w = MakeWindows(t, 1, 4, 0);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0], (std::vector<int32_t>{1, 10, 11, 12}));
  EXPECT_EQ(w[1], (std::vector<int32_t>{1, 13, 14, 15}));
  EXPECT_EQ(w[2], (std::vector<int32_t>{1, 16, 17, 18}));  // 19 alone is no window
  EXPECT_EQ(MakeWindows(t, 1, 4, 2).size(), 2u);
  const auto nobos = MakeWindows(t, -1, 4, 0);
  ASSERT_EQ(nobos.size(), 2u);
  EXPECT_EQ(nobos[1], (std::vector<int32_t>{14, 15, 16, 17}));
  EXPECT_TRUE(MakeWindows(t, 1, 12, 0).empty());
}

TEST_F(PerplexityTest, MatchesTheFloat64NaiveForward) {
  const NaiveConfig nc = StoriesConfig();
  ASSERT_EQ(nc.vocab, engine_->model().config().vocab_size);
  const NaiveWeights nw = StoriesWeights(nc.n_layers);
  const int32_t bos = engine_->tokenizer().bos_id();
  ASSERT_EQ(bos, 1);
  ASSERT_TRUE(engine_->tokenizer().add_bos());
  const auto windows = MakeWindows(*text_tokens_, bos, 64, 2);
  ASSERT_EQ(windows.size(), 2u);
  // The reference's own windows: BOS + 63 text tokens each, one after the other.
  std::vector<std::vector<int>> ref_windows;
  for (int w = 0; w < 2; ++w) {
    std::vector<int> rw{bos};
    for (int i = 0; i < 63; ++i) rw.push_back((*text_tokens_)[static_cast<size_t>(63 * w + i)]);
    EXPECT_EQ(std::vector<int32_t>(rw.begin(), rw.end()), windows[static_cast<size_t>(w)]);
    ref_windows.push_back(rw);
  }
  std::vector<std::vector<std::vector<double>>> ref_logits;
  for (const auto& rw : ref_windows) ref_logits.push_back(attic::testing::NaiveForward(nc, nw, rw));

  FullAttention full(*engine_);
  for (int first : {1, 20}) {  // every token after BOS; a 20-token context, then the rest
    double sum_nll = 0;
    int n = 0;
    for (size_t w = 0; w < 2; ++w) {
      for (int t = first; t < 64; ++t) {
        sum_nll -= RefLogProbs(ref_logits[w][static_cast<size_t>(t - 1)])[static_cast<size_t>(ref_windows[w][t])];
        ++n;
      }
    }
    const double ref_ppl = std::exp(sum_nll / n);
    auto r = ScoreWindows({&full}, windows, first, nc.vocab);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const ScoreAccumulator& s = r->methods[0].scores;
    EXPECT_EQ(s.n_tokens(), n);
    std::printf("score from %d: perplexity attic %.8f, float64 reference %.8f, relative difference %.2e\n", first,
                s.perplexity(), ref_ppl, s.perplexity() / ref_ppl - 1);
    EXPECT_NEAR(s.perplexity() / ref_ppl, 1.0, 1e-5) << "score from " << first;
    EXPECT_NEAR(s.mean_nll(), sum_nll / n, 1e-5);
    EXPECT_DOUBLE_EQ(s.mean_kl(), 0.0);  // the reference against itself
    EXPECT_DOUBLE_EQ(s.top1_agreement(), 1.0);
  }
}

TEST_F(PerplexityTest, FullAgainstItselfHasNoDivergence) {
  const auto windows = MakeWindows(*text_tokens_, engine_->tokenizer().bos_id(), 48, 3);
  FullAttention a(*engine_), b(*engine_);
  auto r = ScoreWindows({&a, &b}, windows, 1, engine_->model().config().vocab_size);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ScoreAccumulator& s = r->methods[1].scores;
  EXPECT_EQ(s.n_tokens(), 3 * 47);
  EXPECT_LT(s.mean_kl(), 1e-12);
  EXPECT_DOUBLE_EQ(s.top1_agreement(), 1.0);
  EXPECT_DOUBLE_EQ(s.perplexity(), r->methods[0].scores.perplexity());
}

TEST_F(PerplexityTest, UniformMethodHasPerplexityVocabAndKlFromEntropy) {
  const NaiveConfig nc = StoriesConfig();
  const NaiveWeights nw = StoriesWeights(nc.n_layers);
  const auto windows = MakeWindows(*text_tokens_, engine_->tokenizer().bos_id(), 40, 2);
  FullAttention full(*engine_);
  UniformMethod uniform(nc.vocab);
  const int first = 5;
  auto r = ScoreWindows({&full, &uniform}, windows, first, nc.vocab);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ScoreAccumulator& u = r->methods[1].scores;
  EXPECT_NEAR(u.perplexity(), nc.vocab, 1e-9 * nc.vocab);  // every token has probability 1/V
  // KL(full || uniform) = log V - H(full) at each position; H from the naive reference.
  double sum_kl = 0;
  int n = 0, agree = 0;
  for (const auto& w : windows) {
    const auto logits = attic::testing::NaiveForward(nc, nw, std::vector<int>(w.begin(), w.end()));
    for (size_t t = first; t < w.size(); ++t) {
      const auto lp = RefLogProbs(logits[t - 1]);
      double h = 0;
      for (double l : lp) h -= std::exp(l) * l;
      sum_kl += std::log(static_cast<double>(nc.vocab)) - h;
      agree += std::max_element(lp.begin(), lp.end()) == lp.begin() ? 1 : 0;  // uniform's argmax is token 0
      ++n;
    }
  }
  EXPECT_EQ(u.n_tokens(), n);
  EXPECT_NEAR(u.mean_kl(), sum_kl / n, 1e-4);
  EXPECT_DOUBLE_EQ(u.top1_agreement(), static_cast<double>(agree) / n);
  EXPECT_GT(u.mean_kl(), 1.0);  // far from uniform: the model has learned something
}

TEST_F(PerplexityTest, RejectsWhatDoesNotFit) {
  FullAttention full(*engine_);
  std::vector<float> logits;
  const std::vector<int32_t> too_long(129, 5);
  EXPECT_EQ(full.Score(too_long, 1, &logits).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(full.Score({1, 5, 6}, 3, &logits).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(full.Score({1, 5, 6}, 0, &logits).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->kv_pool().n_used(), 0);  // nothing left reserved
}

// A method whose logits at row r are amp * cos(0.37 v (t + 1) + phase), t the token at
// the row's position (so a row read at the wrong position gives other values), amp and
// phase set by the KV-type axis point in force (`*variant`) and by the method.
class WaveMethod : public Method {
 public:
  WaveMethod(std::string name, int vocab, const int* variant, double phase)
      : name_(std::move(name)), vocab_(vocab), variant_(variant), phase_(phase) {}
  std::string name() const override { return name_; }
  Status Score(const std::vector<int32_t>& tokens, int first_scored, std::vector<float>* logits) override {
    logits->clear();
    for (size_t p = static_cast<size_t>(first_scored) - 1; p + 1 < tokens.size(); ++p)
      for (int v = 0; v < vocab_; ++v) logits->push_back(Logit(*variant_, phase_, tokens[p], v));
    return OkStatus();
  }
  StatusOr<std::vector<int32_t>> Greedy(const std::vector<int32_t>&, int) override { return std::vector<int32_t>{}; }
  // Variant 0 is sharp (amplitude 4), variant 1 flat (amplitude 1) and shifted: the two
  // directions of KL between them differ by far more than the tolerances below.
  static float Logit(int variant, double phase, int32_t token, int v) {
    const double amp = variant == 0 ? 4.0 : 1.0;
    const double shift = variant == 0 ? 0.0 : 0.3;
    return static_cast<float>(amp * std::cos(0.37 * v * (token + 1) + phase + shift));
  }

 private:
  std::string name_;
  int vocab_;
  const int* variant_;
  double phase_;
};

// KL(P || Q) in float64 from two rows of float logits, with this file's RefLogProbs.
double RefKl(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  const auto lp = RefLogProbs(std::vector<double>(p_logits.begin(), p_logits.end()));
  const auto lq = RefLogProbs(std::vector<double>(q_logits.begin(), q_logits.end()));
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return kl;
}

size_t RefArgmax(const std::vector<float>& row) {
  return static_cast<size_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

TEST(KvTypeAxis, MeasuresEachMethodAgainstItselfOnTheFirstTypeAndAgainstFullOnItsOwn) {
  constexpr int kVocab = 40;
  const int first = 3;
  const std::vector<std::vector<int32_t>> windows = {
      {1, 7, 3, 19, 25, 4, 11, 30, 2}, {1, 8, 8, 13, 5, 33, 21, 6, 17}, {1, 39, 0, 22, 9, 14, 27, 35, 12}};
  int variant = -1;
  int selects = 0;
  WaveMethod full("full", kVocab, &variant, 0.0), other("other", kVocab, &variant, 0.9);
  const std::vector<KvTypePoint> kv = {{"a", [&] { variant = 0, ++selects; return OkStatus(); }},
                                       {"b", [&] { variant = 1, ++selects; return OkStatus(); }}};
  auto r = ScoreWindows({&full, &other}, windows, first, kVocab, nullptr, kv);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(selects, 6);  // each type once per window
  ASSERT_EQ(r->methods.size(), 4u);

  // The float64 reference: each row's logits written out from the formula, KL taken here.
  auto row = [&](int var, double phase, int32_t token) {
    std::vector<float> out;
    for (int v = 0; v < kVocab; ++v) out.push_back(WaveMethod::Logit(var, phase, token, v));
    return out;
  };
  const double phases[2] = {0.0, 0.9};
  for (int k = 0; k < 2; ++k) {
    for (int m = 0; m < 2; ++m) {
      const MethodScores& got = r->methods[static_cast<size_t>(2 * k + m)];
      EXPECT_EQ(got.method, m == 0 ? "full" : "other");
      EXPECT_EQ(got.kv_dtype, k == 0 ? "a" : "b");
      double nll = 0, kl_kv = 0, kl_kv_reversed = 0, kl_kv_shifted = 0, kl_full = 0;
      int n = 0, agree_kv = 0, agree_full = 0;
      for (const auto& w : windows) {
        for (size_t t = first; t < w.size(); ++t) {
          const auto q = row(k, phases[m], w[t - 1]);
          const auto same_on_a = row(0, phases[m], w[t - 1]);
          const auto full_here = row(k, 0.0, w[t - 1]);
          nll -= RefLogProbs(std::vector<double>(q.begin(), q.end()))[static_cast<size_t>(w[t])];
          kl_kv += RefKl(same_on_a, q);
          kl_kv_reversed += RefKl(q, same_on_a);
          kl_kv_shifted += RefKl(row(0, phases[m], w[t]), q);  // one position off
          kl_full += RefKl(full_here, q);
          agree_kv += RefArgmax(same_on_a) == RefArgmax(q) ? 1 : 0;
          agree_full += RefArgmax(full_here) == RefArgmax(q) ? 1 : 0;
          ++n;
        }
      }
      // Tolerance: both sides sum the same 40 double terms per row (|terms| <= ~10 each)
      // over 18 rows in another order, and exp/log differ by an ulp or so: the absolute
      // difference is below 18 * 40 * 10 * 2^-52 ~ 2e-12; 1e-10 leaves room.
      const double tol = 1e-10;
      EXPECT_EQ(got.scores.n_tokens(), n);
      EXPECT_NEAR(got.scores.mean_nll(), nll / n, tol);
      EXPECT_NEAR(got.vs_reference_kv.mean_kl(), kl_kv / n, tol) << k << " " << m;
      EXPECT_NEAR(got.scores.mean_kl(), kl_full / n, tol) << k << " " << m;
      EXPECT_DOUBLE_EQ(got.vs_reference_kv.top1_agreement(), static_cast<double>(agree_kv) / n);
      EXPECT_DOUBLE_EQ(got.scores.top1_agreement(), static_cast<double>(agree_full) / n);
      if (k == 1) {
        // The reference discriminates: KL the wrong way round, or one position off, is
        // far outside the tolerance.
        EXPECT_GT(std::fabs(kl_kv_reversed - kl_kv) / n, 1000 * tol);
        EXPECT_GT(std::fabs(kl_kv_shifted - kl_kv) / n, 1000 * tol);
        EXPECT_GT(got.vs_reference_kv.mean_kl(), 0.1);
      } else {
        EXPECT_EQ(got.vs_reference_kv.mean_kl(), 0.0);
        EXPECT_EQ(got.vs_reference_kv.top1_agreement(), 1.0);
      }
    }
  }

  // The JSON's perplexity change is against the same method on the first type.
  PerplexityRun run;
  run.kv_dtypes = {"a", "b"};
  run.lengths.push_back(*r);
  const nlohmann::json js = ToJson(run);
  ASSERT_EQ(js["results"].size(), 4u);
  EXPECT_EQ(js["reference_kv_dtype"], "a");
  const auto& b_other = js["results"][3];
  EXPECT_EQ(b_other["kv_dtype"], "b");
  EXPECT_EQ(b_other["method"], "other");
  EXPECT_NEAR(b_other["perplexity_vs_reference_kv_pct"].get<double>(),
              100 * (r->methods[3].scores.perplexity() / r->methods[1].scores.perplexity() - 1), 1e-9);
  EXPECT_NE(ToMarkdown(run).find("KL vs a KV"), std::string::npos);
}

TEST(KvTypeAxis, StopsAtATypeThatCannotBeSelected) {
  int variant = 0;
  WaveMethod full("full", 8, &variant, 0.0);
  const std::vector<KvTypePoint> kv = {{"a", [] { return OkStatus(); }},
                                       {"b", [] { return InvalidArgumentError("no such type"); }}};
  auto r = ScoreWindows({&full}, {{1, 2, 3}}, 1, 8, nullptr, kv);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("KV type b"), std::string::npos) << r.status().message();
}

// The axis on the engine (Engine::SetKvDtype on one loaded model) against engines loaded
// with each KV type, whose logits this test turns into KL and top-1 itself (float64).
TEST_F(PerplexityTest, KvTypeAxisMatchesEnginesLoadedWithEachType) {
  const int vocab = engine_->model().config().vocab_size;
  const auto windows = MakeWindows(*text_tokens_, engine_->tokenizer().bos_id(), 64, 2);
  const DType types[3] = {DType::kF32, DType::kF16, DType::kQ8_0};
  std::vector<KvTypePoint> kv;
  for (DType t : types) kv.push_back({DTypeName(t), [t] { return engine_->SetKvDtype(t); }});
  FullAttention full(*engine_);
  auto r = ScoreWindows({&full}, windows, 1, vocab, nullptr, kv);
  ASSERT_TRUE(engine_->SetKvDtype(DType::kF32).ok());  // the fixture's engine as it was
  EXPECT_EQ(engine_->SetKvDtype(DType::kBF16).code(), StatusCode::kInvalidArgument);  // not a KV type
  EXPECT_EQ(engine_->kv_pool().shape().k_dtype, DType::kF32);  // the pool unchanged
  EXPECT_EQ(engine_->kv_pool().shape().v_dtype, DType::kF32);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->methods.size(), 3u);

  // Reference logits: the fixture's f32 engine, then an engine loaded with each type.
  std::vector<std::vector<float>> ref;  // [window] f32 logits
  for (const auto& w : windows) {
    std::vector<float> l;
    ASSERT_TRUE(full.Score(w, 1, &l).ok());
    ref.push_back(l);
  }
  for (int k = 1; k < 3; ++k) {
    engine::EngineOptions o = engine_->options();
    o.kv_dtype = types[k];
    auto e = engine::Engine::Load(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    FullAttention typed(**e);
    double kl = 0, kl_reversed = 0, nll_ratio_num = 0;
    int n = 0, agree = 0;
    for (size_t w = 0; w < windows.size(); ++w) {
      std::vector<float> l;
      ASSERT_TRUE(typed.Score(windows[w], 1, &l).ok());
      for (size_t i = 0; i + 1 < windows[w].size(); ++i) {
        const std::vector<float> p(ref[w].begin() + static_cast<std::ptrdiff_t>(i * vocab),
                                   ref[w].begin() + static_cast<std::ptrdiff_t>((i + 1) * vocab));
        const std::vector<float> q(l.begin() + static_cast<std::ptrdiff_t>(i * vocab),
                                   l.begin() + static_cast<std::ptrdiff_t>((i + 1) * vocab));
        kl += RefKl(p, q);
        kl_reversed += RefKl(q, p);
        nll_ratio_num -= RefLogProbs(std::vector<double>(q.begin(), q.end()))[static_cast<size_t>(windows[w][i + 1])];
        agree += RefArgmax(p) == RefArgmax(q) ? 1 : 0;
        ++n;
      }
    }
    const ScoreAccumulator& got = r->methods[static_cast<size_t>(k)].vs_reference_kv;
    std::printf("%s KV vs f32 KV: KL(f32 || %s) %.6e (reversed %.6e), top-1 %.4f\n", DTypeName(types[k]),
                DTypeName(types[k]), kl / n, kl_reversed / n, static_cast<double>(agree) / n);
    EXPECT_EQ(r->methods[static_cast<size_t>(k)].kv_dtype, DTypeName(types[k]));
    EXPECT_EQ(got.n_tokens(), n);
    // The same f32 logits on both sides (one engine switched, one loaded with the type:
    // the same kernels on the same rows), so only the double sums' order differs: 126
    // rows of 512 terms of |p (lp - lq)| <= ~1e-2 each: below 126 * 512 * 1e-2 * 2^-52
    // ~ 1.5e-13 absolute; 1e-12 leaves room and is far below KL itself (~1e-5 and up).
    EXPECT_NEAR(got.mean_kl(), kl / n, 1e-12);
    EXPECT_GT(got.mean_kl(), 0.0);  // the types do differ
    // q8_0 moves the distributions enough that KL the wrong way round is far outside the
    // tolerance (measured: 1.42e-3 against 1.45e-3); f16's two directions agree to ~4e-10.
    if (types[k] == DType::kQ8_0) {
      EXPECT_GT(std::fabs(kl_reversed - kl) / n, 1e-6);
    }
    EXPECT_DOUBLE_EQ(got.top1_agreement(), static_cast<double>(agree) / n);
    EXPECT_NEAR(r->methods[static_cast<size_t>(k)].scores.mean_nll(), nll_ratio_num / n, 1e-12);
  }
}

TEST(MethodsAxis, StartsWithFullAndRejectsUnknownNames) {
  auto a = MethodsAxis({});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, std::vector<std::string>{"full"});
  auto b = MethodsAxis({"full", "full"});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, std::vector<std::string>{"full"});
  auto c = MethodsAxis({"pq-top-k"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("full"), std::string::npos) << c.status().message();
}

}  // namespace
}  // namespace attic::eval
