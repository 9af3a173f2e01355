#include "attic/model/config.h"

#include <gtest/gtest.h>

#include <cmath>

#include "attic/core/file.h"
#include "test_util.h"

namespace attic::model {
namespace {

constexpr const char* kLlama = R"({
  "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 172,
  "num_hidden_layers": 5, "num_attention_heads": 8, "num_key_value_heads": 4,
  "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "rope_scaling": null, "bos_token_id": 1, "eos_token_id": 2})";

TEST(ConfigTest, ParsesStories260K) {
  auto text = ReadFileToString(attic::testing::SharedDir() + "/models/stories260K-hf/config.json");
  ASSERT_TRUE(text.ok());
  auto c = ParseHfConfig(*text);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 172);
  EXPECT_EQ(c->n_layers, 5);
  EXPECT_EQ(c->n_heads, 8);
  EXPECT_EQ(c->n_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(c->torch_dtype, DType::kF32);
  EXPECT_EQ(c->q_dim(), 64);
  EXPECT_EQ(c->kv_dim(), 32);
}

TEST(ConfigTest, DefaultsAndFallbacks) {
  // model_type instead of architectures; no head_dim, no num_key_value_heads, no tie flag.
  auto c = ParseHfConfig(R"({"model_type": "mistral", "hidden_size": 128, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "sliding_window": 4096,
      "eos_token_id": [2, 7], "torch_dtype": "bfloat16"})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, "MistralForCausalLM");
  EXPECT_EQ(c->n_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{2, 7}));
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_EQ(c->torch_dtype, DType::kBF16);
}

TEST(ConfigTest, Qwen2HasQkvBias) {
  auto c = ParseHfConfig(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
      "rope_theta": 1000000.0, "tie_word_embeddings": true, "use_sliding_window": false, "sliding_window": 32768})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_TRUE(c->tie_word_embeddings);
}

TEST(ConfigTest, ExplicitHeadDim) {
  std::string j = kLlama;
  j.insert(j.size() - 1, R"(, "head_dim": 16)");
  auto c = ParseHfConfig(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->q_dim(), 128);
}

TEST(ConfigTest, RopeScaling) {
  std::string lin = kLlama;
  lin.replace(lin.find("\"rope_scaling\": null"), 20, R"("rope_scaling": {"type": "linear", "factor": 4.0})");
  auto c = ParseHfConfig(lin);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 4.0f);

  std::string l3 = kLlama;
  l3.replace(l3.find("\"rope_scaling\": null"), 20,
             R"("rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  c = ParseHfConfig(l3);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 32.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);

  std::string yarn = kLlama;
  yarn.replace(yarn.find("\"rope_scaling\": null"), 20, R"("rope_scaling": {"type": "yarn", "factor": 4.0})");
  c = ParseHfConfig(yarn);
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("yarn"), std::string::npos);
}

TEST(ConfigTest, UnsupportedArchitectureNamesItAndTheSupportedOnes) {
  auto c = ParseHfConfig(R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768})");
  ASSERT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("GPT2LMHeadModel"), std::string::npos);
  EXPECT_NE(c.status().message().find("LlamaForCausalLM"), std::string::npos);
  EXPECT_NE(c.status().message().find("Qwen2ForCausalLM"), std::string::npos);
}

