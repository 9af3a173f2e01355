// Tools on the server: the request fields (every field's type and range), the model's
// output read back into calls per template family, and the response's message.tool_calls
// (streamed calls: tool_call_stream_test.cc).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cctype>

#include "attic/server/openai_api.h"
#include "attic/server/tool_calls.h"

namespace attic::server {
namespace {

using json = nlohmann::json;
using tokenizer::ChatTemplateKind;

const char* kTools = R"("tools":[{"type":"function","function":{"name":"get_weather","description":"d",
  "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
  {"type":"function","function":{"name":"now"}}])";

ApiRequest Chat(const std::string& extra, const std::string& messages = R"([{"role":"user","content":"hi"}])") {
  ParseResult r = ParseApiRequest(ApiKind::kChat, R"({"model":"m","messages":)" + messages + "," + extra + "}");
  EXPECT_FALSE(r.error.has_value()) << extra << ": " << (r.error ? r.error->message : "");
  return r.request;
}

TEST(ToolRequest, ReadsToolsChoicesAndToolTurns) {
  ApiRequest r = Chat(kTools);
  ASSERT_EQ(r.tools.tools.size(), 2u);
  EXPECT_EQ(r.tools.tools[0].name, "get_weather");
  EXPECT_EQ(r.tools.choice, ToolChoice::kAuto);  // the default with tools
  EXPECT_TRUE(r.tools.parallel);
  // The tool as written, keys in the client's order (the template renders it so).
  EXPECT_EQ(r.tools.tools[0].json.rfind(R"({"type":"function","function":{"name":"get_weather","description":"d",)", 0), 0u)
      << r.tools.tools[0].json;
  EXPECT_EQ(r.tools.tools[1].parameters, "");
  EXPECT_EQ(Chat(std::string(kTools) + R"(,"tool_choice":"required","parallel_tool_calls":false)").tools.choice,
            ToolChoice::kRequired);
  EXPECT_FALSE(Chat(std::string(kTools) + R"(,"parallel_tool_calls":false)").tools.parallel);
  ApiRequest named = Chat(std::string(kTools) + R"(,"tool_choice":{"type":"function","function":{"name":"now"}})");
  EXPECT_EQ(named.tools.choice, ToolChoice::kFunction);
  EXPECT_EQ(named.tools.function, "now");
  EXPECT_FALSE(Chat(std::string(kTools) + R"(,"tool_choice":"none")").tools.active());
  EXPECT_FALSE(Chat(R"("tool_choice":"none")").tools.active());
  ApiRequest turns = Chat(kTools, R"([{"role":"user","content":"w?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"21"}])");
  ASSERT_EQ(turns.messages.size(), 3u);
  ASSERT_EQ(turns.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(turns.messages[1].tool_calls[0].id, "c1");
  EXPECT_EQ(turns.messages[1].tool_calls[0].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(turns.messages[2].role, "tool");
  EXPECT_EQ(turns.messages[2].tool_call_id, "c1");
  EXPECT_EQ(turns.messages[2].content, "21");
}

TEST(ToolRequest, BadFieldsAre400NamingTheParam) {
  const std::string fn = R"({"type":"function","function":{"name":"f"}})";
  struct Case {
    std::string extra, param;
  } cases[] = {
      {R"("tools":{})", "tools"},
      {R"("tools":[1])", "tools[0]"},
      {R"("tools":[{"function":{"name":"f"}}])", "tools[0].type"},
      {R"("tools":[{"type":"retrieval"}])", "tools[0].type"},
      {R"("tools":[{"type":"function","function":{"name":""}}])", "tools[0].function.name"},
      {R"("tools":[{"type":"function","function":{"name":"a b"}}])", "tools[0].function.name"},
      {R"("tools":[{"type":"function","function":{"name":"f","parameters":[]}}])", "tools[0].function.parameters"},
      {R"("tools":[{"type":"function","function":{"name":"f","strict":"yes"}}])", "tools[0].function.strict"},
      {R"("tools":[)" + fn + "," + fn + "]", "tools[1].function.name"},
      {R"("tool_choice":"auto")", "tool_choice"},
      {R"("tools":[)" + fn + R"(],"tool_choice":"any")", "tool_choice"},
      {R"("tools":[)" + fn + R"(],"tool_choice":5)", "tool_choice"},
      {R"("tools":[)" + fn + R"(],"tool_choice":{"type":"function","function":{"name":"g"}})", "tool_choice.function.name"},
      {R"("tools":[)" + fn + R"(],"parallel_tool_calls":1)", "parallel_tool_calls"},
      {R"("tools":[)" + fn + R"(],"tool_choice":"required","response_format":{"type":"json_object"})", "response_format"},
      {R"("functions":[{"name":"f"}])", "functions"},
      {R"("function_call":"auto")", "function_call"},
  };
  for (const auto& c : cases) {
    ParseResult r = ParseApiRequest(ApiKind::kChat, R"({"model":"m","messages":[{"role":"user","content":"hi"}],)" + c.extra + "}");
    ASSERT_TRUE(r.error.has_value()) << c.extra;
    EXPECT_EQ(r.error->http_status, 400) << c.extra;
    EXPECT_EQ(r.error->param, c.param) << c.extra << ": " << r.error->message;
  }
  const std::pair<std::string, std::string> bad_messages[] = {
      {R"([{"role":"tool","content":"x"}])", "messages[0].tool_call_id"},
      {R"([{"role":"tool","tool_call_id":5,"content":"x"}])", "messages[0].tool_call_id"},
      {R"([{"role":"tool","tool_call_id":"c"}])", "messages[0].content"},
      {R"([{"role":"user","content":"x","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}}]}])", "messages[0].tool_calls"},
      {R"([{"role":"assistant","tool_calls":{}}])", "messages[0].tool_calls"},
      {R"([{"role":"assistant","tool_calls":[5]}])", "messages[0].tool_calls[0]"},
      {R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}])", "messages[0].tool_calls[0].id"},
      {R"([{"role":"assistant","tool_calls":[{"id":"a","type":"x","function":{"name":"f","arguments":"{}"}}]}])", "messages[0].tool_calls[0].type"},
      {R"([{"role":"assistant","tool_calls":[{"id":"a"}]}])", "messages[0].tool_calls[0].function"},
      {R"([{"role":"assistant","tool_calls":[{"id":"a","function":{"arguments":"{}"}}]}])", "messages[0].tool_calls[0].function.name"},
      {R"([{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":{}}}]}])", "messages[0].tool_calls[0].function.arguments"},
      {R"([{"role":"function","name":"f","content":"x"}])", "messages[0].role"},
  };
  for (const auto& [messages, param] : bad_messages) {
    ParseResult r = ParseApiRequest(ApiKind::kChat, R"({"model":"m","messages":)" + messages + "}");
    ASSERT_TRUE(r.error.has_value()) << messages;
    EXPECT_EQ(r.error->param, param) << messages << ": " << r.error->message;
  }
  ParseResult compl_tools = ParseApiRequest(ApiKind::kCompletion, R"({"model":"m","prompt":"x","tools":[)" + fn + "]}");
  ASSERT_TRUE(compl_tools.error.has_value());
  EXPECT_EQ(compl_tools.error->param, "tools");
}

