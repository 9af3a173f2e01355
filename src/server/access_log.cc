#include "server/access_log.h"

#include <chrono>
#include <cstdio>

#include "attic/core/log.h"
#include "server/http_transport.h"

namespace attic::server {

namespace {

thread_local AccessNote tls_note;

// Paths longer than this are cut in the log (the URI limit is far larger).
constexpr size_t kLogPathBytes = 512;

std::string Ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1fms", ms);
  return buf;
}

}  // namespace

AccessNote& CurrentAccessNote() { return tls_note; }

std::string EscapeForLog(std::string_view s, bool text) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c > 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else if (text && (c == ' ' || c >= 0x80)) {
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::string AccessLine(std::string_view method, std::string_view path, int status, const AccessNote& note,
                       double duration_ms) {
  std::string line = EscapeForLog(method.substr(0, 32), false) + " ";
  line += EscapeForLog(path.substr(0, kLogPathBytes), false);
  if (path.size() > kLogPathBytes) line += "...";
  line += " " + std::to_string(status);
  if (note.has_usage) {
    line += " prompt=" + std::to_string(note.usage.prompt_tokens) + " cached=" +
            std::to_string(note.usage.cached_tokens) + " completion=" + std::to_string(note.usage.completion_tokens);
  }
  if (note.ttft_ms >= 0) line += " ttft=" + Ms(note.ttft_ms);
  line += " " + Ms(duration_ms);
  return line;
}

void LogAccess(const httplib::Request& req, const httplib::Response& res) {
  const AccessNote note = tls_note;
  tls_note = AccessNote{};
  if (!LogEnabled(LogLevel::kInfo)) return;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - HttpTransport::RequestStart())
          .count();
  Log(LogLevel::kInfo, "%s", AccessLine(req.method, req.path, res.status, note, ms).c_str());
}

void LogRequestBody(const httplib::Request& req, std::string_view body) {
  if (!LogEnabled(LogLevel::kDebug)) return;
  std::string text = EscapeForLog(body.substr(0, kLogBodyBytes), true);
  if (body.size() > kLogBodyBytes) text += "...";
  Log(LogLevel::kDebug, "%s %s body (%zu bytes): %s", EscapeForLog(req.method.substr(0, 32), false).c_str(),
      EscapeForLog(req.path.substr(0, kLogPathBytes), false).c_str(), body.size(), text.c_str());
}

}  // namespace attic::server
