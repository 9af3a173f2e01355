// Tools (OpenAI's function calling) on the server: what a request asks for (`tools`,
// `tool_choice`, `parallel_tool_calls`), the grammar that forces a valid call when the
// request demands one, and the model's output read back into calls (whole; streamed:
// tool_call_stream.h).
//
// Each chat template family has its models' call format (tokenizer/chat_template.h says
// how tools and results are rendered into the prompt):
//   ChatML (Hermes / Qwen2.5)  <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//                              blocks, possibly after some text; several per turn.
//   Llama-3 (3.1 JSON calls)   the whole reply is {"name": ..., "parameters": {...}}
//                              (optionally after <|python_tag|>); one call per turn.
//   Mistral (v0.3)             [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]: a
//                              control token, which detokenization drops, so the reply is
//                              read as calls when it is such an array (or one object),
//                              with or without the marker; text before a visible marker
//                              is content. Ids are 9 alphanumerics (MistralToolCallId).
// With tool_choice "required" or a named function the reply is decoded under a grammar
// (grammar::Grammar::ToolCalls): bare JSON, {"name":...,"arguments"|"parameters":{...}}
// or, for "required" with parallel calls (ChatML, Mistral), an array of them; the
// arguments follow the chosen function's JSON Schema (the structured-outputs subset).
//
// Thread-safety: free functions and values.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "attic/grammar/json_grammar.h"
#include "attic/tokenizer/chat_template.h"

namespace attic::server {

enum class ToolChoice { kNone, kAuto, kRequired, kFunction };

// A request's tools, validated.
struct ToolSpec {
  struct Tool {
    std::string name;         // ^[A-Za-z0-9_-]{1,64}$, unique in the request
    std::string json;         // the tool object as the client wrote it (keys in order)
    std::string parameters;   // its JSON Schema as JSON text ("" = none: no arguments)
  };
  std::vector<Tool> tools;
  ToolChoice choice = ToolChoice::kNone;  // default: auto with tools, none without
  std::string function;                   // kFunction: the function's name
  bool parallel = true;                   // parallel_tool_calls

  bool active() const { return !tools.empty() && choice != ToolChoice::kNone; }
  bool forced() const { return choice == ToolChoice::kRequired || choice == ToolChoice::kFunction; }
  std::vector<std::string> ToolJson() const;  // each tool's JSON text, in order
};

inline constexpr size_t kMaxTools = 128;

// The grammar a forced call follows (tool_choice "required" or a named function):
// InvalidArgument when a function's parameters are outside the supported JSON Schema
// subset (the message names the function). Not forced: null.
StatusOr<std::shared_ptr<const grammar::Grammar>> ToolCallGrammar(const ToolSpec& spec, tokenizer::ChatTemplateKind kind);

// A call read from the model's output.
struct ToolCall {
  std::string id;         // NameToolCalls gives it
  std::string name;
  std::string arguments;  // compact JSON text of an object
};

struct ToolOutput {
  std::string content;          // the reply's text outside the calls
  std::vector<ToolCall> calls;  // empty: a plain reply
};

// Reads one JSON text of calls (surrounding whitespace allowed): a call or a non-empty
// array of calls, each {"name": <a declared function>, "arguments"|"parameters": <object,
// or its JSON text>}; the arguments are written compact (nlohmann's dump). False, and
// nothing added, unless every call reads.
bool ReadToolCallJson(const std::string& text, const ToolSpec& spec, std::vector<ToolCall>* out);

// Reads a finished reply. `forced`: decoded under ToolCallGrammar (bare JSON). Calls of
// functions the request did not declare, or whose JSON does not parse, stay text. Ids
// are left empty.
ToolOutput ParseToolOutput(const std::string& text, tokenizer::ChatTemplateKind kind, const ToolSpec& spec);

// Gives a reply's calls their ids from `base`, a random id of this reply: base + the
// call's index ("call_..." as OpenAI writes them), or for the Mistral family 9
// alphanumerics derived from that (its templates take no other id, so a call sent back
// in the next turn is rendered with the id the client has).
void NameToolCalls(tokenizer::ChatTemplateKind kind, const std::string& base, std::vector<ToolCall>* calls);
// The id NameToolCalls gives call `index`.
std::string ToolCallId(tokenizer::ChatTemplateKind kind, const std::string& base, size_t index);

}  // namespace attic::server