ToolSpec Spec(ToolChoice choice = ToolChoice::kAuto) {
  ToolSpec s;
  s.tools = {{"get_weather", "{}", ""}, {"now", "{}", ""}};
  s.choice = choice;
  return s;
}

TEST(ToolOutput, HermesBlocksAreCalls) {
  const ToolSpec spec = Spec();
  ToolOutput o = ParseToolOutput("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
                                 "</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
                                 ChatTemplateKind::kChatML, spec);
  EXPECT_EQ(o.content, "Let me check.");
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].name, "get_weather");
  EXPECT_EQ(o.calls[0].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(o.calls[1].arguments, "{}");
  // An unclosed last block (the reply stopped at the end of turn), arguments as a string.
  o = ParseToolOutput("<tool_call>\n{\"name\": \"now\", \"arguments\": \"{\\\"a\\\": 1}\"}", ChatTemplateKind::kChatML, spec);
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].arguments, R"({"a":1})");
  EXPECT_EQ(o.content, "");
  // Undeclared functions and broken JSON stay text; so does plain text.
  for (const std::string& text : {std::string("<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>"),
                                 std::string("<tool_call>{\"name\": \"now\", </tool_call>"), std::string("Hello there")}) {
    o = ParseToolOutput(text, ChatTemplateKind::kChatML, spec);
    EXPECT_TRUE(o.calls.empty()) << text;
    EXPECT_EQ(o.content, text);
  }
}

