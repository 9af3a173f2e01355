// The Anthropic Messages API: request validation (every field's type and range, 400s
// naming the field in Anthropic's error shape), the cache_control breakpoint, usage
// arithmetic, stop reasons and the SSE events.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "attic/server/anthropic_api.h"

namespace attic::server {
namespace {

using json = nlohmann::json;

MessagesRequest Parse(const std::string& body) {
  MessagesParse p = ParseMessagesRequest(body);
  EXPECT_FALSE(p.error.has_value()) << body << ": " << (p.error ? p.error->message : "");
  return p.request;
}

TEST(MessagesRequest, ReadsEveryField) {
  MessagesRequest m = Parse(R"({"model":"m","max_tokens":9,"system":[{"type":"text","text":"Sys. "},
      {"type":"text","text":"More.","cache_control":{"type":"ephemeral","ttl":"1h"}}],
      "messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":[{"type":"text","text":"Yo"}]},
                  {"role":"user","content":[{"type":"text","text":"A"},{"type":"text","text":"B","cache_control":{"type":"ephemeral"}},{"type":"text","text":"C"}]}],
      "temperature":0.5,"top_p":0.9,"top_k":5,"stop_sequences":["END","\n\n"],"stream":true,
      "metadata":{"user_id":"u1"},"anthropic_extra":1,"tools":[],"thinking":{"type":"disabled"}})");
  const ApiRequest& r = m.chat;
  EXPECT_EQ(r.kind, ApiKind::kChat);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.max_tokens.value(), 9);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Sys. More.");
  EXPECT_EQ(r.messages[2].content, "Yo");
  EXPECT_EQ(r.messages[3].content, "ABC");
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 5);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"END", "\n\n"}));
  EXPECT_EQ(m.stop_sequences, r.stop);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.user, "u1");
  // The last breakpoint ends after "B"; the longest TTL wins.
  ASSERT_EQ(m.marked.size(), 4u);
  EXPECT_EQ(m.marked[3].content, std::string("AB") + kCacheBreakMarker + "C");
  EXPECT_EQ(m.marked[0].content, "Sys. More.");
  EXPECT_EQ(m.cache_ttl_s, 3600);
  // Without cache_control: no breakpoint. Defaults are Anthropic's.
  MessagesRequest plain = Parse(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}]})");
  EXPECT_TRUE(plain.marked.empty());
  EXPECT_FLOAT_EQ(plain.chat.temperature, 1.0f);
  EXPECT_FALSE(plain.chat.stream);
  // Top-level cache_control: the breakpoint is the end of the last message.
  MessagesRequest automatic =
      Parse(R"({"model":"m","max_tokens":1,"cache_control":{"type":"ephemeral"},"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(automatic.marked.back().content, std::string("x") + kCacheBreakMarker);
  EXPECT_EQ(automatic.cache_ttl_s, 300);
}

TEST(MessagesRequest, BadFieldsAre400NamingTheField) {
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  const std::string ok = R"("model":"m","max_tokens":4,)";
  struct Case {
    std::string body, param;
  } cases[] = {
      {R"({"max_tokens":4,)" + msgs + "}", "model"},
      {R"({"model":"","max_tokens":4,)" + msgs + "}", "model"},
      {R"({"model":"m",)" + msgs + "}", "max_tokens"},
      {R"({"model":"m","max_tokens":0,)" + msgs + "}", "max_tokens"},
      {R"({"model":"m","max_tokens":"4",)" + msgs + "}", "max_tokens"},
      {R"({"model":"m","max_tokens":2.5,)" + msgs + "}", "max_tokens"},
      {"{" + ok + R"("messages":[]})", "messages"},
      {"{" + ok + R"("messages":{}})", "messages"},
      {"{" + ok + R"("messages":[5]})", "messages[0]"},
      {"{" + ok + R"("messages":[{"role":"tool","content":"x"}]})", "messages[0].role"},
      {"{" + ok + R"("messages":[{"role":"user"}]})", "messages[0].content"},
      {"{" + ok + R"("messages":[{"role":"user","content":""}]})", "messages[0].content"},
      {"{" + ok + R"("messages":[{"role":"user","content":[]}]})", "messages[0].content"},
      {"{" + ok + R"("messages":[{"role":"user","content":[{"type":"tool_result"}]}]})", "messages[0].content[0].type"},
      {"{" + ok + R"("messages":[{"role":"user","content":[{"type":"text"}]}]})", "messages[0].content[0].text"},
      {"{" + ok + R"("messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{}}]}]})",
       "messages[0].content[0].cache_control"},
      {"{" + ok + R"("messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral","ttl":5}}]}]})",
       "messages[0].content[0].cache_control.ttl"},
      {"{" + ok + "\"messages\":[{\"role\":\"user\",\"content\":\"\xEE\x80\x80" "attic-part:0\xEE\x80\x81\"}]}", "messages[0].content"},
      {"{" + ok + R"("messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]})", "messages"},
      {"{" + ok + msgs + R"(,"system":[{"type":"image"}]})", "system[0].type"},
      {"{" + ok + msgs + R"(,"temperature":1.01})", "temperature"},
      {"{" + ok + msgs + R"(,"top_p":0})", "top_p"},
      {"{" + ok + msgs + R"(,"top_k":-2})", "top_k"},
      {"{" + ok + msgs + R"(,"stop_sequences":[1]})", "stop_sequences"},
      {"{" + ok + msgs + R"(,"stop_sequences":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})", "stop_sequences"},
      {"{" + ok + msgs + R"(,"stream":1})", "stream"},
      {"{" + ok + msgs + R"(,"metadata":{"user_id":5}})", "metadata.user_id"},
      {"{" + ok + msgs + R"(,"tools":[{"name":"f"}]})", "tools"},
      {"{" + ok + msgs + R"(,"tool_choice":{"type":"auto"}})", "tool_choice"},
      {"{" + ok + msgs + R"(,"thinking":{"type":"enabled","budget_tokens":100}})", "thinking"},
      {"{" + ok + msgs + R"(,"cache_control":{"type":"other"}})", "cache_control"},
      {R"({"model":"m")", ""},
      {R"([])", ""},
  };
  for (const auto& c : cases) {
    MessagesParse p = ParseMessagesRequest(c.body);
    ASSERT_TRUE(p.error.has_value()) << c.body;
    EXPECT_EQ(p.error->http_status, 400) << c.body;
    EXPECT_EQ(p.error->param, c.param) << c.body << ": " << p.error->message;
    const json e = json::parse(AnthropicErrorJson(*p.error));
    EXPECT_EQ(e["type"], "error");
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_NE(e["error"]["message"].get<std::string>().find(c.param), std::string::npos) << e.dump();
  }
  std::string five = "{" + ok + R"("messages":[{"role":"user","content":[)";
  for (int i = 0; i < 5; ++i) five += std::string(i ? "," : "") + R"({"type":"text","text":"a","cache_control":{"type":"ephemeral"}})";
  MessagesParse p = ParseMessagesRequest(five + "]}]}");
  ASSERT_TRUE(p.error.has_value());
  EXPECT_EQ(p.error->param, "messages[0].content[4].cache_control");
}

