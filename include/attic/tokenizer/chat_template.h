// Chat templates: the three prompt formats Llama-family instruction models use. The
// family is detected from the template text in tokenizer_config.json / GGUF, or named by
// the user (--chat-template chatml|llama3|llama2).
#pragma once

#include <string>
#include <vector>

#include "attic/core/status.h"

namespace attic::tokenizer {

enum class ChatTemplateKind { kChatML, kLlama3, kLlama2 };

struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;
};

// "chatml", "llama3", "llama2" (also "mistral" -> llama2). InvalidArgument otherwise.
// The names ParseChatTemplateKind accepts, for help texts and errors.
inline constexpr char kChatTemplateNames[] = "chatml, llama3, llama2 (or mistral)";
StatusOr<ChatTemplateKind> ParseChatTemplateKind(const std::string& name);
const char* ChatTemplateKindName(ChatTemplateKind k);

// Recognises the family from a Jinja template's text. An empty or unknown template is
// InvalidArgument with a message naming --chat-template.
StatusOr<ChatTemplateKind> DetectChatTemplate(const std::string& jinja_text);

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Llama-2 / Llama-3. Llama-3 uses <|begin_of_text|>; for kLlama3 the default "<s>"
  // is taken to mean that.
  std::string bos_token = "<s>";
  std::string eos_token = "</s>";
  // ChatML templates of SmolLM2 insert this system prompt when none is given ("" = none).
  std::string default_system_prompt;
};

// Renders messages exactly as the family's reference Jinja template does.
// InvalidArgument for unknown roles or (Llama-2) roles out of order.
StatusOr<std::string> RenderChat(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                 const ChatRenderOptions& opts = {});

// The system prompt a ChatML template inserts when the conversation has none, read
// from the template text: SmolLM2's "You are a helpful AI assistant named SmolLM, ...",
// Qwen2's "You are a helpful assistant.". "" if the template has no such default.
std::string DefaultSystemPrompt(const std::string& jinja_text);

// Strings that end an assistant turn in this family (e.g. "<|im_end|>", "<|eot_id|>").
std::vector<std::string> ChatStopTokens(ChatTemplateKind kind);

}  // namespace attic::tokenizer
