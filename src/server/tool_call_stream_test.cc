// Streamed tool calls per template family, fed cut at every byte position (two pieces
// cut at each byte; pieces of every size): the content and the argument pieces
// concatenate to the whole-reply parse of the same text (ParseToolOutput, which the
// non-streamed response uses) and to hand-written calls; calls open in index order with
// their ids; arguments go out while the model writes them, content as soon as it cannot be
// a call. Also the cases where a call the stream opened does not read, and the SSE shape.
#include "attic/server/tool_call_stream.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

#include "attic/server/openai_api.h"

namespace attic::server {
namespace {

using json = nlohmann::json;
using tokenizer::ChatTemplateKind;

const char* kBase = "call_0123456789abcdef01234567";

ToolSpec Spec(ToolChoice choice = ToolChoice::kAuto) {
  ToolSpec s;
  s.tools = {{"get_weather", "{}", ""}, {"now", "{}", ""}, {"search", "{}", ""}};
  s.choice = choice;
  return s;
}

struct Streamed {
  std::string content;
  std::vector<ToolCall> calls;    // ids and names from each call's first piece, arguments concatenated
  std::vector<int> pieces;        // per call: argument pieces sent before Finish
  std::vector<bool> whole_early;  // per call: all its arguments were sent before Finish
  ToolCallStream::End end;
};

// Feeds `text` cut at `cuts` (ascending), then finishes.
Streamed Stream(const std::string& text, ChatTemplateKind kind, const ToolSpec& spec, const std::vector<size_t>& cuts) {
  Streamed r;
  ToolCallStream s(kind, &spec, kBase);
  auto take = [&r](const std::vector<ToolStreamPiece>& pieces, bool early) {
    for (const ToolStreamPiece& p : pieces) {
      if (p.call < 0) {
        EXPECT_FALSE(p.text.empty());
        r.content += p.text;
      } else if (!p.id.empty()) {
        EXPECT_EQ(p.call, static_cast<int>(r.calls.size())) << "calls open in index order";
        EXPECT_EQ(p.text, "");
        r.calls.push_back({p.id, p.name, ""});
        r.pieces.push_back(0);
      } else {
        EXPECT_LT(p.call, static_cast<int>(r.calls.size())) << "arguments of a call not opened";
        if (p.call >= static_cast<int>(r.calls.size())) continue;
        EXPECT_FALSE(p.text.empty());
        r.calls[p.call].arguments += p.text;
        if (early) ++r.pieces[p.call];
      }
    }
  };
  size_t at = 0;
  std::vector<size_t> ends = cuts;
  ends.push_back(text.size());
  for (size_t end : ends) {
    if (end <= at) continue;
    take(s.Push(std::string_view(text).substr(at, end - at)), true);
    at = end;
  }
  r.end = s.Finish();
  const std::vector<ToolCall> before = r.calls;
  take(r.end.pieces, false);
  for (size_t i = 0; i < before.size(); ++i) r.whole_early.push_back(before[i].arguments == r.calls[i].arguments);
  return r;
}

struct Expected {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments (compact JSON)
};

// Every split of `text` streams exactly `want`, which is also what the whole-reply parse reads.
void ExpectStreams(const std::string& text, ChatTemplateKind kind, const ToolSpec& spec, const Expected& want) {
  SCOPED_TRACE(text);
  ToolOutput whole = ParseToolOutput(text, kind, spec);
  NameToolCalls(kind, kBase, &whole.calls);
  ASSERT_EQ(whole.content, want.content) << "the whole-reply parse disagrees with the hand-written reading";
  ASSERT_EQ(whole.calls.size(), want.calls.size());
  for (size_t i = 0; i < want.calls.size(); ++i) {
    ASSERT_EQ(whole.calls[i].name, want.calls[i].first);
    ASSERT_EQ(whole.calls[i].arguments, want.calls[i].second);
    ASSERT_EQ(json::parse(whole.calls[i].arguments), json::parse(want.calls[i].second));
  }
  std::vector<std::vector<size_t>> splits = {{}};
  for (size_t k = 1; k < text.size(); ++k) splits.push_back({k});
  for (size_t step = 1; step < text.size(); ++step) {
    std::vector<size_t> cuts;
    for (size_t k = step; k < text.size(); k += step) cuts.push_back(k);
    splits.push_back(cuts);
  }
  for (const auto& cuts : splits) {
    SCOPED_TRACE("first cut " + std::to_string(cuts.empty() ? 0 : cuts[0]) + ", " + std::to_string(cuts.size()) + " cuts");
    const Streamed r = Stream(text, kind, spec, cuts);
    EXPECT_EQ(r.content, want.content);
    ASSERT_EQ(r.calls.size(), want.calls.size());
    for (size_t i = 0; i < want.calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].id, whole.calls[i].id);
      EXPECT_EQ(r.calls[i].name, want.calls[i].first);
      EXPECT_EQ(r.calls[i].arguments, want.calls[i].second);
    }
    EXPECT_TRUE(r.end.exact);
    EXPECT_EQ(r.end.output.content, whole.content);
    ASSERT_EQ(r.end.output.calls.size(), whole.calls.size());
    for (size_t i = 0; i < whole.calls.size(); ++i) {
      EXPECT_EQ(r.end.output.calls[i].id, whole.calls[i].id);
      EXPECT_EQ(r.end.output.calls[i].arguments, whole.calls[i].arguments);
    }
  }
}

