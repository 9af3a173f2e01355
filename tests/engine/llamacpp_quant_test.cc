// Greedy continuations on block-quantized files agree with llama.cpp on the same files:
// stories260K quantized by llama.cpp's own quantizer (every matrix in one type), 64 greedy
// tokens for each prompt of the golden reference, Attic's against llama.cpp's (`cbench
// golden`, the prebuilt libllama of ../shared/tools/llamacpp-anchor).
//
// The two engines round differently (llama.cpp quantizes activations to q8_0 / q8_1 for
// these types, Attic to its own 8-bit blocks; sums in other orders), so a token whose
// two best logits are closer than that rounding may go either way: a divergence must be
// such a near tie (the bound is derived at ExpectSameGreedyTokens).
//
// Needs the harness built in out/anchor (`make test` builds it: scripts/setup-llamacpp.sh;
// ATTIC_LLAMACPP_ANCHOR overrides the folder); skipped, saying why, without it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "attic/core/file.h"
#include "attic/engine/engine.h"
#include "attic/model/gguf_quantize.h"
#include "attic/model/model.h"
#include "reference/naive_llama.h"
#include "test_util.h"

namespace attic::engine {
namespace {

using attic::testing::SharedDir;

std::string AnchorDir() {
  if (const char* env = std::getenv("ATTIC_LLAMACPP_ANCHOR")) return env;
  return attic::testing::SourceDir() + "/out/anchor";
}
std::string LlamaEnv() {
  return "LLAMA_BIN_DIR=" + AnchorDir() + "/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 ";
}
std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Single-quoted for the shell.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class LlamaCppQuantTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!FileExists(AnchorDir() + "/out/quantize") || !FileExists(AnchorDir() + "/out/cbench")) {
      GTEST_SKIP() << "llama.cpp's harness is not built in " << AnchorDir();
    }
  }
  attic::testing::TempDir tmp_;
};

// The float64 forward (tests/reference/naive_llama.h) on the model's weights as loaded
// (dequantized exactly: src/model/quant_formats_test.cc).
struct NaiveModel {
  attic::testing::NaiveConfig c;
  attic::testing::NaiveWeights w;
};
std::vector<float> Widen(const WeightTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  ConvertToF32(t.dtype, t.data, v.data(), v.size());
  return v;
}
NaiveModel NaiveOf(const model::Model& m) {
  const model::ModelConfig& c = m.config();
  const model::ModelWeights& W = m.weights();
  NaiveModel n;
  n.c.hidden = c.hidden_size, n.c.intermediate = c.intermediate_size, n.c.n_layers = c.n_layers;
  n.c.n_heads = c.n_heads, n.c.n_kv_heads = c.n_kv_heads, n.c.head_dim = c.head_dim, n.c.vocab = c.vocab_size;
  n.c.eps = c.rms_norm_eps, n.c.theta = c.rope_theta;
  auto vec = [&](const float* p) { return std::vector<float>(p, p + c.hidden_size); };
  n.w.embed = Widen(W.tok_embeddings);
  n.w.final_norm = vec(W.final_norm);
  if (W.lm_head.data != W.tok_embeddings.data) n.w.lm_head = Widen(W.lm_head);
  for (const model::LayerWeights& L : W.layers) {
    attic::testing::NaiveLayer l;
    l.attn_norm = vec(L.attn_norm), l.ffn_norm = vec(L.ffn_norm);
    l.wq = Widen(L.wq), l.wk = Widen(L.wk), l.wv = Widen(L.wv), l.wo = Widen(L.wo);
    l.gate = Widen(L.w_gate), l.up = Widen(L.w_up), l.down = Widen(L.w_down);
    n.w.layers.push_back(std::move(l));
  }
  return n;
}

