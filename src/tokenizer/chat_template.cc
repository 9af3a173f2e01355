// Chat templates: the four prompt formats rendered natively (no Jinja engine), each
// reproducing its reference template byte for byte:
//  * ChatML (SmolLM2, Qwen2): <|im_start|>role\ncontent<|im_end|>\n per message, an
//    optional default system turn, "<|im_start|>assistant\n" as generation prompt.
//  * Llama-3: bos + <|start_header_id|>role<|end_header_id|>\n\n trim(content)<|eot_id|>.
//  * Llama-2 / Mistral: bos [INST] user [/INST] assistant eos, the system prompt folded
//    into the first user turn inside <<SYS>> ... <</SYS>>.
//  * Mistral (v0.3): bos [INST] user[/INST] assistant eos, the system prompt joined to the
//    last user turn; rendered with its tool format in chat_tools.cc.
#include "attic/tokenizer/chat_template.h"

#include "tokenizer/chat_tools.h"

#include <string>
#include <vector>

namespace attic::tokenizer {

namespace {

constexpr const char* kAllowed = kChatTemplateNames;

bool IsJinjaSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Python's str.strip() / Jinja's trim, for ASCII whitespace.
std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && IsJinjaSpace(s[b])) ++b;
  while (e > b && IsJinjaSpace(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool KnownRole(const std::string& r) { return r == "system" || r == "user" || r == "assistant"; }

Status UnknownRole(const std::string& r) {
  return InvalidArgumentError("chat: unknown role '" + r + "' (expected system, user or assistant)");
}

StatusOr<std::string> RenderChatML(const std::vector<ChatMessage>& msgs, const ChatRenderOptions& opts) {
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (!KnownRole(msgs[i].role)) return UnknownRole(msgs[i].role);
    if (i == 0 && msgs[0].role != "system" && !opts.default_system_prompt.empty()) {
      out += "<|im_start|>system\n" + opts.default_system_prompt + "<|im_end|>\n";
    }
    out += "<|im_start|>" + msgs[i].role + "\n" + msgs[i].content + "<|im_end|>\n";
  }
  if (opts.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

StatusOr<std::string> RenderLlama3(const std::vector<ChatMessage>& msgs, const ChatRenderOptions& opts) {
  // The "<s>" default of ChatRenderOptions is Llama-2's; Llama-3 never uses it.
  const std::string bos = opts.bos_token == "<s>" ? "<|begin_of_text|>" : opts.bos_token;
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (!KnownRole(msgs[i].role)) return UnknownRole(msgs[i].role);
    if (i == 0) out += bos;
    out += "<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n" + Trim(msgs[i].content) + "<|eot_id|>";
  }
  if (opts.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

StatusOr<std::string> RenderLlama2(const std::vector<ChatMessage>& msgs, const ChatRenderOptions& opts) {
  size_t start = 0;
  std::string system;
  bool has_system = false;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    has_system = true;
    start = 1;
  }
  std::string out;
  for (size_t i = start; i < msgs.size(); ++i) {
    const size_t turn = i - start;
    const ChatMessage& m = msgs[i];
    if (!KnownRole(m.role)) return UnknownRole(m.role);
    const bool want_user = turn % 2 == 0;
    if ((m.role == "user") != want_user || (!want_user && m.role != "assistant")) {
      return InvalidArgumentError("chat: Llama-2 conversation roles must alternate user/assistant/user/... "
                                  "(an optional system message first)");
    }
    std::string content = m.content;
    if (turn == 0 && has_system) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
    if (m.role == "user") {
      out += opts.bos_token + "[INST] " + Trim(content) + " [/INST]";
    } else {
      out += " " + Trim(content) + " " + opts.eos_token;
    }
  }
  return out;
}

// Decodes the Jinja string literal whose opening quote is text[pos]; false if it
// does not close.
bool ReadJinjaLiteral(const std::string& text, size_t pos, std::string* out) {
  const char quote = text[pos];
  out->clear();
  for (size_t i = pos + 1; i < text.size(); ++i) {
    const char c = text[i];
    if (c == quote) return true;
    if (c == '\\' && i + 1 < text.size()) {
      const char e = text[++i];
      switch (e) {
        case 'n': out->push_back('\n'); break;
        case 't': out->push_back('\t'); break;
        case 'r': out->push_back('\r'); break;
        default: out->push_back(e); break;
      }
      continue;
    }
    out->push_back(c);
  }
  return false;
}

}  // namespace

StatusOr<ChatTemplateKind> ParseChatTemplateKind(const std::string& name) {
  if (name == "chatml") return ChatTemplateKind::kChatML;
  if (name == "llama3") return ChatTemplateKind::kLlama3;
  if (name == "llama2") return ChatTemplateKind::kLlama2;
  if (name == "mistral") return ChatTemplateKind::kMistral;
  return InvalidArgumentError("unknown chat template '" + name + "': --chat-template must be one of " + kAllowed);
}

const char* ChatTemplateKindName(ChatTemplateKind k) {
  switch (k) {
    case ChatTemplateKind::kChatML: return "chatml";
    case ChatTemplateKind::kLlama3: return "llama3";
    case ChatTemplateKind::kLlama2: return "llama2";
    case ChatTemplateKind::kMistral: return "mistral";
  }
  return "unknown";
}

StatusOr<ChatTemplateKind> DetectChatTemplate(const std::string& jinja_text) {
  if (jinja_text.find("<|start_header_id|>") != std::string::npos) return ChatTemplateKind::kLlama3;
  if (jinja_text.find("<|im_start|>") != std::string::npos) return ChatTemplateKind::kChatML;
  // Mistral's tool-calling templates; the earlier ones (v0.1, v0.2) are Llama-2's format.
  if (jinja_text.find("[TOOL_CALLS]") != std::string::npos || jinja_text.find("[AVAILABLE_TOOLS]") != std::string::npos)
    return ChatTemplateKind::kMistral;
  if (jinja_text.find("[INST]") != std::string::npos) return ChatTemplateKind::kLlama2;
  const std::string what = jinja_text.empty() ? "the model has no chat template"
                                              : "the model's chat template is not one Attic recognises";
  return InvalidArgumentError(what + "; name the format with --chat-template (one of " + kAllowed + ")");
}

std::string DefaultSystemPrompt(const std::string& jinja_text) {
  static const std::string kHead = "<|im_start|>system";
  static const std::string kTail = "<|im_end|>";
  std::string lit;
  for (size_t hit = jinja_text.find(kHead); hit != std::string::npos; hit = jinja_text.find(kHead, hit + 1)) {
    // The literal holding this marker opens at the nearest quote before it.
    const size_t open = jinja_text.find_last_of("'\"", hit);
    if (open == std::string::npos || !ReadJinjaLiteral(jinja_text, open, &lit)) continue;
    // A whole default system turn in one literal: "<|im_start|>system\nX<|im_end|>\n".
    if (lit.compare(0, kHead.size() + 1, kHead + "\n") != 0) continue;
    const size_t tail = lit.find(kTail);
    if (tail == std::string::npos || tail <= kHead.size() + 1) continue;
    return lit.substr(kHead.size() + 1, tail - kHead.size() - 1);
  }
  return "";
}

StatusOr<std::string> RenderChat(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                 const ChatRenderOptions& opts) {
  if (ChatUsesTools(messages, opts) || kind == ChatTemplateKind::kMistral) return RenderChatWithTools(kind, messages, opts);
  switch (kind) {
    case ChatTemplateKind::kChatML: return RenderChatML(messages, opts);
    case ChatTemplateKind::kLlama3: return RenderLlama3(messages, opts);
    case ChatTemplateKind::kLlama2: return RenderLlama2(messages, opts);
    case ChatTemplateKind::kMistral: break;  // above
  }
  return InvalidArgumentError("chat: unknown template kind");
}

std::vector<std::string> ChatStopTokens(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML: return {"<|im_end|>", "<|endoftext|>"};
    case ChatTemplateKind::kLlama3: return {"<|eot_id|>", "<|end_of_text|>"};
    case ChatTemplateKind::kLlama2:
    case ChatTemplateKind::kMistral: return {"</s>"};
  }
  return {};
}

}  // namespace attic::tokenizer