const std::string kWeather = R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}})";
const std::string kWeatherArgs = R"({"city":"Paris","unit":"c"})";

TEST(ToolCallStream, ChatMLBlocks) {
  const ToolSpec spec = Spec();
  const auto k = ChatTemplateKind::kChatML;
  // Content before a call.
  ExpectStreams("Let me check.\n<tool_call>\n" + kWeather + "\n</tool_call>", k, spec,
                {"Let me check.", {{"get_weather", kWeatherArgs}}});
  // Parallel calls (two blocks, text between them; one block holding an array).
  ExpectStreams("<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\nAnd:\n<tool_call>\n" + kWeather +
                    "\n</tool_call>",
                k, spec, {"\nAnd:", {{"now", "{}"}, {"get_weather", kWeatherArgs}}});
  ExpectStreams("<tool_call>[{\"name\": \"search\", \"arguments\": {\"q\": [1, 2.50, true, null]}}, " + kWeather +
                    "]</tool_call>",
                k, spec, {"", {{"search", R"({"q":[1,2.5,true,null]})"}, {"get_weather", kWeatherArgs}}});
  // A last block without its closing tag (the reply stopped at the end of turn).
  ExpectStreams("On it. <tool_call>\n" + kWeather, k, spec, {"On it.", {{"get_weather", kWeatherArgs}}});
  // Arguments as a JSON string; the name after the arguments; a key ReadCall ignores.
  ExpectStreams(R"(<tool_call>{"arguments": "{\"city\": \"S\\u00e3o Paulo\", \"n\": 1E2}", "id": 7, "name": "get_weather"}</tool_call>)",
                k, spec, {"", {{"get_weather", R"({"city":"São Paulo","n":100.0})"}}});
  // Escapes are written as nlohmann writes them.
  ExpectStreams(R"(<tool_call>{"name": "search", "arguments": {"q": "a\/b \u00e9 \ud83d\ude00 \"x\"\n", "emoji": "😀"}}</tool_call>)",
                k, spec, {"", {{"search", R"({"q":"a/b é 😀 \"x\"\n","emoji":"😀"})"}}});
  // An undeclared function's block is content; the next block is still a call.
  ExpectStreams(R"(<tool_call>{"name": "rm", "arguments": {}}</tool_call> then <tool_call>{"name": "now"}</tool_call>)", k, spec,
                {R"(<tool_call>{"name": "rm", "arguments": {}}</tool_call> then)", {{"now", "{}"}}});
  // Text that only looks like the start of a marker.
  ExpectStreams("a < b <tool and <tool_cal", k, spec, {"a < b <tool and <tool_cal", {}});
  ExpectStreams("Plain words.\n\n", k, spec, {"Plain words.\n\n", {}});
}

