#include "server/logprobs_json.h"

#include <cmath>

namespace attic::server {

namespace {

using json = nlohmann::json;

std::string Raw(const tokenizer::Tokenizer& tok, int32_t id) {
  return tok.IsSpecial(id) ? tok.TokenText(id) : tok.TokenBytes(id);
}

// Valid UTF-8 as it is; else completions' "bytes:\xNN..." or chat's text with U+FFFD for
// each byte that is not part of a well-formed character.
std::string Display(const std::string& raw, ApiKind kind) {
  if (tokenizer::IsValidUtf8(raw)) return raw;
  std::string out;
  if (kind == ApiKind::kCompletion) {
    static const char* kHex = "0123456789abcdef";
    out = "bytes:";
    for (unsigned char c : raw) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
    return out;
  }
  for (size_t i = 0; i < raw.size();) {
    size_t n = 1;
    const unsigned char c = raw[i];
    if (c >= 0xC0) n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (c >= 0x80 && i + n <= raw.size() && tokenizer::IsValidUtf8(std::string_view(raw).substr(i, n))) {
      out.append(raw, i, n);
      i += n;
    } else if (c < 0x80) {
      out += raw[i++];
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

json Bytes(const std::string& raw) {
  json b = json::array();
  for (unsigned char c : raw) b.push_back(static_cast<int>(c));
  return b;
}

int64_t CodePoints(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

json Number(double v) { return std::isfinite(v) ? json(v) : json(); }

}  // namespace

json LogprobsJson::Of(const std::vector<engine::TokenLogprob>& entries) {
  if (kind_ == ApiKind::kChat) {
    json content = json::array();
    for (const engine::TokenLogprob& e : entries) {
      const std::string raw = Raw(tok_, e.token);
      json top = json::array();
      for (const auto& [id, lp] : e.top) {
        const std::string r = Raw(tok_, id);
        top.push_back({{"token", Display(r, kind_)}, {"logprob", Number(lp)}, {"bytes", Bytes(r)}});
      }
      content.push_back(
          {{"token", Display(raw, kind_)}, {"logprob", Number(e.logprob)}, {"bytes", Bytes(raw)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  for (const engine::TokenLogprob& e : entries) {
    const std::string s = Display(Raw(tok_, e.token), kind_);
    tokens.push_back(s);
    token_logprobs.push_back(Number(e.logprob));
    if (std::isnan(e.logprob)) {
      top_logprobs.push_back(nullptr);
    } else {
      json top = json::object();
      for (const auto& [id, lp] : e.top) {
        const std::string t = Display(Raw(tok_, id), kind_);
        if (!top.contains(t)) top[t] = lp;  // two tokens with one string: the likelier
      }
      top_logprobs.push_back(top);
    }
    offsets.push_back(offset_);
    offset_ += CodePoints(s);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", offsets}};
}

}  // namespace attic::server
