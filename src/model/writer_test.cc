// Write -> load round trips of tiny models in every format and dtype, and checks that
// written GGUF files satisfy an independent reader (llamacpp-anchor/make_gguf.py).
#include "attic/model/writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "attic/core/file.h"
#include "model/gguf_file.h"
#include "model/test_models.h"
#include "test_util.h"

namespace attic::model {
namespace {

using testing::LoadedTensors;
using testing::RoundTo;
using testing::TinyConfig;
using testing::TinyTensors;

std::string Shared() { return attic::testing::SharedDir(); }

// Loads `path` and checks every tensor against `tensors` stored as `dtype` (norms and
// biases: exact f32 in GGUF, `dtype`-rounded in HF).
void ExpectRoundTrip(const std::string& path, const ModelConfig& c, const std::vector<NamedTensor>& tensors,
                     DType dtype, bool gguf) {
  auto m = Model::Load(path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->is_gguf(), gguf);
  EXPECT_EQ((*m)->weight_dtype(), dtype);
  EXPECT_EQ(CanonicalConfigString((*m)->config()), CanonicalConfigString(c));
  EXPECT_EQ((*m)->config().tie_word_embeddings, c.tie_word_embeddings);
  auto loaded = LoadedTensors(**m);
  for (const NamedTensor& t : tensors) {
    ASSERT_TRUE(loaded.count(t.name)) << t.name;
    const bool vector = t.shape.size() == 1;
    std::vector<float> expect = gguf && vector ? t.data : RoundTo(dtype, t.data);
    ASSERT_EQ(loaded[t.name], expect) << t.name << " in " << path;
  }
  if (c.tie_word_embeddings) {
    EXPECT_EQ((*m)->weights().lm_head.data, (*m)->weights().tok_embeddings.data);
  }
}

class RoundTripTest : public ::testing::TestWithParam<DType> {};

TEST_P(RoundTripTest, HfSingleShardedAndGguf) {
  const DType dtype = GetParam();
  attic::testing::TempDir tmp;
  ModelConfig c = TinyConfig();
  auto tensors = TinyTensors(c);
  WriteOptions opts;
  opts.dtype = dtype;

  ASSERT_TRUE(WriteHfModel(tmp.File("hf"), c, tensors, opts).ok());
  EXPECT_TRUE(FileExists(tmp.File("hf/model.safetensors")));
  ExpectRoundTrip(tmp.File("hf"), c, tensors, dtype, false);

  WriteOptions sharded = opts;
  sharded.max_shard_bytes = 8 << 10;
  ASSERT_TRUE(WriteHfModel(tmp.File("sharded"), c, tensors, sharded).ok());
  EXPECT_FALSE(FileExists(tmp.File("sharded/model.safetensors")));
  EXPECT_TRUE(FileExists(tmp.File("sharded/model.safetensors.index.json")));
  int shards = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.File("sharded"))) {
    shards += e.path().filename().string().rfind("model-", 0) == 0;
  }
  EXPECT_GE(shards, 3);
  ExpectRoundTrip(tmp.File("sharded"), c, tensors, dtype, false);

  ASSERT_TRUE(WriteGgufModel(tmp.File("m.gguf"), c, tensors, opts).ok());
  ExpectRoundTrip(tmp.File("m.gguf"), c, tensors, dtype, true);