TEST(ToolCallStream, Llama3Calls) {
  const ToolSpec spec = Spec();
  const auto k = ChatTemplateKind::kLlama3;
  ExpectStreams(R"( {"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}})", k, spec,
                {"", {{"get_weather", R"({"city":"Oslo","unit":"c"})"}}});
  ExpectStreams(R"(<|python_tag|> {"name": "now", "parameters": {}})", k, spec, {"", {{"now", "{}"}}});
  // Parallel: calls separated by ';', or an array.
  ExpectStreams(R"({"name": "now", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "Rome"}})", k, spec,
                {"", {{"now", "{}"}, {"get_weather", R"({"city":"Rome"})"}}});
  ExpectStreams(R"([{"name": "now", "parameters": {}}, {"name": "search", "parameters": {"q": "x;y"}}])", k, spec,
                {"", {{"now", "{}"}, {"search", R"({"q":"x;y"})"}}});
  // Not calls: text, JSON that is not a call, an undeclared function.
  for (const std::string& text : {std::string("  Hello {x}"), std::string(R"({"answer": 42} is it)"), std::string("<|pyx"),
                                 std::string(R"([{"name": "rm", "parameters": {}}, {"name": "now"}])")})
    ExpectStreams(text, k, spec, {text, {}});
}

TEST(ToolCallStream, MistralCalls) {
  const ToolSpec spec = Spec();
  const auto k = ChatTemplateKind::kMistral;
  // The [TOOL_CALLS] control token is usually dropped by detokenization: the reply is the array.
  const std::string calls = R"([{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "a1B2c3D4e"}, {"name": "now", "arguments": {}}])";
  const Expected two{"", {{"get_weather", R"({"city":"Oslo"})"}, {"now", "{}"}}};
  ExpectStreams(" " + calls, k, spec, two);
  ExpectStreams("[TOOL_CALLS] " + calls, k, spec, two);
  ExpectStreams("Checking.\n[TOOL_CALLS] " + calls, k, spec, {"Checking.", two.calls});
  ExpectStreams(R"({"name": "now", "arguments": {}})", k, spec, {"", {{"now", "{}"}}});
  for (const std::string& text : {std::string("[1] is a footnote."), std::string("Plain [TOOL words [TOOL_CALL"),
                                 std::string("[TOOL_CALLS] not JSON"), std::string(R"([{"name": "rm", "arguments": {}}])"),
                                 std::string("[]"), std::string("Hello")})
    ExpectStreams(text, k, spec, {text, {}});
}

TEST(ToolCallStream, ForcedCalls) {
  // Decoded under the tool grammar: bare compact JSON, an array for parallel calls.
  for (ChatTemplateKind k : {ChatTemplateKind::kChatML, ChatTemplateKind::kMistral}) {
    ExpectStreams(R"({"name":"get_weather","arguments":{"city":"Oslo","unit":"c","days":3}})", k, Spec(ToolChoice::kRequired),
                  {"", {{"get_weather", R"({"city":"Oslo","unit":"c","days":3})"}}});
    ExpectStreams(R"([{"name":"now","arguments":{}},{"name":"search","arguments":{"query":"x","tags":["a","b"]}}])", k,
                  Spec(ToolChoice::kRequired), {"", {{"now", "{}"}, {"search", R"({"query":"x","tags":["a","b"]})"}}});
  }
  ToolSpec named = Spec(ToolChoice::kFunction);
  named.function = "now";
  ExpectStreams(R"({"name":"now","parameters":{"x":0.50}})", ChatTemplateKind::kLlama3, named, {"", {{"now", R"({"x":0.5})"}}});
}

