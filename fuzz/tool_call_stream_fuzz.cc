// Streamed tool calls (src/server/tool_call_stream.cc): a model's reply, which the
// server does not control, split into content and call deltas as it arrives. The first
// byte picks the template family (bits 0-1: ChatML, Llama-3, Mistral, ChatML),
// tool_choice (bits 2-3: auto, auto, required, the function "now") and the size of the
// pieces the reply arrives in (bits 4-7: 1..16 bytes); the rest is the reply.
//
// Invariants: no crash; the pieces are well formed (calls open in index order with the
// ids NameToolCalls gives, arguments only for opened calls, nothing empty); the content
// they carry is always the whole-reply parse's (ParseToolOutput, the non-streamed
// response); End::output is that parse; when the stream says it is exact, the calls and
// arguments the pieces add up to are the parse's; every SSE chunk is JSON.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "attic/server/openai_api.h"
#include "attic/server/tool_call_stream.h"
#include "fuzz_check.h"

using namespace attic::server;
using attic::tokenizer::ChatTemplateKind;

namespace {

void CheckEvents(const ResponseMeta& meta, const std::vector<ToolStreamPiece>& pieces) {
  // Events are "data: <JSON>\n\n" (JSON escapes every newline inside it).
  const std::string events = ToolStreamEvents(meta, pieces, /*include_usage=*/false);
  for (size_t at = 0, end; at < events.size(); at = end + 2) {
    end = events.find("\n\n", at);
    FUZZ_CHECK(end != std::string::npos && events.compare(at, 6, "data: ") == 0, "not an SSE event");
    const auto j = nlohmann::json::parse(events.substr(at + 6, end - at - 6), nullptr, /*allow_exceptions=*/false);
    FUZZ_CHECK(!j.is_discarded(), "an SSE chunk is not JSON");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const ChatTemplateKind kind = (mode & 3) == 1 ? ChatTemplateKind::kLlama3
                                : (mode & 3) == 2 ? ChatTemplateKind::kMistral
                                                  : ChatTemplateKind::kChatML;
  ToolSpec spec;
  spec.tools = {{"get_weather", "{}", ""}, {"now", "{}", ""}};
  const int choice = (mode >> 2) & 3;
  spec.choice = choice == 2 ? ToolChoice::kRequired : choice == 3 ? ToolChoice::kFunction : ToolChoice::kAuto;
  if (spec.choice == ToolChoice::kFunction) spec.function = "now";
  const size_t piece = 1 + (mode >> 4);
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);

  const std::string base = "call_0123456789abcdef01234567";
  ResponseMeta meta;
  meta.id = "chatcmpl-f";
  meta.model = "m";
  ToolCallStream stream(kind, &spec, base);
  std::string content;
  std::vector<ToolCall> calls;
  auto take = [&](const std::vector<ToolStreamPiece>& pieces) {
    CheckEvents(meta, pieces);
    for (const ToolStreamPiece& p : pieces) {
      if (p.call < 0) {
        FUZZ_CHECK(!p.text.empty(), "an empty content piece");
        content += p.text;
      } else if (!p.id.empty()) {
        FUZZ_CHECK(p.call == static_cast<int>(calls.size()), "call %d opened after %zu", p.call, calls.size());
        FUZZ_CHECK(p.id == ToolCallId(kind, base, calls.size()), "call %d has id %s", p.call, p.id.c_str());
        FUZZ_CHECK(p.text.empty() && !p.name.empty());
        calls.push_back({p.id, p.name, ""});
      } else {
        FUZZ_CHECK(p.call < static_cast<int>(calls.size()), "arguments of call %d, not opened", p.call);
        FUZZ_CHECK(!p.text.empty(), "an empty piece of arguments");
        calls[p.call].arguments += p.text;
      }
    }
  };
  for (size_t at = 0; at < text.size(); at += piece) take(stream.Push(std::string_view(text).substr(at, piece)));
  ToolCallStream::End end = stream.Finish();
  take(end.pieces);

  ToolOutput whole = ParseToolOutput(text, kind, spec);
  NameToolCalls(kind, base, &whole.calls);
  FUZZ_CHECK(content == whole.content, "content streamed differs from the whole-reply parse's");
  FUZZ_CHECK(end.output.content == whole.content);
  FUZZ_CHECK(end.output.calls.size() == whole.calls.size());
  for (size_t i = 0; i < whole.calls.size(); ++i) {
    FUZZ_CHECK(end.output.calls[i].id == whole.calls[i].id);
    FUZZ_CHECK(end.output.calls[i].arguments == whole.calls[i].arguments);
  }
  if (end.exact) {
    FUZZ_CHECK(calls.size() == whole.calls.size(), "exact, with %zu calls streamed and %zu read", calls.size(),
               whole.calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      FUZZ_CHECK(calls[i].id == whole.calls[i].id && calls[i].name == whole.calls[i].name);
      FUZZ_CHECK(calls[i].arguments == whole.calls[i].arguments, "call %zu: %s streamed, %s read", i,
                 calls[i].arguments.c_str(), whole.calls[i].arguments.c_str());
    }
  } else {
    FUZZ_CHECK(!calls.empty(), "not exact, and no call was opened");
  }
  return 0;
}