  // The same weights as HF and GGUF: same fingerprint (f32 only: HF rounds norms to dtype).
  if (dtype == DType::kF32) {
    auto a = Model::Load(tmp.File("hf"));
    auto b = Model::Load(tmp.File("m.gguf"));
    auto d = Model::Load(tmp.File("sharded"));
    ASSERT_TRUE(a.ok() && b.ok() && d.ok());
    EXPECT_EQ((*a)->fingerprint(), (*b)->fingerprint());
    EXPECT_EQ((*a)->fingerprint(), (*d)->fingerprint());
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, RoundTripTest, ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(WriterTest, Variants) {
  attic::testing::TempDir tmp;
  struct Case {
    const char* name;
    ModelConfig c;
  };
  std::vector<Case> cases;
  ModelConfig mha = TinyConfig();
  mha.n_kv_heads = mha.n_heads;
  cases.push_back({"mha", mha});
  ModelConfig tied = TinyConfig();
  tied.tie_word_embeddings = true;
  cases.push_back({"tied", tied});
  ModelConfig wide = TinyConfig();
  wide.head_dim = 16;  // head_dim * heads != hidden: GGUF key_length
  cases.push_back({"wide_heads", wide});
  ModelConfig linear = TinyConfig();
  linear.rope_scaling = {RopeScalingType::kLinear, 2.0f};
  cases.push_back({"rope_linear", linear});
  ModelConfig llama3 = TinyConfig();
  llama3.head_dim = 64;
  llama3.rope_theta = 500000.0f;
  llama3.rope_scaling = {RopeScalingType::kLlama3, 32.0f, 1.0f, 4.0f, 64};
  cases.push_back({"rope_llama3", llama3});
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    auto tensors = TinyTensors(k.c, 11);
    WriteOptions opts;
    opts.dtype = DType::kBF16;
    ASSERT_TRUE(WriteHfModel(tmp.File(std::string(k.name) + "_hf"), k.c, tensors, opts).ok());
    ExpectRoundTrip(tmp.File(std::string(k.name) + "_hf"), k.c, tensors, DType::kBF16, false);
    auto st = WriteGgufModel(tmp.File(std::string(k.name) + ".gguf"), k.c, tensors, opts);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectRoundTrip(tmp.File(std::string(k.name) + ".gguf"), k.c, tensors, DType::kBF16, true);
  }
}

TEST(WriterTest, Qwen2BiasesHfOnly) {
  attic::testing::TempDir tmp;
  ModelConfig c = TinyConfig();
  c.architecture = "Qwen2ForCausalLM";
  c.attention_bias = true;
  auto tensors = TinyTensors(c);
  ASSERT_TRUE(WriteHfModel(tmp.File("qwen"), c, tensors, {}).ok());
  ExpectRoundTrip(tmp.File("qwen"), c, tensors, DType::kF32, false);
  auto m = Model::Load(tmp.File("qwen"));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->config().architecture, "Qwen2ForCausalLM");
  EXPECT_NE((*m)->weights().layers[1].bk, nullptr);
  EXPECT_EQ(WriteGgufModel(tmp.File("qwen.gguf"), c, tensors, {}).code(), StatusCode::kUnimplemented);
}