// Arguments go out while they are written: several pieces, all sent when the call's JSON
// closes (before the reply ends); content before the call goes out before its marker is
// whole.
TEST(ToolCallStream, ArgumentsStreamAsTheyArrive) {
  const ToolSpec spec = Spec();
  const std::string text = "Let me check.\n<tool_call>\n" + kWeather + "\n</tool_call>";
  const std::vector<size_t> bytes = [&] {
    std::vector<size_t> v;
    for (size_t k = 1; k < text.size(); ++k) v.push_back(k);
    return v;
  }();
  const Streamed r = Stream(text, ChatTemplateKind::kChatML, spec, bytes);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_GT(r.pieces[0], 10);
  EXPECT_TRUE(r.whole_early[0]);

  ToolCallStream s(ChatTemplateKind::kChatML, &spec, kBase);
  auto content = [](const std::vector<ToolStreamPiece>& p) {
    std::string c;
    for (const ToolStreamPiece& x : p) c += x.call < 0 ? x.text : "";
    return c;
  };
  EXPECT_EQ(content(s.Push("Sure, ")), "Sure,");  // the space waits: the parse trims it before a call
  EXPECT_EQ(content(s.Push("I will <tool")), " I will");
  std::vector<ToolStreamPiece> p = s.Push("_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].id, ToolCallId(ChatTemplateKind::kChatML, kBase, 0));
  EXPECT_EQ(p[0].name, "get_weather");
  EXPECT_EQ(p[1].text, "{");  // the key is sent once it is whole
  p = s.Push("ty\": \"Par");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].text, "\"city\":\"Par");
  p = s.Push("is\"}}\n</tool_call> Done");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].text, "is\"}");
  EXPECT_EQ(p[1].text, "  Done");  // the space held before the call, and this one
  EXPECT_TRUE(s.Finish().exact);

  // Llama-3: a reply that opens with text goes out at once; JSON that is no call as soon
  // as it is known.
  ToolCallStream l(ChatTemplateKind::kLlama3, &spec, kBase);
  EXPECT_EQ(content(l.Push("  ")), "");
  EXPECT_EQ(content(l.Push("{\"answer\": 4")), "");
  EXPECT_EQ(content(l.Push("2} ok")), "  {\"answer\": 42} ok");
  ToolCallStream t(ChatTemplateKind::kLlama3, &spec, kBase);
  EXPECT_EQ(content(t.Push("Hi")), "Hi");
  // Mistral: a reply that opens with '[' that is no call.
  ToolCallStream m(ChatTemplateKind::kMistral, &spec, kBase);
  EXPECT_EQ(content(m.Push("[1] is a")), "[1] is a");
}

