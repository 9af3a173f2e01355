// Internal: the chat template families' tool formats (chat_tools.cc), used by RenderChat
// when a conversation has tools, tool calls or tool results.
#pragma once

#include <string>
#include <vector>

#include "attic/tokenizer/chat_template.h"

namespace attic::tokenizer {

// ChatML: Qwen2.5-Instruct's template (tools in the system turn inside <tools></tools>,
// calls as <tool_call> blocks, results as <tool_response> blocks in a user turn).
// Llama-3: Llama 3.1-Instruct's template (tools_in_user_message: the tools and their
// instructions open the first user turn; a call is {"name": ..., "parameters": ...}; a
// result is an "ipython" turn). Mistral: Mistral-7B-Instruct-v0.3's template, which
// renders every conversation of the family, with tools or without. Llama-2:
// InvalidArgument (the family has no tool format).
StatusOr<std::string> RenderChatWithTools(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                          const ChatRenderOptions& opts);

}  // namespace attic::tokenizer