TEST(ToolOutput, Llama3JsonCalls) {
  const ToolSpec spec = Spec();
  ToolOutput o = ParseToolOutput(" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", ChatTemplateKind::kLlama3, spec);
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(o.content, "");
  o = ParseToolOutput("<|python_tag|>{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"now\", \"parameters\": {}}",
                      ChatTemplateKind::kLlama3, spec);
  EXPECT_EQ(o.calls.size(), 2u);
  o = ParseToolOutput("{\"answer\": 42}", ChatTemplateKind::kLlama3, spec);
  EXPECT_TRUE(o.calls.empty());
  EXPECT_EQ(o.content, "{\"answer\": 42}");
  // A NUL makes text that is not JSON (RFC 8259), after the call or in its string
  // arguments: no call, the reply is content. (nlohmann::json::parse alone ends its input
  // at a NUL and would read the call.)
  for (const std::string& text : {std::string("{\"name\": \"now\"}\0", 16),
                                 std::string("{\"name\": \"now\", \"parameters\": {}}\0 more", 39),
                                 std::string("{\"name\": \"now\", \"parameters\": \"{}\\u0000x\"}")}) {
    o = ParseToolOutput(text, ChatTemplateKind::kLlama3, spec);
    EXPECT_TRUE(o.calls.empty()) << text;
    EXPECT_EQ(o.content, text);
  }
}

TEST(ToolOutput, MistralCalls) {
  const ToolSpec spec = Spec();
  // The [TOOL_CALLS] control token is dropped by detokenization: a reply that is an array
  // of calls (or one call) is read as calls, with the marker or without.
  for (const std::string& text : {std::string(" [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, "
                                             "{\"name\": \"now\", \"arguments\": {}}]"),
                                 std::string("[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                                             "\"Oslo\"}, \"id\": \"a1B2c3D4e\"}, {\"name\": \"now\", \"arguments\": {}}]")}) {
    ToolOutput o = ParseToolOutput(text, ChatTemplateKind::kMistral, spec);
    ASSERT_EQ(o.calls.size(), 2u) << text;
    EXPECT_EQ(o.calls[0].name, "get_weather");
    EXPECT_EQ(o.calls[0].arguments, R"({"city":"Oslo"})");
    EXPECT_EQ(o.calls[1].name, "now");
    EXPECT_EQ(o.content, "");
  }
  // Text before a visible marker is content; one object is a call too.
  ToolOutput o = ParseToolOutput("Checking.\n[TOOL_CALLS] {\"name\": \"now\", \"arguments\": {}}", ChatTemplateKind::kMistral, spec);
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.content, "Checking.");
  // Plain text, undeclared functions, broken or cut-short JSON stay text.
  for (const std::string& text : {std::string("[1] is a footnote."), std::string("[{\"name\": \"rm\", \"arguments\": {}}]"),
                                 std::string("[TOOL_CALLS] [{\"name\": \"now\", \"argu"), std::string("Hello"),
                                 std::string("[]")}) {
    o = ParseToolOutput(text, ChatTemplateKind::kMistral, spec);
    EXPECT_TRUE(o.calls.empty()) << text;
    EXPECT_EQ(o.content, text);
  }
}