// A call the stream opened and that then does not read: its pieces stay sent, the content
// is still the whole-reply parse's, the stream is not exact (documented in
// tool_call_stream.h and docs/serving.md).
TEST(ToolCallStream, OpenedCallsThatDoNotRead) {
  struct Case {
    std::string text;
    ChatTemplateKind kind;
    ToolChoice choice;
  } cases[] = {
      {R"({"name":"get_weather","arguments":{"city":"Os)", ChatTemplateKind::kChatML, ToolChoice::kRequired},  // max_tokens
      {R"({"name": "now", "parameters": {}} and then text)", ChatTemplateKind::kLlama3, ToolChoice::kAuto},
      // The whole-reply parse splits at every ';', one inside a string too.
      {R"({"name": "now", "parameters": {"q": "a;b"}}; {"name": "now"})", ChatTemplateKind::kLlama3, ToolChoice::kAuto},
      {R"({"name": "now", "parameters": {}} ;)", ChatTemplateKind::kLlama3, ToolChoice::kAuto},
      {R"(<tool_call>{"name": "search", "arguments": {"q": "</tool_call>"}}</tool_call>)", ChatTemplateKind::kChatML,
       ToolChoice::kAuto},
      {R"([{"name": "now", "arguments": {}}, {"name": "rm", "arguments": {}}])", ChatTemplateKind::kMistral, ToolChoice::kAuto},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    const ToolSpec spec = Spec(c.choice);
    const ToolOutput whole = ParseToolOutput(c.text, c.kind, spec);
    ASSERT_TRUE(whole.calls.empty());
    for (size_t k = 1; k < c.text.size(); ++k) {
      const Streamed r = Stream(c.text, c.kind, spec, {k});
      EXPECT_EQ(r.content, whole.content);
      EXPECT_EQ(r.end.output.content, whole.content);
      EXPECT_TRUE(r.end.output.calls.empty());
      EXPECT_EQ(r.end.exact, r.calls.empty());
    }
  }
  // Repeated keys: nlohmann keeps the last value at the first key's place; what was sent
  // before the repeat cannot be taken back. The call reads (the response has it), the
  // stream is not exact -- unless the repeat arrived before anything of the arguments was
  // sent (here: the reply in one piece), when the settlement sends the call whole.
  const std::string text = R"(<tool_call>{"name": "search", "arguments": {"q": "a", "q": "b"}}</tool_call>)";
  std::vector<size_t> bytes;
  for (size_t k = 1; k < text.size(); ++k) bytes.push_back(k);
  for (const auto& cuts : {bytes, std::vector<size_t>{}}) {
    const Streamed r = Stream(text, ChatTemplateKind::kChatML, Spec(), cuts);
    EXPECT_EQ(r.end.exact, cuts.empty());
    ASSERT_EQ(r.end.output.calls.size(), 1u);
    EXPECT_EQ(r.end.output.calls[0].arguments, R"({"q":"b"})");
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].arguments, cuts.empty() ? R"({"q":"b"})" : R"({"q":"a",)");
  }
}

// Replies made of random content and calls in each family's format, cut at random places:
// exact, and equal to the whole-reply parse. Corrupted ones too: their content is always
// the whole-reply parse's, and so are their calls whenever the stream says it is exact.
TEST(ToolCallStream, RandomRepliesEqualTheWholeReplyParse) {
  std::mt19937_64 rng(35);
  auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  const std::vector<std::string> words = {"Sure", ",", " ", "\n", "I'll", " check", "<", "[x]", "{y}", "é", "\t"};
  const std::vector<std::string> call_json = {
      R"({"name": "now", "arguments": {}})", R"({"name":"search","arguments":{"q":"a \"b\" \u00e9","n":[1,2.0]}})",
      kWeather, R"({"arguments": {"x": null}, "name": "search"})", R"({"name": "now"})",
      R"({"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"})"};
  const ToolSpec spec = Spec();
  int with_calls = 0, corrupted = 0, inexact = 0;
  for (int i = 0; i < 2000; ++i) {
    const ChatTemplateKind kind = std::vector<ChatTemplateKind>{ChatTemplateKind::kChatML, ChatTemplateKind::kLlama3,
                                                                ChatTemplateKind::kMistral}[i % 3];
    std::string text;
    auto some_words = [&] {
      std::string s;
      for (size_t n = pick(4); n > 0; --n) s += words[pick(words.size())];
      return s;
    };
    const size_t n_calls = pick(3);
    std::string params;
    for (size_t c = 0; c < n_calls; ++c) params += (c ? ", " : "") + call_json[pick(call_json.size())];
    if (kind == ChatTemplateKind::kChatML) {
      text = some_words();
      for (size_t c = 0; c < n_calls; ++c) text += "<tool_call>\n" + call_json[pick(call_json.size())] + "\n</tool_call>" + some_words();
    } else if (kind == ChatTemplateKind::kLlama3) {
      std::string p = params;
      for (size_t at; (at = p.find("\"arguments\"")) != std::string::npos;) p.replace(at, 11, "\"parameters\"");
      text = n_calls == 0 ? some_words() : std::string(pick(2) ? " " : "") + (n_calls > 1 ? "[" + p + "]" : p);
    } else {
      text = n_calls == 0 ? some_words() : (pick(2) ? some_words() + "[TOOL_CALLS] " : std::string(" ")) + "[" + params + "]";
    }
    // Half of them corrupted: a byte removed, doubled or replaced.
    const bool corrupt = i % 2 == 1 && !text.empty();
    if (corrupt) {
      const size_t at = pick(text.size());
      static const std::string kBytes = "{}[]\",:;\\ <>/x";
      switch (pick(3)) {
        case 0: text.erase(at, 1); break;
        case 1: text.insert(at, 1, text[at]); break;
        default: text[at] = kBytes[pick(kBytes.size())];
      }
    }
    SCOPED_TRACE(text);
    ToolOutput whole = ParseToolOutput(text, kind, spec);
    NameToolCalls(kind, kBase, &whole.calls);
    std::vector<size_t> cuts;
    for (size_t k = 1; k < text.size(); ++k)
      if (pick(4) == 0) cuts.push_back(k);
    const Streamed r = Stream(text, kind, spec, cuts);
    // Content is always the whole-reply parse's; so is what the response reads.
    EXPECT_EQ(r.content, whole.content);
    EXPECT_EQ(r.end.output.content, whole.content);
    ASSERT_EQ(r.end.output.calls.size(), whole.calls.size());
    for (size_t c = 0; c < whole.calls.size(); ++c) EXPECT_EQ(r.end.output.calls[c].arguments, whole.calls[c].arguments);
    if (corrupt) {
      ++corrupted;
      if (!r.end.exact) ++inexact;
    } else {
      if (!whole.calls.empty()) ++with_calls;
      EXPECT_TRUE(r.end.exact);
    }
    if (!r.end.exact) continue;
    ASSERT_EQ(r.calls.size(), whole.calls.size());
    for (size_t c = 0; c < whole.calls.size(); ++c) {
      EXPECT_EQ(r.calls[c].id, whole.calls[c].id);
      EXPECT_EQ(r.calls[c].name, whole.calls[c].name);
      EXPECT_EQ(r.calls[c].arguments, whole.calls[c].arguments);
    }
  }
  EXPECT_GT(with_calls, 100);
  // Corruptions that break a call the stream had opened are the inexact ones: some, not most.
  EXPECT_GT(inexact, 0);
  EXPECT_LT(inexact, corrupted / 2);
}

