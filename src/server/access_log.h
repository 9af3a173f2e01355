// Internal: the server's access log. One line per HTTP request at LogLevel::kInfo, written
// when the response is complete (for a stream, when it ends):
//
//   attic: POST /v1/chat/completions 200 prompt=42 cached=30 completion=16 ttft=12.3ms 85.1ms
//   attic: GET /v1/models 200 0.2ms
//
// method, path (no query string), status, the token counts and time to first token of a
// completion that finished, and the time from the request's arrival to the end of its
// response. Never prompt or completion text, never headers (API keys). At kDebug the
// request body (the first kLogBodyBytes) is logged too, when it has been read.
// Method, path and body are escaped so that a request can never forge a log line.
//
// Thread-safety: the note is per thread (a request is handled on one thread, stream
// included); the functions may be called from any thread.
#pragma once

#include <httplib.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "attic/engine/scheduler.h"

namespace attic::server {

inline constexpr size_t kLogBodyBytes = 4096;

// What a handler adds to its request's access line.
struct AccessNote {
  bool has_usage = false;  // a completion that finished (usage is its final usage)
  engine::TokenUsage usage;
  double ttft_ms = -1;     // arrival -> the first text (or the finish) the handler received
};

// The note of the request being handled on the calling thread.
AccessNote& CurrentAccessNote();

// The line after "attic: ". `duration_ms` from arrival to the end of the response.
std::string AccessLine(std::string_view method, std::string_view path, int status, const AccessNote& note,
                       double duration_ms);

// Writes the request's access line (kInfo) and clears the thread's note. Call once per
// request, after its response (httplib's logger).
void LogAccess(const httplib::Request& req, const httplib::Response& res);

// Writes the request body (kDebug; escaped, at most kLogBodyBytes of it).
void LogRequestBody(const httplib::Request& req, std::string_view body);

// Printable ASCII as is, other bytes as \n, \t or \xNN: never a line break or a terminal
// escape. `text` (a body) keeps spaces and bytes >= 0x80 (UTF-8); otherwise (method, path)
// a space is \x20 too, so that each is one word of the access line.
std::string EscapeForLog(std::string_view s, bool text);

}  // namespace attic::server
