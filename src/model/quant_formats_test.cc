// GGUF block formats (q4_0 ... iq4_xs): files made by llama.cpp's own quantizer load, and
// Attic's dequantized values equal, bit for bit, those of an independent implementation of
// the format definitions (tests/reference/gguf_dequant_ref.py, numpy).
//
// Needs llama.cpp's quantizer (the harness of ../shared/tools/llamacpp-anchor built into
// out/anchor, as `make test` sets it up (scripts/setup-llamacpp.sh); ATTIC_LLAMACPP_ANCHOR overrides
// the folder) and /usr/bin/python3 with numpy; skipped, saying why, without them.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "attic/core/file.h"
#include "attic/model/gguf_quantize.h"
#include "attic/model/model.h"
#include "attic/model/writer.h"
#include "model/gguf_file.h"
#include "test_util.h"

namespace attic::model {
namespace {

std::string AnchorDir() {
  if (const char* env = std::getenv("ATTIC_LLAMACPP_ANCHOR")) return env;
  return attic::testing::SourceDir() + "/out/anchor";
}

std::string QuantizeTool() { return AnchorDir() + "/out/quantize"; }
std::string LlamaBinDir() { return AnchorDir() + "/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"; }

std::string SkipReason() {
  if (!FileExists(QuantizeTool())) return "llama.cpp's quantizer is not built at " + QuantizeTool();
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) return "/usr/bin/python3 lacks numpy";
  return "";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// llama.cpp's quantizer: IN -> OUT as TYPE (a ggml type or a preset such as Q4_K_M). Its
// tool names the K types only by their presets: with --pure, Q3_K_M/Q4_K_M/Q5_K_M put
// every matrix in Q3_K/Q4_K/Q5_K.
void Quantize(const std::string& in, const std::string& out, const std::string& type, bool pure) {
  const std::string log = out + ".log";
  const std::string tool_type = pure && (type == "Q3_K" || type == "Q4_K" || type == "Q5_K") ? type + "_M" : type;
  const std::string cmd = "LLAMA_BIN_DIR=" + LlamaBinDir() + " " + QuantizeTool() + " " + in + " " + out + " " +
                          tool_type + (pure ? " --pure" : "") + " > " + log + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << ReadAll(log);
}

// Writes Attic's f32 values of every tensor of a type Attic reads, in file order.
void DumpDequantized(const std::string& gguf, const std::string& out) {
  auto mapped = MappedFile::Open(gguf);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  auto f = ParseGguf((*mapped)->data(), (*mapped)->size(), gguf);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::FILE* fp = std::fopen(out.c_str(), "wb");
  ASSERT_NE(fp, nullptr);
  std::vector<float> buf;
  for (const GgufTensorInfo& t : f->tensors) {
    if (!t.dtype) continue;
    uint64_t n = 1;
    for (uint64_t d : t.ne) n *= d;
    buf.resize(n);
    ConvertToF32(*t.dtype, t.data, buf.data(), n);
    ASSERT_EQ(std::fwrite(buf.data(), 4, n, fp), n);
  }
  std::fclose(fp);
}

// The ggml type names of a file's tensors, with counts.
std::map<std::string, int> TypesIn(const std::string& gguf) {
  std::map<std::string, int> out;
  auto mapped = MappedFile::Open(gguf);
  if (!mapped.ok()) return out;
  auto f = ParseGguf((*mapped)->data(), (*mapped)->size(), gguf);
  if (!f.ok()) return out;
  for (const GgufTensorInfo& t : f->tensors) out[GgmlTypeName(t.ggml_type)]++;
  return out;
}

void ExpectMatchesReference(const std::string& gguf) {
  const std::string dump = gguf + ".f32", log = gguf + ".ref.log";
  DumpDequantized(gguf, dump);
  const std::string cmd = "/usr/bin/python3 " + attic::testing::SourceDir() + "/tests/reference/gguf_dequant_ref.py " +
                          gguf + " " + dump + " > " + log + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << ReadAll(log);
  std::remove(dump.c_str());
}

// A random-weight f32 model whose rows are multiples of 256, so K-quants and iq4_xs
// apply to every matrix (stories260K's 64-wide rows take only the 32-blocks).
class QuantFormatsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_ = SkipReason();
    if (!skip_.empty()) return;
    tmp_ = new attic::testing::TempDir();
    ModelConfig c;
    c.architecture = "LlamaForCausalLM";
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 64;
    c.vocab_size = 512;
    c.max_position_embeddings = 256;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.tie_word_embeddings = false;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    c.torch_dtype = DType::kF32;
    WriteOptions wo;
    wo.dtype = DType::kF32;
    wo.tokenizer.tokenizer_json_path = attic::testing::SharedDir() + "/models/stories260K-hf/tokenizer.json";
    Status st = WriteRandomGgufModel(tmp_->File("f32.gguf"), c, RandomWeights(), wo);
    if (!st.ok()) skip_ = "cannot write the f32 model: " + st.ToString();
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
  }
  static std::string skip_;
  static attic::testing::TempDir* tmp_;
};
std::string QuantFormatsTest::skip_;
attic::testing::TempDir* QuantFormatsTest::tmp_ = nullptr;

