// Chat templates: the four prompt formats Llama-family instruction models use. The
// family is detected from the template text in tokenizer_config.json / GGUF, or named by
// the user (--chat-template chatml|llama3|llama2|mistral).
#pragma once

#include <string>
#include <vector>

#include "attic/core/status.h"

namespace attic::tokenizer {

// kMistral: Mistral-7B-Instruct-v0.3's tool-calling template ([INST] turns, the tools in
// [AVAILABLE_TOOLS] before the last user message, [TOOL_CALLS] / [TOOL_RESULTS]);
// kLlama2 also covers the earlier Mistral templates, which have no tool format.
enum class ChatTemplateKind { kChatML, kLlama3, kLlama2, kMistral };

// A function call an assistant turn made (OpenAI's tool_calls[i]).
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text (an object as a rule)
};

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" or "tool"
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // assistant turns that called tools
  std::string tool_call_id;              // "tool" turns: the call this is the result of
};

// "chatml", "llama3", "llama2", "mistral". InvalidArgument otherwise.
// The names ParseChatTemplateKind accepts, for help texts and errors.
inline constexpr char kChatTemplateNames[] = "chatml, llama3, llama2, mistral";
StatusOr<ChatTemplateKind> ParseChatTemplateKind(const std::string& name);
const char* ChatTemplateKindName(ChatTemplateKind k);

// Recognises the family from a Jinja template's text: <|start_header_id|> Llama-3,
// <|im_start|> ChatML, [TOOL_CALLS] or [AVAILABLE_TOOLS] Mistral, any other [INST]
// Llama-2. An empty or unknown template is InvalidArgument with a message naming
// --chat-template.
StatusOr<ChatTemplateKind> DetectChatTemplate(const std::string& jinja_text);

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Llama-2 / Llama-3. Llama-3 uses <|begin_of_text|>; for kLlama3 the default "<s>"
  // is taken to mean that.
  std::string bos_token = "<s>";
  std::string eos_token = "</s>";
  // ChatML templates of SmolLM2 insert this system prompt when none is given ("" = none).
  std::string default_system_prompt;
  // The request's tool definitions, each a JSON object's text as the client wrote it
  // ({"type": "function", "function": {...}}, keys in the client's order). With tools, or
  // with "tool" turns or tool calls in the messages, the family's tool format is rendered
  // (chat_tools.cc): ChatML as Qwen2.5's Hermes-style template (<tools>, <tool_call>,
  // <tool_response>), Llama-3 as Llama 3.1's (JSON calls, "ipython" results), Mistral as
  // Mistral-7B-Instruct-v0.3's ([AVAILABLE_TOOLS], [TOOL_CALLS], [TOOL_RESULTS]; call ids
  // as MistralToolCallId writes them); Llama-2 has none (InvalidArgument).
  std::vector<std::string> tools;
  // Llama 3.1's "Today Date" line (its template's default).
  std::string date_string = "26 Jul 2024";
};

// Renders messages exactly as the family's reference Jinja template does.
// InvalidArgument for unknown roles or (Llama-2) roles out of order.
StatusOr<std::string> RenderChat(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                 const ChatRenderOptions& opts = {});

// The system prompt a ChatML template inserts when the conversation has none, read
// from the template text: SmolLM2's "You are a helpful AI assistant named SmolLM, ...",
// Qwen2's "You are a helpful assistant.". "" if the template has no such default.
std::string DefaultSystemPrompt(const std::string& jinja_text);

// A tool call id as the Mistral family renders it: Mistral's templates take exactly 9
// characters (Mistral's own ids are 9 of [A-Za-z0-9]) and raise on anything else. An id
// that is 9 alphanumerics is kept; any other (OpenAI's "call_...", "call_1") becomes 9
// alphanumerics derived from it: base 62 of its 64-bit FNV-1a hash, least significant
// digit first, digits 0-9a-zA-Z. The same id always gives the same result, so a call and
// its result stay paired.
std::string MistralToolCallId(const std::string& id);

// Whether rendering takes the family's tool format (tools given, or tool turns present).
bool ChatUsesTools(const std::vector<ChatMessage>& messages, const ChatRenderOptions& opts);

// Python's json.dumps(value, ensure_ascii=False[, indent]) of a JSON text, as chat
// templates' `tojson` writes it: ", " and ": " separators, or `indent` spaces per level
// with "," at line ends. InvalidArgument if `json_text` is not JSON.
StatusOr<std::string> PythonJsonDumps(const std::string& json_text, int indent = -1);

// Strings that end an assistant turn in this family (e.g. "<|im_end|>", "<|eot_id|>").
std::vector<std::string> ChatStopTokens(ChatTemplateKind kind);

}  // namespace attic::tokenizer