TEST(ToolCallStream, SseDeltas) {
  ResponseMeta meta;
  meta.kind = ApiKind::kChat;
  meta.id = "chatcmpl-1";
  meta.model = "m";
  const std::vector<ToolStreamPiece> pieces = {
      {-1, "Hi", "", ""}, {0, "", "call_a0", "now"}, {0, "{}", "", ""}, {1, "", "call_a1", "get_weather"},
      {1, "{\"city\":", "", ""}, {1, "\"x\"}", "", ""}};
  const std::string events = ToolStreamEvents(meta, pieces, /*include_usage=*/true);
  std::vector<json> chunks;  // each event is "data: <JSON>\n\n"
  for (size_t at = 0, end; at < events.size(); at = end + 2) {
    end = events.find("\n\n", at);
    ASSERT_EQ(events.compare(at, 6, "data: "), 0);
    chunks.push_back(json::parse(events.substr(at + 6, end - at - 6)));
  }
  ASSERT_EQ(chunks.size(), 6u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"], json::parse(R"({"content":"Hi"})"));
  EXPECT_EQ(chunks[1]["choices"][0]["delta"]["tool_calls"][0],
            json::parse(R"({"index":0,"id":"call_a0","type":"function","function":{"name":"now","arguments":""}})"));
  EXPECT_EQ(chunks[2]["choices"][0]["delta"]["tool_calls"][0], json::parse(R"({"index":0,"function":{"arguments":"{}"}})"));
  EXPECT_EQ(chunks[5]["choices"][0]["delta"]["tool_calls"][0], json::parse(R"({"index":1,"function":{"arguments":"\"x\"}"}})"));
  for (const json& c : chunks) {
    EXPECT_TRUE(c["usage"].is_null());
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  }
}

}  // namespace
}  // namespace attic::server
