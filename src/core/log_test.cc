#include "attic/core/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace attic {
namespace {

// Runs fn with stderr redirected to a pipe; returns what it wrote.
template <class Fn>
std::string CaptureStderr(Fn fn) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(fds[1], STDERR_FILENO);
  fn();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  return out;
}

TEST(LogTest, LinesBelowTheLevelAreDroppedAndLevelsAreTagged) {
  const LogLevel before = GetLogLevel();
  SetLogLevel(LogLevel::kWarn);
  const std::string out = CaptureStderr([] {
    Log(LogLevel::kDebug, "debug %d", 1);
    Log(LogLevel::kInfo, "info %d", 2);
    Log(LogLevel::kWarn, "disk %s", "full");
    Log(LogLevel::kError, "gone");
  });
  EXPECT_EQ(out, "attic: warning: disk full\nattic: error: gone\n");
  SetLogLevel(LogLevel::kInfo);
  EXPECT_EQ(CaptureStderr([] { Log(LogLevel::kInfo, "GET /health 200"); }), "attic: GET /health 200\n");
  SetLogLevel(before);
}

TEST(LogTest, ParsesLevelNames) {
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarn);
  EXPECT_EQ(*ParseLogLevel("off"), LogLevel::kOff);
  EXPECT_FALSE(ParseLogLevel("loud").ok());
}

}  // namespace
}  // namespace attic
