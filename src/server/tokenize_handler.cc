// POST /tokenize and /detokenize (also under /v1): token ids of a text or of a chat
// rendered exactly as /v1/chat/completions renders it, and text of token ids, so that
// clients can count and inspect tokens without generating. vLLM's request and response
// shapes; llama-server's field names are accepted as aliases (see openai_api.h).
//
// Thread-safety: handlers run on HTTP threads and touch only the (thread-safe) tokenizer.
#include <nlohmann/json.hpp>

#include "server/server_internal.h"

namespace attic::server {

namespace {

using json = nlohmann::json;

// Token strings and decoded text may hold bytes that are not valid UTF-8 on their own (a
// byte-fallback token, ids cut inside a character): they become U+FFFD rather than an error.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

void Server::Impl::HandleTokenize(const httplib::Request& req, const std::string& body, httplib::Response& res) {
  std::string tenant;
  if (auto e = Authenticate(req, &tenant)) return SendError(res, *e);
  TokenizeParse parsed = ParseTokenizeRequest(body);
  if (parsed.error) return SendError(res, *parsed.error);
  const TokenizeRequest& r = parsed.request;
  if (!r.model.empty() && r.model != model_name) return SendError(res, ModelNotFound(r.model));
  // No context-window check: counting a prompt that is too long is one of the uses.
  StatusOr<std::vector<int32_t>> ids = InvalidArgumentError("");
  if (r.chat) {
    // The template chat completions render with, tools included (BuildPrompt): the count is
    // their prompt_tokens.
    StatusOr<std::string> text = engine.RenderChat(r.messages, r.add_generation_prompt, r.tools.ToolJson());
    ids = text.ok() ? engine.Tokenize(*text, r.add_special_tokens) : text.status();
  } else {
    ids = engine.Tokenize(r.prompt, r.add_special_tokens);
  }
  if (!ids.ok()) {
    ApiError e = ErrorFromStatus(ids.status());
    e.param = r.chat ? "messages" : "prompt";
    return SendError(res, e);
  }
  json j{{"count", ids->size()}, {"max_model_len", engine.context_length()}, {"tokens", *ids}};
  if (r.return_token_strs) {
    json strs = json::array();
    for (int32_t id : *ids) strs.push_back(engine.tokenizer().TokenText(id));
    j["token_strs"] = std::move(strs);
  }
  res.set_content(Dump(j), "application/json");
}

void Server::Impl::HandleDetokenize(const httplib::Request& req, const std::string& body, httplib::Response& res) {
  std::string tenant;
  if (auto e = Authenticate(req, &tenant)) return SendError(res, *e);
  DetokenizeParse parsed = ParseDetokenizeRequest(body);
  if (parsed.error) return SendError(res, *parsed.error);
  const DetokenizeRequest& r = parsed.request;
  if (!r.model.empty() && r.model != model_name) return SendError(res, ModelNotFound(r.model));
  const int vocab = engine.tokenizer().vocab_size();
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    if (r.tokens[i] >= vocab) {
      ApiError e;
      e.param = "tokens";
      e.code = "invalid_value";
      e.message = "token id " + std::to_string(r.tokens[i]) + " at tokens[" + std::to_string(i) +
                  "] is outside the vocabulary (0.." + std::to_string(vocab - 1) + ")";
      return SendError(res, e);
    }
  }
  // Special tokens are kept (vLLM's decode); "content" repeats the text for llama-server clients.
  const std::string text = engine.tokenizer().Decode(r.tokens, /*skip_special=*/false);
  res.set_content(Dump(json{{"prompt", text}, {"content", text}}), "application/json");
}

}  // namespace attic::server
