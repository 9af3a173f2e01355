// Chat rendering compared with @huggingface/jinja's rendering of the real templates
// (tests/data/tokenizer/chat_reference.json, made by tools/tokref/gen_reference.mjs).
#include "attic/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/tokenizer_test_util.h"

namespace attic::tokenizer {
namespace {

using json = nlohmann::json;

std::string TemplatePath(const std::string& ref) {
  const size_t colon = ref.find(':');
  const std::string root = ref.substr(0, colon) == "shared" ? attic::testing::SharedDir() : attic::testing::SourceDir();
  return root + "/" + ref.substr(colon + 1);
}

TEST(ChatTemplate, MatchesJinjaReference) {
  const json ref = testing::ReadJsonOrDie(testing::TestDataDir() + "/chat_reference.json");
  ASSERT_TRUE(ref.contains("cases"));
  ASSERT_GE(ref["cases"].size(), 40u);
  for (const json& c : ref["cases"]) {
    const std::string jinja = testing::ReadOrDie(TemplatePath(c["template_file"]));
    auto kind = DetectChatTemplate(jinja);
    ASSERT_TRUE(kind.ok()) << c["template"];
    EXPECT_STREQ(ChatTemplateKindName(*kind), c["kind"].get<std::string>().c_str());
    std::vector<ChatMessage> msgs;
    for (const json& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
    ChatRenderOptions opts;
    opts.add_generation_prompt = c["add_generation_prompt"];
    opts.bos_token = c["bos_token"];
    opts.eos_token = c["eos_token"];
    opts.default_system_prompt = DefaultSystemPrompt(jinja);
    auto out = RenderChat(*kind, msgs, opts);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(*out, c["expected"].get<std::string>()) << c["template"] << " " << c["messages"].dump();
  }
}

TEST(ChatTemplate, DefaultSystemPrompts) {
  EXPECT_EQ(DefaultSystemPrompt(testing::ReadOrDie(testing::SmolDir() + "/chat_template.jinja")),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(DefaultSystemPrompt(testing::ReadOrDie(testing::TestDataDir() + "/qwen2.jinja")),
            "You are a helpful assistant.");
  EXPECT_EQ(DefaultSystemPrompt(testing::ReadOrDie(testing::TestDataDir() + "/llama3.jinja")), "");
  // A template that only opens the system turn around the user's own system message.
  EXPECT_EQ(DefaultSystemPrompt("{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"), "");
}

TEST(ChatTemplate, ParseAndDetect) {
  EXPECT_EQ(*ParseChatTemplateKind("chatml"), ChatTemplateKind::kChatML);
  EXPECT_EQ(*ParseChatTemplateKind("llama3"), ChatTemplateKind::kLlama3);
  EXPECT_EQ(*ParseChatTemplateKind("llama2"), ChatTemplateKind::kLlama2);
  EXPECT_EQ(*ParseChatTemplateKind("mistral"), ChatTemplateKind::kMistral);
  EXPECT_STREQ(ChatTemplateKindName(ChatTemplateKind::kMistral), "mistral");
  auto bad = ParseChatTemplateKind("vicuna");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--chat-template"), std::string::npos);

  EXPECT_EQ(*DetectChatTemplate("{{ '[INST] ' + m + ' [/INST]' }}"), ChatTemplateKind::kLlama2);
  // Mistral's tool-calling template (v0.3); the earlier Mistral templates are Llama-2's format.
  EXPECT_EQ(*DetectChatTemplate(testing::ReadOrDie(testing::TestDataDir() + "/mistral-v0.3.jinja")),
            ChatTemplateKind::kMistral);
  EXPECT_EQ(*DetectChatTemplate(testing::ReadOrDie(testing::TestDataDir() + "/llama2.jinja")), ChatTemplateKind::kLlama2);
  for (const std::string t : {"", "{% for m in messages %}{{ m.content }}{% endfor %}"}) {
    auto r = DetectChatTemplate(t);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--chat-template"), std::string::npos) << r.status().message();
    for (const char* name : {"chatml", "llama3", "llama2", "mistral"}) {
      EXPECT_NE(r.status().message().find(name), std::string::npos) << r.status().message();
    }
  }
}

TEST(ChatTemplate, RejectsBadConversations) {
  const std::vector<ChatMessage> bad_role = {{"wizard", "hi"}};
  for (auto k : {ChatTemplateKind::kChatML, ChatTemplateKind::kLlama3, ChatTemplateKind::kLlama2,
                 ChatTemplateKind::kMistral}) {
    EXPECT_EQ(RenderChat(k, bad_role).status().code(), StatusCode::kInvalidArgument);
  }
  const std::vector<ChatMessage> out_of_order = {{"user", "a"}, {"user", "b"}};
  EXPECT_EQ(RenderChat(ChatTemplateKind::kLlama2, out_of_order).status().code(), StatusCode::kInvalidArgument);
  const std::vector<ChatMessage> assistant_first = {{"system", "s"}, {"assistant", "a"}};
  EXPECT_EQ(RenderChat(ChatTemplateKind::kLlama2, assistant_first).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(RenderChat(ChatTemplateKind::kChatML, out_of_order).ok());
}

TEST(ChatTemplate, StopTokens) {
  EXPECT_EQ(ChatStopTokens(ChatTemplateKind::kChatML)[0], "<|im_end|>");
  EXPECT_EQ(ChatStopTokens(ChatTemplateKind::kLlama3)[0], "<|eot_id|>");
  EXPECT_EQ(ChatStopTokens(ChatTemplateKind::kLlama2)[0], "</s>");
  EXPECT_EQ(ChatStopTokens(ChatTemplateKind::kMistral)[0], "</s>");
}

}  // namespace
}  // namespace attic::tokenizer
