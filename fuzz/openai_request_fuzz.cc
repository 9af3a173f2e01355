// OpenAI request parsing (src/server/openai_request.cc): the bodies of /v1/chat/completions
// (context-cache content parts included), /v1/completions, /tokenize, /detokenize, and the
// X-Session-Id header. The first byte picks the parser; the rest is the body.
//
// Invariants: no crash or exception; an error is a 4xx whose JSON error object
// (ErrorJson) is well-formed JSON naming the same message; an accepted request has every
// field in the range the API documents.
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "attic/server/openai_api.h"
#include "fuzz_check.h"

using namespace attic::server;
using json = nlohmann::json;

namespace {

void CheckError(const ApiError& e) {
  FUZZ_CHECK(e.http_status >= 400 && e.http_status < 500, "status %d", e.http_status);
  FUZZ_CHECK(!e.message.empty());
  const std::string body = ErrorJson(e);
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(!j.is_discarded(), "ErrorJson is not JSON: %s", body.c_str());
  FUZZ_CHECK(j["error"]["message"].is_string());
}

// What a request names is echoed back in JSON (session objects, lists, logs): it must
// serialize with nlohmann's strict (throwing) UTF-8 handling.
void CheckEchoable(const ApiRequest& r) {
  try {
    (void)json{{"model", r.model}, {"user", r.user}, {"session_id", r.session_id}}.dump();
  } catch (const json::exception& e) {
    FUZZ_CHECK(false, "an accepted request names text that cannot be echoed in JSON: %s", e.what());
  }
}

void CheckRequest(const ApiRequest& r) {
  CheckEchoable(r);
  FUZZ_CHECK(r.temperature >= 0.0f && r.temperature <= 2.0f, "temperature %g", r.temperature);
  FUZZ_CHECK(r.top_p >= 0.0f && r.top_p <= 1.0f, "top_p %g", r.top_p);
  FUZZ_CHECK(r.min_p >= 0.0f && r.min_p <= 1.0f, "min_p %g", r.min_p);
  FUZZ_CHECK(r.top_k >= 0);
  FUZZ_CHECK(!r.max_tokens || *r.max_tokens >= 1);
  FUZZ_CHECK(r.stop.size() <= static_cast<size_t>(kMaxStops));
  for (const std::string& s : r.stop) FUZZ_CHECK(!s.empty());
  FUZZ_CHECK(r.session_id.size() <= kMaxSessionIdBytes);
  FUZZ_CHECK(r.session_ttl_s >= -1);
  if (r.kind == ApiKind::kChat) {
    FUZZ_CHECK(!r.messages.empty());
    for (const auto& m : r.messages)
      FUZZ_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", "role %s", m.role.c_str());
  }
  // Every cache part stands in the prompt exactly once, as its marker.
  std::string all = r.prompt_text;
  for (const auto& m : r.messages) all += m.content;
  for (size_t i = 0; i < r.cache_parts.size(); ++i) {
    const std::string marker = PartMarker(i);
    const size_t at = all.find(marker);
    FUZZ_CHECK(at != std::string::npos, "cache part %zu has no marker", i);
    FUZZ_CHECK(all.find(marker, at + 1) == std::string::npos, "cache part %zu twice", i);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 6) {
    case 0:
    case 1: {
      const ApiKind kind = data[0] % 6 == 0 ? ApiKind::kChat : ApiKind::kCompletion;
      ParseResult r = ParseApiRequest(kind, body);
      if (r.error) {
        CheckError(*r.error);
      } else {
        FUZZ_CHECK(r.request.kind == kind);
        CheckRequest(r.request);
      }
      break;
    }
    case 2: {
      TokenizeParse t = ParseTokenizeRequest(body);
      if (t.error) CheckError(*t.error);
      else FUZZ_CHECK(t.request.chat ? !t.request.messages.empty() || true : true);
      break;
    }
    case 3: {
      DetokenizeParse d = ParseDetokenizeRequest(body);
      if (d.error) CheckError(*d.error);
      break;
    }
    case 4: {  // the X-Session-Id header against a parsed chat body: header up to the first NUL
      const size_t nul = body.find('\0');
      const std::string_view header = body.substr(0, nul);
      const std::string_view rest = nul == std::string_view::npos ? std::string_view() : body.substr(nul + 1);
      ParseResult r = ParseApiRequest(ApiKind::kChat, rest);
      if (r.error) break;
      const std::string before = r.request.session_id;
      if (auto e = ApplySessionHeader(header, &r.request)) {
        CheckError(*e);
      } else {
        FUZZ_CHECK(r.request.session_id.size() <= kMaxSessionIdBytes);
        CheckEchoable(r.request);
        if (header.empty()) FUZZ_CHECK(r.request.session_id == before);
        else FUZZ_CHECK(r.request.session_id == header);
      }
      break;
    }
    case 5: {  // the error objects themselves, with arbitrary (non-UTF-8) text in them
      ApiError e = InvalidParam(std::string(body), std::string(body) + " is bad");
      CheckError(e);
      break;
    }
  }
  return 0;
}
