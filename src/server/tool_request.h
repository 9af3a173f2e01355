// Internal: the request fields of tools (openai_request.cc reads the rest): `tools`,
// `tool_choice`, `parallel_tool_calls`, and the tool parts of messages (an assistant's
// `tool_calls`, a tool result's `tool_call_id`). Every error is a 400 naming the field.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "attic/server/openai_api.h"

namespace attic::server {

// `body`: the request in the client's key order (tools are rendered as written).
std::optional<ApiError> ReadToolFields(const nlohmann::ordered_json& body, ToolSpec* spec);

// Message i (`m`, with role `role` after aliases) into *cm: "tool" needs `tool_call_id`;
// "assistant" may carry `tool_calls` (then `content` may be null); no other role may.
std::optional<ApiError> ReadMessageToolFields(const nlohmann::json& m, size_t i, const std::string& role,
                                              tokenizer::ChatMessage* cm);

}  // namespace attic::server