TEST(ConfigTest, BadInputsAreCleanErrors) {
  EXPECT_EQ(ParseHfConfig("{not json").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ParseHfConfig("[1, 2]").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ParseHfConfig(R"({"architectures": ["LlamaForCausalLM"]})").status().code(),
            StatusCode::kInvalidArgument);
  std::string s = kLlama;
  s.replace(s.find("\"num_key_value_heads\": 4"), 24, "\"num_key_value_heads\": 3");
  EXPECT_EQ(ParseHfConfig(s).status().code(), StatusCode::kInvalidArgument);  // 8 % 3 != 0
  s = kLlama;
  s.replace(s.find("\"hidden_size\": 64"), 17, "\"hidden_size\": \"64\"");
  EXPECT_EQ(ParseHfConfig(s).status().code(), StatusCode::kInvalidArgument);
  s = kLlama;
  s.replace(s.find("\"hidden_size\": 64"), 17, "\"hidden_size\": -64");
  EXPECT_EQ(ParseHfConfig(s).status().code(), StatusCode::kInvalidArgument);
  s = kLlama;
  s.replace(s.find("\"vocab_size\": 512"), 17, "\"vocab_size\": 99999999999");
  EXPECT_EQ(ParseHfConfig(s).status().code(), StatusCode::kInvalidArgument);
  s = kLlama;
  s.insert(s.size() - 1, R"(, "attention_bias": true)");
  EXPECT_EQ(ParseHfConfig(s).status().code(), StatusCode::kUnimplemented);  // o_proj bias
}

TEST(ConfigTest, JsonRoundTrip) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 96;
  c.intermediate_size = 200;
  c.n_layers = 3;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.head_dim = 24;
  c.vocab_size = 1000;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 500000.0f;
  c.rope_scaling = {RopeScalingType::kLlama3, 8.0f, 1.0f, 4.0f, 8192};
  c.tie_word_embeddings = true;
  c.bos_token_id = 5;
  c.eos_token_ids = {6, 7};
  c.torch_dtype = DType::kF16;
  std::string json = HfConfigToJson(c);
  EXPECT_NE(json.find("\"rms_norm_eps\": 1e-06"), std::string::npos) << json;
  auto back = ParseHfConfig(json);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(HfConfigToJson(*back), json);
  EXPECT_EQ(CanonicalConfigString(*back), CanonicalConfigString(c));
  EXPECT_EQ(back->eos_token_ids, c.eos_token_ids);
  EXPECT_EQ(back->rope_scaling.original_max_position_embeddings, 8192);

  c.architecture = "Qwen2ForCausalLM";
  c.attention_bias = true;
  c.rope_scaling = {};
  back = ParseHfConfig(HfConfigToJson(c));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->attention_bias);
  EXPECT_EQ(CanonicalConfigString(*back), CanonicalConfigString(c));
}

TEST(ConfigTest, RopeInvFrequencies) {
  ModelConfig c;
  c.hidden_size = 64;
  c.intermediate_size = 64;
  c.n_layers = 1;
  c.n_heads = 1;
  c.n_kv_heads = 1;
  c.head_dim = 64;
  c.vocab_size = 10;
  c.rope_theta = 500000.0f;
  ASSERT_TRUE(c.Validate().ok());
  std::vector<float> base = RopeInvFrequencies(c);
  ASSERT_EQ(base.size(), 32u);
  EXPECT_FLOAT_EQ(base[0], 1.0f);
  EXPECT_NEAR(base[16], 1.0 / std::sqrt(500000.0), 1e-9);

  c.rope_scaling = {RopeScalingType::kLinear, 4.0f};
  std::vector<float> lin = RopeInvFrequencies(c);
  for (size_t i = 0; i < base.size(); ++i) EXPECT_FLOAT_EQ(lin[i], base[i] / 4.0f);

  c.rope_scaling = {RopeScalingType::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
  std::vector<float> l3 = RopeInvFrequencies(c);
  for (size_t i = 0; i < base.size(); ++i) {
    double wavelen = 2 * M_PI / base[i];
    if (wavelen < 8192 / 4.0) {
      EXPECT_FLOAT_EQ(l3[i], base[i]);  // high frequency: kept
    }
    if (wavelen > 8192 / 1.0) {
      EXPECT_FLOAT_EQ(l3[i], base[i] / 32.0f);  // low frequency: scaled
    }
    EXPECT_LE(l3[i], base[i]);
    EXPECT_GE(l3[i], base[i] / 32.0f * 0.999f);
  }
}

}  // namespace
}  // namespace attic::model