class PureTypeTest : public QuantFormatsTest, public ::testing::WithParamInterface<const char*> {};

// Every matrix in one type (--pure): it loads as that type and dequantizes as defined.
TEST_P(PureTypeTest, LoadsAndDequantizesAsDefined) {
  const std::string type = GetParam();
  const std::string out = tmp_->File(type + ".gguf");
  ASSERT_NO_FATAL_FAILURE(Quantize(tmp_->File("f32.gguf"), out, type, /*pure=*/true));
  std::map<std::string, int> types = TypesIn(out);
  EXPECT_GE(types[type], 14) << "the 2 layers' 7 matrices are " << type;
  auto m = Model::Load(out);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto want = ParseDType(type);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ((*m)->weights().layers[1].w_down.dtype, *want);
  EXPECT_EQ((*m)->weights().layers[0].wq.dtype, *want);
  ExpectMatchesReference(out);
}

INSTANTIATE_TEST_SUITE_P(Types, PureTypeTest,
                         ::testing::Values("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                                           "Q6_K", "IQ4_NL", "IQ4_XS"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// llama.cpp's mixes: several types in one file.
TEST_F(QuantFormatsTest, MixedPresetsLoad) {
  for (const char* preset : {"Q4_K_M", "Q3_K_M", "Q5_K_S", "Q2_K"}) {
    SCOPED_TRACE(preset);
    const std::string out = tmp_->File(std::string(preset) + "-mix.gguf");
    ASSERT_NO_FATAL_FAILURE(Quantize(tmp_->File("f32.gguf"), out, preset, /*pure=*/false));
    std::map<std::string, int> types = TypesIn(out);
    int block_types = 0;
    for (const auto& [name, n] : types) block_types += name != "F32" ? 1 : 0;
    EXPECT_GE(block_types, 2) << "a preset mixes types";
    auto m = Model::Load(out);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ExpectMatchesReference(out);
  }
}

// stories260K (64-wide rows) under a K preset falls back to the 32-blocks.
TEST_F(QuantFormatsTest, StoriesUnderAKPresetFallsBack) {
  const std::string out = tmp_->File("stories-q4_k_m.gguf");
  ASSERT_NO_FATAL_FAILURE(
      Quantize(attic::testing::SharedDir() + "/models/stories260K-gguf/stories260K.gguf", out, "Q4_K_M", false));
  auto m = Model::Load(out);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectMatchesReference(out);
}

// Rewrites the ggml type of tensor `name` in a GGUF's bytes (the u32 after its name,
// n_dims and ne[] in the tensor table); returns the old type.
uint32_t Retype(std::string* bytes, const std::string& name, int n_dims, uint32_t type) {
  size_t at = bytes->find(name);
  EXPECT_NE(at, std::string::npos);
  if (at == std::string::npos) return 0;
  at += name.size() + 4 + 8 * static_cast<size_t>(n_dims);
  uint32_t old;
  std::memcpy(&old, bytes->data() + at, 4);
  std::memcpy(bytes->data() + at, &type, 4);
  return old;
}

std::string Q4_0File(attic::testing::TempDir* tmp) {
  const std::string path = tmp->File("Q4_0.gguf");
  if (!FileExists(path)) Quantize(tmp->File("f32.gguf"), path, "Q4_0", true);
  return path;
}

// A type Attic does not compute names itself and the supported ones.
TEST_F(QuantFormatsTest, UnsupportedTypeIsAClearError) {
  std::string bytes = ReadAll(Q4_0File(tmp_));
  ASSERT_EQ(Retype(&bytes, "blk.0.attn_q.weight", 2, 16), 2u);  // Q4_0 -> IQ2_XXS
  std::ofstream(tmp_->File("iq2.gguf"), std::ios::binary) << bytes;
  auto m = Model::Load(tmp_->File("iq2.gguf"));
  ASSERT_FALSE(m.ok());
  const std::string msg = m.status().ToString();
  EXPECT_NE(msg.find("'blk.0.attn_q.weight' has ggml type IQ2_XXS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, "
                     "IQ4_XS"),
            std::string::npos)
      << msg;
}

// The fingerprint (which every KV entry carries) covers the weight types, not only the
// bytes: q4_0 and iq4_nl blocks have the same size, so retyping one matrix gives a
// file of the same bytes elsewhere and the same tensor data, computing other weights.
TEST_F(QuantFormatsTest, FingerprintCoversTheWeightTypes) {
  const std::string q4 = Q4_0File(tmp_);
  std::string bytes = ReadAll(q4);
  ASSERT_EQ(Retype(&bytes, "blk.1.ffn_up.weight", 2, 20), 2u);  // Q4_0 -> IQ4_NL
  std::ofstream(tmp_->File("retyped.gguf"), std::ios::binary) << bytes;
  auto a = Model::Load(q4);
  auto b = Model::Load(tmp_->File("retyped.gguf"));
  auto f = Model::Load(tmp_->File("f32.gguf"));
  ASSERT_TRUE(a.ok() && b.ok() && f.ok());
  EXPECT_EQ((*b)->weights().layers[1].w_up.dtype, DType::kIQ4_NL);
  EXPECT_EQ(std::memcmp((*a)->weights().layers[1].w_up.data, (*b)->weights().layers[1].w_up.data,
                        DTypeBytes(DType::kQ4_0, 512 * 256)),
            0);
  EXPECT_NE((*a)->fingerprint(), (*b)->fingerprint());
  EXPECT_NE((*a)->fingerprint(), (*f)->fingerprint());
  // And it is stable: the same file loads to the same fingerprint.
  auto a2 = Model::Load(q4);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ((*a)->fingerprint(), (*a2)->fingerprint());
}


// Attic's quantizer (llama.cpp's reference algorithms, written here) against llama.cpp's
// own on the same f32 file: the same type for every tensor and the same blocks. The
// 32-blocks' arithmetic is a handful of f32 operations in a fixed order, so their bytes
// must be identical; the K-quants' searches sum in f32 loops that a compiler may contract
// into FMAs (llama.cpp's build) or not (Attic's), so a block whose search ends in a near
// tie may pick the neighbouring scale: at most 1% of those blocks may differ, each by
// construction an equally valid encoding.
class QuantizerTest : public QuantFormatsTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(QuantizerTest, SameTypesAndBlocksAsLlamaCpp) {
  const std::string type = GetParam();
  const bool pure = type.find("_K_") == std::string::npos;
  const std::string ref = tmp_->File("ref-" + type + ".gguf"), ours = tmp_->File("ours-" + type + ".gguf");
  ASSERT_NO_FATAL_FAILURE(Quantize(tmp_->File("f32.gguf"), ref, type, pure));
  auto preset = ParseQuantPreset(type);
  ASSERT_TRUE(preset.ok()) << preset.status().ToString();
  ASSERT_TRUE(QuantizeGgufFile(tmp_->File("f32.gguf"), ours, *preset).ok());
  auto ma = MappedFile::Open(ref);
  auto mb = MappedFile::Open(ours);
  ASSERT_TRUE(ma.ok() && mb.ok());
  auto a = ParseGguf((*ma)->data(), (*ma)->size(), ref);
  auto b = ParseGguf((*mb)->data(), (*mb)->size(), ours);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  uint64_t kblocks = 0, kdiff = 0;
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    const GgufTensorInfo& ta = a->tensors[i];
    const GgufTensorInfo* tb = b->FindTensor(ta.name);
    ASSERT_NE(tb, nullptr) << ta.name;
    ASSERT_EQ(GgmlTypeName(ta.ggml_type), GgmlTypeName(tb->ggml_type)) << ta.name;
    ASSERT_EQ(ta.nbytes, tb->nbytes) << ta.name;
    const bool k_type = ta.dtype && DTypeBlockSize(*ta.dtype) == 256;
    const size_t bb = ta.dtype ? DTypeBlockBytes(*ta.dtype) : ta.nbytes;
    uint64_t diff = 0;
    for (size_t off = 0; off < ta.nbytes; off += bb) diff += std::memcmp(ta.data + off, tb->data + off, bb) != 0;
    if (k_type) {
      kblocks += ta.nbytes / bb;
      kdiff += diff;
    } else {
      EXPECT_EQ(diff, 0u) << ta.name << " (" << GgmlTypeName(ta.ggml_type) << ")";
    }
  }
  EXPECT_LE(kdiff * 100, kblocks) << kdiff << " of " << kblocks << " K-quant blocks differ";
  std::printf("[ quantizer] %s: %llu of %llu K-quant blocks differ from llama.cpp's\n", type.c_str(),
              static_cast<unsigned long long>(kdiff), static_cast<unsigned long long>(kblocks));
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizerTest,
                         ::testing::Values("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "Q4_K_M"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
}  // namespace attic::model
