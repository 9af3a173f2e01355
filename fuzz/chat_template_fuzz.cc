// Chat-template rendering of hostile messages (src/tokenizer/chat_template.cc), and
// template detection from arbitrary template text.
//
// Input: byte 0 picks the family (Mistral when (byte / 12) is odd), add_generation_prompt
// and a default system prompt; the rest is split at NUL
// bytes into role, content, role, content, ...; a role byte sequence "s"/"u"/"a" stands
// for system/user/assistant, anything else is used as the role verbatim.
// Invariants: no crash; unknown roles are InvalidArgument (never rendered); a rendered
// prompt holds every message's content, in order: verbatim for ChatML; for Llama-3 and
// Llama-2 stripped of surrounding ASCII whitespace, as their reference templates do
// (Jinja's trim / str.strip()), and for Llama-2 a system message only when a user
// message follows it (the reference folds it into the first user turn). Mistral: user
// and tool contents verbatim, assistant contents stripped, in order; the system message
// is written into the last user turn (its place is not checked). Llama-3's tool results
// are JSON strings (the template's tojson).
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attic/tokenizer/chat_template.h"
#include "fuzz_check.h"

using namespace attic::tokenizer;

namespace {
// str.strip() on ASCII whitespace.
std::string Strip(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Template detection on the raw text never crashes.
  (void)DetectChatTemplate(std::string(rest));
  (void)DefaultSystemPrompt(std::string(rest));

  // Mistral on the bit above the others, so that the corpus's older inputs keep their family.
  const ChatTemplateKind kinds[] = {ChatTemplateKind::kChatML, ChatTemplateKind::kLlama3, ChatTemplateKind::kLlama2};
  const ChatTemplateKind kind = (data[0] / 12) % 2 == 1 ? ChatTemplateKind::kMistral : kinds[data[0] % 3];
  ChatRenderOptions opts;
  opts.add_generation_prompt = (data[0] / 3) % 2 == 0;
  if ((data[0] / 6) % 2 == 1) opts.default_system_prompt = "You are a helpful assistant.";

  std::vector<std::string_view> fields;
  for (size_t at = 0; at <= rest.size();) {
    size_t nul = rest.find('\0', at);
    if (nul == std::string_view::npos) nul = rest.size();
    fields.push_back(rest.substr(at, nul - at));
    at = nul + 1;
  }
  std::vector<ChatMessage> messages;
  bool known_roles = true;
  for (size_t i = 0; i + 1 < fields.size(); i += 2) {
    ChatMessage m;
    const std::string_view role = fields[i];
    m.role = role == "s" ? "system" : role == "u" ? "user" : role == "a" ? "assistant" : std::string(role);
    // "tool" (a tool result) renders in the families with a tool format (ChatML, Llama 3, Mistral).
    known_roles = known_roles && (m.role == "system" || m.role == "user" || m.role == "assistant" ||
                                  (m.role == "tool" && kind != ChatTemplateKind::kLlama2));
    m.content = std::string(fields[i + 1]);
    messages.push_back(std::move(m));
  }
  auto out = RenderChat(kind, messages, opts);
  if (!known_roles) FUZZ_CHECK(!out.ok(), "an unknown role was rendered");
  if (!out.ok()) {
    FUZZ_CHECK(out.status().code() == attic::StatusCode::kInvalidArgument, "%s", out.status().ToString().c_str());
    return 0;
  }
  size_t at = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (kind == ChatTemplateKind::kLlama2 && i == 0 && m.role == "system" && messages.size() == 1) continue;
    if (kind == ChatTemplateKind::kMistral && i == 0 && m.role == "system") continue;
    const bool verbatim = kind == ChatTemplateKind::kChatML ||
                          (kind == ChatTemplateKind::kMistral && m.role != "assistant");
    std::string want = verbatim ? m.content : Strip(m.content);
    if (kind == ChatTemplateKind::kLlama3 && m.role == "tool") {
      // The Llama 3.1 template writes a tool result with tojson (a string is iterable in
      // Jinja): a JSON string. Checked where it needs no escape; otherwise only its order.
      const bool plain = std::all_of(m.content.begin(), m.content.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u >= 0x20 && u < 0x80 && c != '"' && c != '\\';
      });
      want = plain ? "\"" + m.content + "\"" : "<|start_header_id|>ipython<|end_header_id|>";
    }
    const size_t found = out->find(want, at);
    FUZZ_CHECK(found != std::string::npos, "content of a %s message is missing or reordered", m.role.c_str());
    at = found + want.size();
  }
  return 0;
}
