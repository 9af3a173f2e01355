// Client side of Attic's OpenAI-compatible API, shared by the load generators
// (`attic bench serve`, `attic bench sessions`): auth headers, the served model's id, and
// one streamed completion read chunk by chunk from its server-sent events. Functions are
// thread-safe; an httplib::Client is used by one thread at a time.
#pragma once

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <string>

#include "attic/core/status.h"

namespace attic::bench {

httplib::Headers AuthHeaders(const std::string& api_key);

// The first model id of `url`/v1/models, after waiting up to ~10 s for /health (a
// just-started server may still be binding).
StatusOr<std::string> ServedModelId(const std::string& url, const std::string& api_key);

struct StreamedCompletion {
  bool ok = false;
  bool cut = false;  // the client closed the stream after `cut_after` pieces
  std::string error;
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;  // from the usage chunk
  std::string text;                                                 // the content received
  std::chrono::steady_clock::time_point sent{}, first{}, last{};    // request; first/last content piece
};

// POSTs `body` (which asks for "stream": true and include_usage) to `path` and reads
// the chunks. `on_piece` runs for each non-empty content piece as it arrives. With
// cut_after > 0 the client closes the connection after that many pieces (a client that
// goes away mid-stream; ok unless an error came first). Not ok: connection error, HTTP
// error, an error chunk, or no content at all.
StreamedCompletion StreamCompletion(httplib::Client& cli, const std::string& path, const std::string& api_key,
                                    const nlohmann::json& body,
                                    const std::function<void(const std::string& piece)>& on_piece = nullptr,
                                    int cut_after = 0);

}  // namespace attic::bench
