// The access line's format (hand-written expectations) and that no request can forge a
// log line through its method, path or body.
#include "server/access_log.h"

#include <gtest/gtest.h>

namespace attic::server {
namespace {

TEST(AccessLog, CompletionLineHasTokensAndTtft) {
  AccessNote note;
  note.has_usage = true;
  note.usage.prompt_tokens = 42;
  note.usage.cached_tokens = 30;
  note.usage.completion_tokens = 16;
  note.ttft_ms = 12.34;
  EXPECT_EQ(AccessLine("POST", "/v1/chat/completions", 200, note, 85.06),
            "POST /v1/chat/completions 200 prompt=42 cached=30 completion=16 ttft=12.3ms 85.1ms");
}

TEST(AccessLog, OtherRoutesAreMethodPathStatusDuration) {
  EXPECT_EQ(AccessLine("GET", "/v1/models", 200, AccessNote{}, 0.24), "GET /v1/models 200 0.2ms");
  EXPECT_EQ(AccessLine("DELETE", "/v1/sessions/x", 404, AccessNote{}, 1), "DELETE /v1/sessions/x 404 1.0ms");
}

TEST(AccessLog, ControlBytesAreEscapedAndLongPathsCut) {
  EXPECT_EQ(AccessLine("GET", "/a\nattic: GET /forged 200 1.0ms", 404, AccessNote{}, 1),
            "GET /a\\nattic:\\x20GET\\x20/forged\\x20200\\x201.0ms 404 1.0ms");
  EXPECT_EQ(AccessLine("G\x1b[2J", "/\xc3\xa9\r", 400, AccessNote{}, 1), "G\\x1b[2J /\\xc3\\xa9\\x0d 400 1.0ms");
  std::string line = AccessLine("GET", "/" + std::string(5000, 'a'), 414, AccessNote{}, 1);
  EXPECT_LT(line.size(), 600u);
  EXPECT_NE(line.find("aaa... 414 1.0ms"), std::string::npos) << line;
  // Bodies (debug) keep UTF-8 text readable but never break the line.
  EXPECT_EQ(EscapeForLog("{\"content\":\"caf\xc3\xa9\n\tx\x07\"}", true), "{\"content\":\"caf\xc3\xa9\\n\\tx\\x07\"}");
}

}  // namespace
}  // namespace attic::server
