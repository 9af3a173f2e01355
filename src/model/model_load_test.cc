// Loading the real stories260K checkpoints: the HF fp32 directory, its fp16 twin and
// the GGUF made by llama.cpp's converter from the same llama2.c checkpoint. The GGUF
// (q/k un-permuted at load) must equal the safetensors bit for bit: an independent
// cross-check of both loaders and of the RoPE permutation.
#include <gtest/gtest.h>

#include <cmath>

#include "attic/core/file.h"
#include "attic/model/model.h"
#include "attic/model/writer.h"
#include "model/safetensors.h"
#include "model/test_models.h"
#include "test_util.h"

namespace attic::model {
namespace {

using testing::LoadedTensors;

std::string Models() { return attic::testing::SharedDir() + "/models/"; }

std::unique_ptr<Model> MustLoad(const std::string& path, const LoadOptions& opts = {}) {
  auto m = Model::Load(path, opts);
  EXPECT_TRUE(m.ok()) << path << ": " << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

TEST(StoriesLoadTest, HfFp32) {
  uint64_t last_done = 0, last_total = 0;
  int calls = 0;
  LoadOptions opts;
  opts.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
    ++calls;
  };
  auto m = MustLoad(Models() + "stories260K-hf", opts);
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(m->is_gguf());
  EXPECT_EQ(m->weight_dtype(), DType::kF32);
  EXPECT_EQ(m->tokenizer_json_path(), Models() + "stories260K-hf/tokenizer.json");
  EXPECT_EQ(m->chat_template(), "");
  EXPECT_EQ(m->gguf_tokenizer(), nullptr);
  EXPECT_EQ(m->fingerprint().size(), 32u);
  EXPECT_GT(calls, 1);
  EXPECT_EQ(last_done, last_total);

  const ModelWeights& w = m->weights();
  ASSERT_EQ(w.layers.size(), 5u);
  EXPECT_EQ(w.lm_head.data, w.tok_embeddings.data);  // tied: aliased, not copied
  EXPECT_EQ(w.tok_embeddings.shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(w.layers[0].wk.shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(w.layers[0].w_down.shape, (std::vector<int64_t>{64, 172}));
  EXPECT_EQ(w.layers[0].bq, nullptr);

  // Zero copy: matrices point into the mapped file at their safetensors offsets.
  auto file = MappedFile::Open(Models() + "stories260K-hf/model.safetensors");
  ASSERT_TRUE(file.ok());
  auto entries = ParseSafetensors((*file)->data(), (*file)->size(), "model.safetensors");
  ASSERT_TRUE(entries.ok());
  const uint8_t* emb = static_cast<const uint8_t*>(w.tok_embeddings.data);
  for (const SafetensorsEntry& e : *entries) {
    if (e.name == "model.layers.3.self_attn.v_proj.weight") {
      const uint8_t* file_emb = nullptr;
      for (const SafetensorsEntry& f : *entries) {
        if (f.name == "model.embed_tokens.weight") file_emb = f.data;
      }
      EXPECT_EQ(static_cast<const uint8_t*>(w.layers[3].wv.data) - emb, e.data - file_emb);
      EXPECT_EQ(std::memcmp(w.layers[3].wv.data, e.data, e.nbytes), 0);
    }
  }
  // The same load twice gives the same fingerprint.
  auto again = MustLoad(Models() + "stories260K-hf");
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->fingerprint(), m->fingerprint());
}

TEST(StoriesLoadTest, GgufEqualsSafetensorsExactly) {
  auto hf = MustLoad(Models() + "stories260K-hf");
  auto gg = MustLoad(Models() + "stories260K-gguf/stories260K.gguf");
  ASSERT_NE(hf, nullptr);
  ASSERT_NE(gg, nullptr);
  EXPECT_TRUE(gg->is_gguf());
  const ModelConfig& c = gg->config();
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_position_embeddings, 2048);  // what llama.cpp's converter wrote
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_FALSE(c.tie_word_embeddings);  // the converter wrote output.weight
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(gg->weight_dtype(), DType::kF32);

  auto a = LoadedTensors(*hf);
  auto b = LoadedTensors(*gg);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, values] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    ASSERT_EQ(values.size(), b[name].size()) << name;
    EXPECT_EQ(std::memcmp(values.data(), b[name].data(), values.size() * 4), 0) << name << " differs";
  }
  // Same config (for compute) and weights: same fingerprint, so KV is shareable.
  EXPECT_EQ(gg->fingerprint(), hf->fingerprint());

  const GgufTokenizerData* t = gg->gguf_tokenizer();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->model, "llama");
  ASSERT_EQ(t->tokens.size(), 512u);
  EXPECT_EQ(t->tokens[1], "<s>");
  EXPECT_EQ(t->tokens[259], "\xe2\x96\x81t");  // "▁t"
  ASSERT_EQ(t->scores.size(), 512u);
  ASSERT_EQ(t->token_types.size(), 512u);
  EXPECT_EQ(t->token_types[0], 2);
  EXPECT_EQ(t->token_types[1], 3);
  EXPECT_EQ(t->token_types[3], 6);
  EXPECT_EQ(t->bos_id, 1);
  EXPECT_EQ(t->eos_id, 2);
  EXPECT_EQ(t->unk_id, 0);
  EXPECT_EQ(t->pad_id, -1);  // 0xffffffff in the file
  EXPECT_TRUE(t->add_bos);
  EXPECT_TRUE(t->merges.empty());
}

TEST(StoriesLoadTest, Fp16WithinRounding) {
  auto f32 = MustLoad(Models() + "stories260K-hf");
  auto f16 = MustLoad(Models() + "stories260K-hf-f16");
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(f16, nullptr);
  EXPECT_EQ(f16->weight_dtype(), DType::kF16);
  EXPECT_EQ(f16->weights().layers[0].wq.dtype, DType::kF16);
  EXPECT_NE(f16->fingerprint(), f32->fingerprint());
  auto a = LoadedTensors(*f32);
  auto b = LoadedTensors(*f16);
  for (const auto& [name, values] : a) {
    const std::vector<float>& h = b[name];
    ASSERT_EQ(values.size(), h.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      // Half an f16 ulp (2^-11 relative), or the subnormal spacing near zero.
      ASSERT_LE(std::fabs(values[i] - h[i]), std::fabs(values[i]) * 0x1p-11f + 0x1p-25f) << name << "[" << i << "]";
    }
  }
}

TEST(StoriesLoadTest, TokenizerJsonConvertsToTheConvertersGgufTokenizer) {
  auto gg = MustLoad(Models() + "stories260K-gguf/stories260K.gguf");
  ASSERT_NE(gg, nullptr);
  auto tj = ReadFileToString(Models() + "stories260K-hf/tokenizer.json");
  auto tc = ReadFileToString(Models() + "stories260K-hf/tokenizer_config.json");
  ASSERT_TRUE(tj.ok() && tc.ok());
  auto t = GgufTokenizerFromHfJson(*tj, *tc, gg->config());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const GgufTokenizerData& ref = *gg->gguf_tokenizer();
  EXPECT_EQ(t->model, "llama");
  EXPECT_EQ(t->tokens, ref.tokens);
  EXPECT_EQ(t->scores, ref.scores);
  EXPECT_EQ(t->token_types, ref.token_types);
  EXPECT_EQ(t->bos_id, ref.bos_id);
  EXPECT_EQ(t->eos_id, ref.eos_id);
  EXPECT_EQ(t->unk_id, ref.unk_id);
  EXPECT_TRUE(t->add_bos);
  EXPECT_TRUE(t->add_space_prefix);
}

}  // namespace
}  // namespace attic::model