TEST(ToolOutput, CallIdsPerFamily) {
  std::vector<ToolCall> calls(3);
  NameToolCalls(ChatTemplateKind::kChatML, "call_ab", &calls);
  EXPECT_EQ(calls[0].id, "call_ab0");
  EXPECT_EQ(calls[2].id, "call_ab2");
  // Mistral: 9 alphanumerics, which its template takes as they are (so the ids the client
  // sends back with the calls and their results are rendered unchanged).
  NameToolCalls(ChatTemplateKind::kMistral, "call_0123456789abcdef01234567", &calls);
  for (const ToolCall& c : calls) {
    ASSERT_EQ(c.id.size(), 9u);
    for (char ch : c.id) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch))) << c.id;
    EXPECT_EQ(tokenizer::MistralToolCallId(c.id), c.id);
  }
  EXPECT_NE(calls[0].id, calls[1].id);
  EXPECT_NE(calls[1].id, calls[2].id);
}

TEST(ToolCallGrammar, MistralForcedCallsAreArraysOfArguments) {
  // The grammar's language: for "required" with parallel calls an array of
  // {"name", "arguments"} (Mistral's own shape); named or not parallel: one object.
  ToolSpec spec = Spec(ToolChoice::kRequired);
  spec.tools[0].parameters = R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})";
  auto g = ToolCallGrammar(spec, ChatTemplateKind::kMistral);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_NE(*g, nullptr);
  auto accepts = [](const grammar::Grammar& gr, const std::string& text) {
    grammar::Matcher m(&gr);
    for (char c : text)
      if (!m.Feed(static_cast<uint8_t>(c))) return false;
    return m.Complete();
  };
  EXPECT_TRUE(accepts(**g, R"([{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"now","arguments":{}}])"));
  EXPECT_FALSE(accepts(**g, R"([{"name":"get_weather","parameters":{"city":"Oslo"}}])"));
  EXPECT_FALSE(accepts(**g, R"([{"name":"get_weather","arguments":{}}])"));  // "city" is required
  spec.parallel = false;
  g = ToolCallGrammar(spec, ChatTemplateKind::kMistral);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(accepts(**g, R"({"name":"now","arguments":{}})"));
  EXPECT_FALSE(accepts(**g, R"([{"name":"now","arguments":{}}])"));
}

TEST(ToolOutput, ForcedOutputIsBareJson) {
  const ToolSpec spec = Spec(ToolChoice::kRequired);
  ToolOutput o = ParseToolOutput(R"([{"name":"now","arguments":{}},{"name":"get_weather","arguments":{"city":"a"}}])",
                                 ChatTemplateKind::kChatML, spec);
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[1].name, "get_weather");
  // Cut short (finish "length"): no call, the text as content.
  o = ParseToolOutput(R"({"name":"now","argu)", ChatTemplateKind::kChatML, spec);
  EXPECT_TRUE(o.calls.empty());
  EXPECT_EQ(o.content, R"({"name":"now","argu)");
}

TEST(ToolResponse, Message) {
  ResponseMeta meta;
  meta.kind = ApiKind::kChat;
  meta.id = "chatcmpl-1";
  meta.model = "m";
  engine::TokenUsage u;
  const std::vector<ToolCall> calls = {{"call_a0", "now", "{}"}, {"call_a1", "get_weather", R"({"city":"x"})"}};
  json body = json::parse(CompletionBody(meta, "", "tool_calls", u, "", calls));
  const json& msg = body["choices"][0]["message"];
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  EXPECT_EQ(msg["tool_calls"][1], json::parse(R"({"id":"call_a1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"x\"}"}})"));
  EXPECT_FALSE(json::parse(CompletionBody(meta, "text", "stop", u))["choices"][0]["message"].contains("tool_calls"));
}

}  // namespace
}  // namespace attic::server