TEST(MessagesResponse, UsageStopReasonsAndErrors) {
  engine::TokenUsage u;
  u.prompt_tokens = 100;
  u.completion_tokens = 7;
  u.cached_tokens = 30;
  // Breakpoint at 80: 30 read, 50 written, the 20 after the breakpoint plain input.
  MessagesUsage a = AnthropicUsage(u, 80, true);
  EXPECT_EQ(a.cache_read_input_tokens, 30);
  EXPECT_EQ(a.cache_creation_input_tokens, 50);
  EXPECT_EQ(a.input_tokens, 20);
  EXPECT_EQ(a.output_tokens, 7);
  EXPECT_EQ(AnthropicUsage(u, 80, false).cache_creation_input_tokens, 0);  // no store: nothing is kept
  EXPECT_EQ(AnthropicUsage(u, 80, false).input_tokens, 70);
  EXPECT_EQ(AnthropicUsage(u, 0, true).cache_creation_input_tokens, 0);  // no breakpoint
  EXPECT_EQ(AnthropicUsage(u, 20, true).cache_creation_input_tokens, 0);  // all of it was read
  std::string seq;
  EXPECT_EQ(AnthropicStopReason("length", "", {}, &seq), "max_tokens");
  EXPECT_EQ(AnthropicStopReason("stop", "", {"x"}, &seq), "end_turn");
  EXPECT_EQ(AnthropicStopReason("stop", "<|im_end|>", {"x"}, &seq), "end_turn");  // the template's, not the client's
  EXPECT_EQ(AnthropicStopReason("stop", "x", {"y", "x"}, &seq), "stop_sequence");
  EXPECT_EQ(seq, "x");
  for (const auto& [status, type] : std::vector<std::pair<int, std::string>>{
           {400, "invalid_request_error"}, {401, "authentication_error"}, {404, "not_found_error"},
           {413, "request_too_large"}, {429, "rate_limit_error"}, {503, "overloaded_error"}, {500, "api_error"}, {504, "api_error"}}) {
    EXPECT_EQ(AnthropicErrorType(status), type);
  }
  const json body = json::parse(MessageBody("msg_1", "m", "hi", "stop_sequence", "x", a));
  EXPECT_EQ(body, json::parse(R"({"id":"msg_1","type":"message","role":"assistant","model":"m",
      "content":[{"type":"text","text":"hi"}],"stop_reason":"stop_sequence","stop_sequence":"x",
      "usage":{"input_tokens":20,"cache_creation_input_tokens":50,"cache_read_input_tokens":30,"output_tokens":7}})"));
  EXPECT_TRUE(json::parse(MessageBody("msg_1", "m", "", "end_turn", "", a))["stop_sequence"].is_null());
  // Events: "event: NAME\ndata: {"type": NAME, ...}\n\n".
  for (const std::string& ev : {MessageStartEvent("msg_1", "m", 12), ContentBlockStartEvent(), TextDeltaEvent("t"),
                                ContentBlockStopEvent(), MessageDeltaEvent("end_turn", "", a), MessageStopEvent()}) {
    ASSERT_EQ(ev.rfind("event: ", 0), 0u);
    const std::string name = ev.substr(7, ev.find('\n') - 7);
    const size_t data = ev.find("\ndata: ");
    ASSERT_NE(data, std::string::npos);
    ASSERT_EQ(ev.substr(ev.size() - 2), "\n\n");
    EXPECT_EQ(json::parse(ev.substr(data + 7))["type"], name);
  }
  EXPECT_EQ(json::parse(MessageStartEvent("msg_1", "m", 12).substr(27))["message"]["usage"]["input_tokens"], 12);
  EXPECT_EQ(json::parse(TextDeltaEvent("t").substr(33))["delta"], json::parse(R"({"type":"text_delta","text":"t"})"));
}

}  // namespace
}  // namespace attic::server
