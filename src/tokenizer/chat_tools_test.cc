// Tool conversations rendered by the ChatML, Llama-3 and Mistral families, compared with
// the official Qwen2.5-Instruct, Llama 3.1-Instruct and Mistral-7B-Instruct-v0.3 templates
// rendered by jinja2 as transformers renders them (tests/data/tokenizer/chat_tools_reference.json, made by
// tools/tokref/gen_tool_reference.py).
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "attic/tokenizer/chat_template.h"
#include "tokenizer/tokenizer_test_util.h"

namespace attic::tokenizer {
namespace {

using ojson = nlohmann::ordered_json;

// OpenAI wire messages (tool_calls[i].function.arguments a JSON text) as ChatMessages.
std::vector<ChatMessage> Messages(const ojson& wire) {
  std::vector<ChatMessage> out;
  for (const ojson& m : wire) {
    ChatMessage cm;
    cm.role = m["role"];
    if (m.contains("content") && m["content"].is_string()) cm.content = m["content"];
    if (m.contains("tool_call_id")) cm.tool_call_id = m["tool_call_id"];
    if (m.contains("tool_calls"))
      for (const ojson& c : m["tool_calls"]) cm.tool_calls.push_back({c["id"], c["function"]["name"], c["function"]["arguments"]});
    out.push_back(std::move(cm));
  }
  return out;
}

TEST(ChatTools, MatchesReferenceTemplates) {
  const ojson ref = ojson::parse(testing::ReadOrDie(testing::TestDataDir() + "/chat_tools_reference.json"));
  ASSERT_GE(ref["cases"].size(), 18u);
  int mistral = 0;
  for (const ojson& c : ref["cases"]) {
    const std::string jinja = testing::ReadOrDie(attic::testing::SourceDir() + "/" + c["template_file"].get<std::string>());
    auto kind = DetectChatTemplate(jinja);
    ASSERT_TRUE(kind.ok());
    ASSERT_STREQ(ChatTemplateKindName(*kind), c["kind"].get<std::string>().c_str());
    ChatRenderOptions opts;
    opts.bos_token = c["bos_token"];
    if (c.contains("eos_token")) opts.eos_token = c["eos_token"];
    mistral += c["kind"] == "mistral";
    opts.default_system_prompt = DefaultSystemPrompt(jinja);
    if (c["tools"].is_array())
      for (const ojson& t : c["tools"]) opts.tools.push_back(t.dump());
    auto out = RenderChat(*kind, Messages(c["messages"]), opts);
    ASSERT_TRUE(out.ok()) << c["name"] << ": " << out.status().ToString();
    EXPECT_EQ(*out, c["expected"].get<std::string>()) << c["name"] << " (" << c["kind"] << ")";
  }
  EXPECT_GE(mistral, 9);
}

TEST(ChatTools, PythonJsonDumps) {
  // json.dumps({"a": [1, 2.5, "é\n"], "b": {}, "c": []}) and with indent=2.
  EXPECT_EQ(*PythonJsonDumps(R"({"a":[1,2.5,"é\n"],"b":{},"c":[]})"), "{\"a\": [1, 2.5, \"é\\n\"], \"b\": {}, \"c\": []}");
  EXPECT_EQ(*PythonJsonDumps(R"({"a":[1,{"x":null}],"b":{}})", 2),
            "{\n  \"a\": [\n    1,\n    {\n      \"x\": null\n    }\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(PythonJsonDumps("{").status().code(), StatusCode::kInvalidArgument);
  // json.loads("{}\x00") raises (extra data): a NUL is never JSON text.
  EXPECT_EQ(PythonJsonDumps(std::string("{}\0", 3)).status().code(), StatusCode::kInvalidArgument);
}

TEST(ChatTools, RejectsWhatTheTemplatesRaise) {
  ChatRenderOptions opts;
  opts.tools = {R"({"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}})"};
  // Llama 3.1 puts the tools in the first user message: there must be one.
  std::vector<ChatMessage> only_system(1);
  only_system[0].role = "system";
  only_system[0].content = "s";
  EXPECT_EQ(RenderChat(ChatTemplateKind::kLlama3, only_system, opts).status().code(), StatusCode::kInvalidArgument);
  // "This model only supports single tool-calls at once!"
  std::vector<ChatMessage> two_calls(2);
  two_calls[0].role = "user";
  two_calls[0].content = "u";
  two_calls[1].role = "assistant";
  two_calls[1].tool_calls = {{"a", "f", "{}"}, {"b", "f", "{}"}};
  EXPECT_EQ(RenderChat(ChatTemplateKind::kLlama3, two_calls, opts).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(RenderChat(ChatTemplateKind::kChatML, two_calls, opts).ok());
  // Llama-2 has no tool format.
  auto l2 = RenderChat(ChatTemplateKind::kLlama2, two_calls, opts);
  EXPECT_EQ(l2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l2.status().message().find("tool"), std::string::npos);
}

// Mistral's template: roles alternate (calls and results aside), a system message only
// first; anything else raises there, and is InvalidArgument here.
TEST(ChatTools, MistralRejectsWhatTheTemplateRaises) {
  auto msg = [](const char* role, const char* content) {
    ChatMessage m;
    m.role = role;
    m.content = content;
    return m;
  };
  ChatMessage call = msg("assistant", "");
  call.tool_calls = {{"call_1", "f", "{}"}};
  ChatMessage result = msg("tool", "ok");
  result.tool_call_id = "call_1";
  const std::vector<std::vector<ChatMessage>> bad = {
      {msg("user", "a"), msg("user", "b")},
      {msg("assistant", "a")},
      {msg("system", "s"), msg("assistant", "a")},
      {msg("user", "a"), msg("assistant", "b"), msg("system", "s"), msg("user", "c")},
      {msg("user", "a"), msg("robot", "b")},
      {msg("user", "a"), call, result, msg("user", "b")},  // a call and its result do not end a user turn
  };
  for (const auto& conv : bad) {
    auto r = RenderChat(ChatTemplateKind::kMistral, conv);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << (r.ok() ? *r : "");
  }
  EXPECT_TRUE(RenderChat(ChatTemplateKind::kMistral, {msg("user", "a"), call, result, msg("assistant", "c")}).ok());
  // A tool without a "function" object cannot be rendered.
  ChatRenderOptions opts;
  opts.tools = {R"({"type":"function"})"};
  EXPECT_EQ(RenderChat(ChatTemplateKind::kMistral, {msg("user", "a")}, opts).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ChatTools, MistralToolCallIds) {
  // 9 alphanumerics are kept; anything else becomes 9 alphanumerics (values from
  // tools/tokref/gen_tool_reference.py's mistral_id, an independent implementation).
  EXPECT_EQ(MistralToolCallId("a1B2c3D4e"), "a1B2c3D4e");
  EXPECT_EQ(MistralToolCallId("call_1"), "9Gd2dIMCT");
  EXPECT_EQ(MistralToolCallId("call_9f2c1a7e5b3d4c8e"), "qsLWhMhbr");
  for (const std::string id : {"", "abcdefgh", "abcdefghij", "abcd_fghi", "abcdéfgh", "call_abcdefghijklmnopqrstuvwx"}) {
    const std::string m = MistralToolCallId(id);
    ASSERT_EQ(m.size(), 9u) << id;
    for (char c : m) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
    EXPECT_NE(m, id);
    EXPECT_EQ(MistralToolCallId(m), m);  // a mapped id is kept as it is
  }
  EXPECT_NE(MistralToolCallId("call_a"), MistralToolCallId("call_b"));
}

}  // namespace
}  // namespace attic::tokenizer