// Attic's and llama.cpp's greedy tokens on `file`, for every golden prompt, must be the
// same, or differ first at a near tie. Both engines round the activations of every
// block-quantized product to 8 bits per block of 32 (llama.cpp to q8_0/q8_1, Attic to its
// own blocks), which moves a logit by some delta from the exact (float64) forward on the
// same weights; Attic's delta_A is measured at the step, llama.cpp's is taken to be at
// most twice it (the same rounding, plus its f16 KV cache). llama.cpp ranking token b
// over Attic's a means exact(a) - exact(b) <= 2 delta_L (each logit moves by at most
// delta_L), so Attic's gap A(a) - A(b) <= 2 delta_L + 2 delta_A <= 6 delta_A: a
// divergence above that fails. After a
// divergence the texts differ, so that prompt ends there; each divergence is printed
// with its gap ("[ near tie ]", docs/engine.md).
void ExpectSameGreedyTokens(const std::string& file, const std::string& type, const attic::testing::TempDir& tmp) {
  EngineOptions o;
  o.model_path = file;
  o.n_threads = 2;
  auto e = Engine::Load(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const NaiveModel naive = NaiveOf((*e)->model());
  auto golden = nlohmann::json::parse(ReadAll(SharedDir() + "/models/stories260K-hf/golden_reference.json"));
  for (const auto& c : golden["cases"]) {
    const std::string prompt = c["prompt"];
    SCOPED_TRACE("prompt '" + prompt + "'");
    const std::string out = tmp.File("golden.json");
    // One llama.cpp thread: its 2-thread graph meets at a spinning barrier, and under
    // `ctest -j2` on 2 cores a descheduled partner stalls every op (one case took 4.5 to
    // 106 s beside two busy loops, 0.4 s alone). Its greedy tokens on these files are the
    // same with 1 and 2 threads (each output row is one thread's dot products).
    const std::string cmd = LlamaEnv() + AnchorDir() + "/out/cbench golden -t 1 -m " + file + " -g " + Quote(prompt) +
                            " -n 64 -o " + out + " > " + tmp.File("c.log") + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << ReadAll(tmp.File("c.log"));
    auto ref = nlohmann::json::parse(ReadAll(out));
    const auto prompt_ids = ref["promptIds"].get<std::vector<int32_t>>();
    const auto want = ref["greedyIds"].get<std::vector<int32_t>>();
    auto ids = (*e)->Tokenize(prompt, true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, prompt_ids);

    Session s(**e);
    auto logits = s.Prefill(prompt_ids);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    std::vector<int> context(prompt_ids.begin(), prompt_ids.end());
    for (size_t i = 0; i < want.size(); ++i) {
      const std::vector<float>& l = *logits;
      const int32_t got = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      if (got != want[i]) {
        const std::vector<double> exact = attic::testing::NaiveForward(naive.c, naive.w, context).back();
        double delta_a = 0;
        for (size_t v = 0; v < l.size(); ++v) delta_a = std::max(delta_a, std::fabs(l[v] - exact[v]));
        const double gap = l[static_cast<size_t>(got)] - l[static_cast<size_t>(want[i])];
        std::printf("[ near tie ] %s '%s' token %zu: Attic %d, llama.cpp %d; Attic's logit gap %.4f, its largest "
                    "deviation from float64 %.4f, the exact gap %.4f\n",
                    type.c_str(), prompt.c_str(), i, got, want[i], gap, delta_a,
                    exact[static_cast<size_t>(got)] - exact[static_cast<size_t>(want[i])]);
        EXPECT_LE(gap, 6 * delta_a) << type << ": token " << i << " is " << got << " in Attic, " << want[i]
                                    << " in llama.cpp";
        break;
      }
      context.push_back(got);
      if (i + 1 < want.size()) {
        logits = s.Step(got);
        ASSERT_TRUE(logits.ok()) << logits.status().ToString();
      }
    }
  }
}

// Files quantized by llama.cpp.
TEST_P(LlamaCppQuantTest, GreedyTokensAgreeWithLlamaCpp) {
  const std::string type = GetParam();
  const std::string file = tmp_.File(type + ".gguf");
  std::string cmd = LlamaEnv() + AnchorDir() + "/out/quantize " + SharedDir() +
                    "/models/stories260K-gguf/stories260K.gguf " + file + " " + type + " --pure > " +
                    tmp_.File("q.log") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << ReadAll(tmp_.File("q.log"));
  {
    auto m = model::Model::Load(file);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto want_dtype = ParseDType(type);
    ASSERT_TRUE(want_dtype.ok());
    EXPECT_EQ((*m)->weights().layers[0].w_up.dtype, *want_dtype);
  }
  ExpectSameGreedyTokens(file, type, tmp_);
}

// Files quantized by Attic (`attic quantize`): llama.cpp loads them and agrees.
class AtticQuantizedTest : public LlamaCppQuantTest {};

TEST_P(AtticQuantizedTest, LlamaCppLoadsThemAndAgrees) {
  const std::string type = GetParam();
  const std::string file = tmp_.File("attic-" + type + ".gguf");
  auto preset = model::ParseQuantPreset(type);
  ASSERT_TRUE(preset.ok());
  ASSERT_TRUE(model::QuantizeGgufFile(SharedDir() + "/models/stories260K-gguf/stories260K.gguf", file, *preset).ok());
  ExpectSameGreedyTokens(file, type, tmp_);
}

INSTANTIATE_TEST_SUITE_P(Types, AtticQuantizedTest, ::testing::Values("q4_0", "q8_0", "q4_k_m"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

INSTANTIATE_TEST_SUITE_P(Types, LlamaCppQuantTest, ::testing::Values("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
}  // namespace attic::engine
