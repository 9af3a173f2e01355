#include "attic/core/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <string>

namespace attic {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

StatusOr<LogLevel> ParseLogLevel(const std::string& name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  if (name == "off") return LogLevel::kOff;
  return InvalidArgumentError("unknown log level '" + name + "' (expected debug, info, warn, error or off)");
}

void Log(LogLevel level, const char* format, ...) {
  if (!LogEnabled(level) || level == LogLevel::kOff) return;
  std::string line = level == LogLevel::kWarn ? "attic: warning: " : level == LogLevel::kError ? "attic: error: " : "attic: ";
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  if (n > 0) {
    const size_t at = line.size();
    line.resize(at + static_cast<size_t>(n) + 1);
    std::vsnprintf(line.data() + at, static_cast<size_t>(n) + 1, format, args);
    line.resize(at + static_cast<size_t>(n));
  }
  va_end(args);
  line += '\n';
  for (size_t off = 0; off < line.size();) {  // one write(2) unless interrupted
    const ssize_t w = ::write(STDERR_FILENO, line.data() + off, line.size() - off);
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
}

}  // namespace attic
