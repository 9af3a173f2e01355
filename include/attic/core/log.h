// Leveled logging to stderr: one line per message, "attic: " plus a level tag for
// warnings and errors ("attic: warning: ...", "attic: error: ..."). The level is
// process-wide (`attic serve --log-level`); messages below it cost one atomic load.
//
//   kError  failures the operator must act on
//   kWarn   something was ignored or degraded (a foreign file in the store directory)
//   kInfo   start-up summaries and one access line per request (the default)
//   kDebug  per-request detail, including request bodies (prompts: never at kInfo)
//
// Thread-safety: every function may be called from any thread; a line is written with
// one write so lines of different threads never interleave.
#pragma once

#include <string>

#include "attic/core/status.h"

namespace attic {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
inline bool LogEnabled(LogLevel level) { return level >= GetLogLevel(); }
// "debug", "info", "warn" (or "warning"), "error", "off".
StatusOr<LogLevel> ParseLogLevel(const std::string& name);

// printf-style; the newline is added.
void Log(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace attic