TEST(WriterTest, RandomHfAndGgufHoldTheSameWeights) {
  attic::testing::TempDir tmp;
  ModelConfig c = TinyConfig();
  c.tie_word_embeddings = true;
  RandomWeights r{42, 0.02f};
  WriteOptions opts;
  opts.dtype = DType::kBF16;
  uint64_t done = 0, total = 0;
  opts.progress = [&](uint64_t d, uint64_t t) { done = d, total = t; };
  ASSERT_TRUE(WriteRandomHfModel(tmp.File("hf"), c, r, opts).ok());
  EXPECT_EQ(done, total);
  ASSERT_TRUE(WriteRandomGgufModel(tmp.File("m.gguf"), c, r, opts).ok());
  EXPECT_EQ(done, total);
  auto a = Model::Load(tmp.File("hf"));
  auto b = Model::Load(tmp.File("m.gguf"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->fingerprint(), (*b)->fingerprint());  // norms are 1: exact in bf16
  auto expect = RandomTensors(c, r);
  ExpectRoundTrip(tmp.File("m.gguf"), c, expect, DType::kBF16, true);
  // Roughly N(0, 0.02).
  const std::vector<float>& q = expect[2].data;
  double sum = 0, sq = 0;
  for (float x : q) sum += x, sq += static_cast<double>(x) * x;
  EXPECT_NEAR(sum / q.size(), 0.0, 0.003);
  EXPECT_NEAR(std::sqrt(sq / q.size()), 0.02, 0.003);
  // A different seed gives different weights.
  auto other = RandomTensors(c, RandomWeights{43, 0.02f});
  EXPECT_NE(other[2].data, q);
}

TEST(WriterTest, TokenizerFilesAndEmbeddedGpt2Tokenizer) {
  attic::testing::TempDir tmp;
  const std::string tok_dir = Shared() + "/models/smollm2-135m-instruct-tokenizer";
  ModelConfig c = TinyConfig();
  c.vocab_size = 49152;
  c.tie_word_embeddings = true;
  WriteOptions opts;
  opts.dtype = DType::kF16;
  opts.tokenizer.tokenizer_json_path = tok_dir + "/tokenizer.json";
  auto tmpl = ReadFileToString(tok_dir + "/chat_template.jinja");
  ASSERT_TRUE(tmpl.ok());
  opts.tokenizer.chat_template = *tmpl;
  ASSERT_TRUE(WriteRandomHfModel(tmp.File("hf"), c, {}, opts).ok());
  ASSERT_TRUE(WriteRandomGgufModel(tmp.File("m.gguf"), c, {}, opts).ok());

  auto hf = Model::Load(tmp.File("hf"));
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  EXPECT_EQ((*hf)->tokenizer_json_path(), tmp.File("hf/tokenizer.json"));
  EXPECT_EQ((*hf)->chat_template(), *tmpl);
  auto gg = Model::Load(tmp.File("m.gguf"));
  ASSERT_TRUE(gg.ok()) << gg.status().ToString();
  EXPECT_EQ((*gg)->chat_template(), *tmpl);
  const GgufTokenizerData* t = (*gg)->gguf_tokenizer();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->model, "gpt2");
  EXPECT_EQ(t->pre, "smollm");
  EXPECT_EQ(t->tokens.size(), 49152u);
  EXPECT_EQ(t->tokens[0], "<|endoftext|>");
  EXPECT_EQ(t->token_types[1], 3);  // <|im_start|>: control
  EXPECT_EQ(t->token_types[1000], 1);
  EXPECT_GT(t->merges.size(), 40000u);
  EXPECT_EQ(t->merges[0].find(' ') != std::string::npos, true);
  EXPECT_EQ(t->bos_id, 1);
  EXPECT_EQ(t->eos_id, 2);
  EXPECT_FALSE(t->add_bos);
  EXPECT_EQ(t->chat_template, *tmpl);
  EXPECT_EQ((*gg)->fingerprint(), (*hf)->fingerprint());
}

TEST(WriterTest, GgufQ8_0) {
  attic::testing::TempDir tmp;
  ModelConfig c = TinyConfig();
  c.intermediate_size = 64;  // q8_0 rows must be whole blocks of 32
  auto tensors = TinyTensors(c);
  WriteOptions opts;
  opts.dtype = DType::kQ8_0;
  EXPECT_EQ(WriteHfModel(tmp.File("hf"), c, tensors, opts).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteGgufModel(tmp.File("q8.gguf"), c, tensors, opts).ok());
  ExpectRoundTrip(tmp.File("q8.gguf"), c, tensors, DType::kQ8_0, true);
  auto m = Model::Load(tmp.File("q8.gguf"));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->weights().layers[0].wk.dtype, DType::kQ8_0);
  EXPECT_EQ((*m)->weights().layers[0].wk.row(1) - (*m)->weights().layers[0].wk.row(0), 34);
  c.intermediate_size = 48;
  EXPECT_EQ(WriteGgufModel(tmp.File("bad.gguf"), c, TinyTensors(c), opts).code(), StatusCode::kInvalidArgument);
}

