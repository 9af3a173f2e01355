#include "bench/client/openai_client.h"

#include <thread>

namespace attic::bench {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

httplib::Headers AuthHeaders(const std::string& api_key) {
  httplib::Headers h;
  if (!api_key.empty()) h.emplace("Authorization", "Bearer " + api_key);
  return h;
}

StatusOr<std::string> ServedModelId(const std::string& url, const std::string& api_key) {
  httplib::Client cli(url);
  cli.set_read_timeout(30, 0);
  for (int i = 0; i < 100; ++i) {
    auto h = cli.Get("/health");
    if (h && h->status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  auto res = cli.Get("/v1/models", AuthHeaders(api_key));
  if (!res || res->status != 200)
    return UnavailableError("cannot reach " + url + "/v1/models" +
                            (res ? " (HTTP " + std::to_string(res->status) + ")" : ""));
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty())
    return InvalidArgumentError("unexpected /v1/models reply from " + url);
  return j["data"][0].value("id", "");
}

StreamedCompletion StreamCompletion(httplib::Client& cli, const std::string& path, const std::string& api_key,
                                    const json& body, const std::function<void(const std::string&)>& on_piece,
                                    int cut_after) {
  StreamedCompletion r;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = AuthHeaders(api_key);
  req.headers.emplace("Content-Type", "application/json");
  req.body = body.dump();
  std::string buf;
  bool got_first = false;
  int pieces = 0;
  auto on_chunk = [&](const json& j) {
    if (j.contains("error")) {
      r.error = j["error"].value("message", "error");
      return;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const json& u = j["usage"];
      r.prompt_tokens = u.value("prompt_tokens", 0);
      r.completion_tokens = u.value("completion_tokens", 0);
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
        r.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", 0);
    }
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
    const json& c = j["choices"][0];  // chat: delta.content; completions: text
    const std::string piece = c.contains("delta") && c["delta"].is_object() ? c["delta"].value("content", "")
                                                                             : c.value("text", "");
    if (piece.empty()) return;
    r.last = Clock::now();
    if (!got_first) r.first = r.last, got_first = true;
    r.text += piece;
    ++pieces;
    if (on_piece) on_piece(piece);
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t end;
    while ((end = buf.find("\n\n")) != std::string::npos) {
      const std::string event = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") continue;
      json j = json::parse(payload, nullptr, false);
      if (!j.is_discarded()) on_chunk(j);
      if (cut_after > 0 && pieces >= cut_after) {
        r.cut = true;
        return false;  // httplib closes the connection
      }
    }
    return true;
  };
  // Without TCP_NODELAY the request's body (a second write after the headers) can wait
  // for the server's delayed ACK of the headers: ~40 ms added to every measured TTFT.
  cli.set_tcp_nodelay(true);
  r.sent = Clock::now();
  auto res = cli.send(req);
  if (r.cut) {
    // Closed on purpose: the transfer's own error is expected.
  } else if (!res) {
    r.error = "connection error: " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    // An error body goes through the content receiver, not res->body.
    const std::string& b = res->body.empty() ? buf : res->body;
    r.error = "HTTP " + std::to_string(res->status) + ": " + b.substr(0, 300);
  } else if (r.error.empty() && !got_first) {
    r.error = "no content received";
  }
  r.ok = r.error.empty();
  return r;
}

}  // namespace attic::bench