// llama.cpp's converter stores Llama 3 RoPE scaling only as rope_freqs.weight; without
// Attic's own keys the loader fits the standard Llama 3 parameters to it.
TEST(WriterTest, GgufLlama3ScalingFromRopeFreqsAlone) {
  attic::testing::TempDir tmp;
  ModelConfig c = TinyConfig();
  c.head_dim = 64;
  c.rope_theta = 500000.0f;
  c.rope_scaling = {RopeScalingType::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
  ASSERT_TRUE(WriteGgufModel(tmp.File("l3.gguf"), c, TinyTensors(c), {}).ok());
  std::string bytes = testing::ReadBytes(tmp.File("l3.gguf"));
  for (size_t p; (p = bytes.find("attic.rope_scaling")) != std::string::npos;) bytes[p] = 'X';
  testing::WriteBytes(tmp.File("l3.gguf"), bytes);
  auto m = Model::Load(tmp.File("l3.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(CanonicalConfigString((*m)->config()), CanonicalConfigString(c));

  auto f = ParseGguf(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "l3.gguf");
  ASSERT_TRUE(f.ok());
  const GgufTensorInfo* freqs = f->FindTensor("rope_freqs.weight");
  ASSERT_NE(freqs, nullptr);
  size_t off = static_cast<size_t>(freqs->data - reinterpret_cast<const uint8_t*>(bytes.data()));
  float bumped = 3.0f;  // a factor no Llama 3 scaling produces at that frequency
  std::memcpy(bytes.data() + off + 4 * 20, &bumped, 4);
  testing::WriteBytes(tmp.File("l3.gguf"), bytes);
  EXPECT_EQ(Model::Load(tmp.File("l3.gguf")).status().code(), StatusCode::kUnimplemented);
}

// make_gguf.py (numpy) is an independent GGUF reader; skipped when it cannot run.
TEST(WriterTest, IndependentReaderParsesOurGguf) {
  const std::string tool = Shared() + "/tools/llamacpp-anchor/make_gguf.py";
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0 || !FileExists(tool)) {
    GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
  }
  attic::testing::TempDir tmp;
  ModelConfig c = TinyConfig();
  c.vocab_size = 49152;
  c.tie_word_embeddings = false;
  WriteOptions opts;
  opts.dtype = DType::kBF16;
  opts.tokenizer.tokenizer_json_path = Shared() + "/models/smollm2-135m-instruct-tokenizer/tokenizer.json";
  ASSERT_TRUE(WriteRandomGgufModel(tmp.File("m.gguf"), c, {}, opts).ok());
  const std::string out = tmp.File("info.txt");
  std::string cmd = "/usr/bin/python3 " + tool + " info --max-tensors 100 " + tmp.File("m.gguf") + " > " + out + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << testing::ReadBytes(out);
  std::string info = testing::ReadBytes(out);
  EXPECT_NE(info.find("GGUF v3: "), std::string::npos) << info;
  EXPECT_NE(info.find("21 tensors"), std::string::npos) << info;
  EXPECT_NE(info.find("general.architecture = 8:'llama'"), std::string::npos) << info;
  EXPECT_NE(info.find("tokenizer.ggml.pre = 8:'smollm'"), std::string::npos) << info;
  EXPECT_NE(info.find("llama.attention.head_count_kv = 4:2"), std::string::npos) << info;
  EXPECT_NE(info.find("blk.1.ffn_down.weight"), std::string::npos) << info;
  EXPECT_NE(info.find("ne=[32, 49152] BF16"), std::string::npos) << info;

  // Its rebuild path reads every tensor back through numpy and rewrites the file.
  cmd = "/usr/bin/python3 " + tool + " rebuild --src " + tmp.File("m.gguf") + " --dtype bf16 --out " +
        tmp.File("re.gguf") + " > " + out + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << testing::ReadBytes(out);
  auto a = Model::Load(tmp.File("m.gguf"));
  auto b = Model::Load(tmp.File("re.gguf"));
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  EXPECT_EQ((*a)->fingerprint(), (*b)->fingerprint());
}

}  // namespace
}  // namespace attic::model
