// `attic eval link`'s prompts, splits and chunk orders (attic/eval/link_eval.h).
#include <algorithm>
#include <numeric>

#include "attic/eval/link_eval.h"
#include "attic/eval/needle.h"
#include "attic/pic/split.h"

namespace attic::eval {

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<int32_t> Encode(const tokenizer::Tokenizer& tok, const std::string& text) {
  tokenizer::EncodeOptions eo;
  eo.add_bos = false;
  auto t = tok.Encode(text, eo);
  return t.ok() ? *t : std::vector<int32_t>{};
}

// Whether a cut after token `id` falls at a sentence end: its text ends in . ! ? or in a
// closing quote right after one.
bool EndsSentence(const tokenizer::Tokenizer& tok, int32_t id) {
  std::string s = tok.TokenBytes(id);
  while (!s.empty() && (s.back() == '"' || s.back() == '\'' || s.back() == ')')) s.pop_back();
  return !s.empty() && (s.back() == '.' || s.back() == '!' || s.back() == '?');
}

}  // namespace

std::vector<LinkPrompt> TextPrompts(const std::vector<int32_t>& text_tokens, const tokenizer::Tokenizer& tok,
                                    int context_tokens, int continuation_tokens, int n_prompts) {
  std::vector<LinkPrompt> out;
  const size_t stride = static_cast<size_t>(context_tokens + continuation_tokens);
  for (size_t at = 0; at + stride <= text_tokens.size() && static_cast<int>(out.size()) < n_prompts; at += stride) {
    LinkPrompt p;
    p.id = "text@" + std::to_string(at);
    p.context.assign(text_tokens.begin() + static_cast<std::ptrdiff_t>(at),
                     text_tokens.begin() + static_cast<std::ptrdiff_t>(at) + context_tokens);
    p.continuation.assign(text_tokens.begin() + static_cast<std::ptrdiff_t>(at) + context_tokens,
                          text_tokens.begin() + static_cast<std::ptrdiff_t>(at + stride));
    p.context_text = tok.Decode(p.context, true);
    p.passage_starts.push_back(0);
    for (int i = 1; i < context_tokens; ++i) {
      const std::string prev = tok.TokenBytes(p.context[i - 1]);
      if (!prev.empty() && prev.back() == '\n') p.passage_starts.push_back(i);
    }
    out.push_back(std::move(p));
  }
  return out;
}

StatusOr<std::vector<LinkPrompt>> MusiquePrompts(const std::string& json_text, const tokenizer::Tokenizer& tok,
                                                 int context_tokens, int n_prompts) {
  nlohmann::json js = nlohmann::json::parse(json_text, nullptr, false);
  if (!js.is_array()) return InvalidArgumentError("expected a JSON array of {ctxs, question, answers}");
  std::vector<LinkPrompt> out;
  for (size_t r = 0; r < js.size() && static_cast<int>(out.size()) < n_prompts; ++r) {
    const auto& rec = js[r];
    if (!rec.is_object() || !rec.contains("ctxs") || !rec["ctxs"].is_array() || !rec.contains("question") ||
        !rec["question"].is_string() || !rec.contains("answers") || !rec["answers"].is_array() ||
        rec["answers"].empty() || !rec["answers"][0].is_string()) {
      return InvalidArgumentError("record " + std::to_string(r) + " is not {ctxs: [{text}], question, answers: [..]}");
    }
    LinkPrompt p;
    p.id = "musique#" + std::to_string(r);
    for (const auto& c : rec["ctxs"]) {
      if (static_cast<int>(p.context.size()) >= context_tokens) break;
      if (!c.is_object() || !c.contains("text") || !c["text"].is_string())
        return InvalidArgumentError("record " + std::to_string(r) + ": a ctxs entry has no text");
      std::vector<int32_t> t = Encode(tok, c["text"].get<std::string>());
      if (t.empty()) continue;
      p.passage_starts.push_back(static_cast<int>(p.context.size()));
      const size_t room = static_cast<size_t>(context_tokens) - p.context.size();
      t.resize(std::min(room, t.size()));
      p.context.insert(p.context.end(), t.begin(), t.end());
      std::string text = tok.Decode(t, true);
      text.erase(0, text.find_first_not_of(' '));
      p.context_text += (p.context_text.empty() ? "" : "\n\n") + text;
    }
    if (static_cast<int>(p.context.size()) < context_tokens) continue;  // too little text
    p.query = Encode(tok, "Question: " + rec["question"].get<std::string>() + " Answer:");
    p.continuation = Encode(tok, rec["answers"][0].get<std::string>());
    out.push_back(std::move(p));
  }
  return out;
}

StatusOr<std::vector<LinkPrompt>> PassKeyPrompts(const tokenizer::Tokenizer& tok,
                                                 const std::vector<std::string>& haystack, int length,
                                                 int n_prompts, uint64_t seed) {
  if (haystack.empty()) return InvalidArgumentError("the haystack has no sentences");
  std::vector<LinkPrompt> out;
  for (int t = 0; t < n_prompts; ++t) {
    const Needle needle = MakeNeedle(NeedleKind::kPassKey, seed, t);
    const double depth = 0.25 * (t % 5);
    const size_t start = SplitMix64(seed * 1000003 + static_cast<uint64_t>(t)) % haystack.size();
    ATTIC_ASSIGN_OR_RETURN(NeedlePrompt np, BuildNeedlePrompt(tok, haystack, start, needle, length, depth));
    // The question ends the prompt; its tokens are the query (encoded on its own, as
    // SentencePiece-style tokenizers do, or with the space that joins it on).
    const size_t n = np.tokens.size();
    const bool has_bos = tok.add_bos() && !np.tokens.empty() && np.tokens[0] == tok.bos_id();
    std::vector<int32_t> q;
    for (const std::string& text : {needle.question, " " + needle.question}) {
      const std::vector<int32_t> t = Encode(tok, text);
      if (!t.empty() && n >= t.size() + 2 &&
          std::equal(t.begin(), t.end(), np.tokens.end() - static_cast<std::ptrdiff_t>(t.size()))) {
        q = t;
        break;
      }
    }
    if (q.empty()) return InternalError("a pass-key prompt does not end in its question's tokens");
    LinkPrompt p;
    p.id = "passkey#" + std::to_string(t) + "@" + std::to_string(depth);
    p.context.assign(np.tokens.begin() + (has_bos ? 1 : 0), np.tokens.end() - static_cast<std::ptrdiff_t>(q.size()));
    p.query = q;
    p.continuation = Encode(tok, needle.answer + ".");
    p.answer = needle.answer;
    p.answer_tokens = AnswerTokens(needle);
    p.context_text = tok.Decode(p.context, true);
    p.passage_starts.push_back(0);
    out.push_back(std::move(p));
  }
  return out;
}

const char* LinkSplitName(LinkSplit s) {
  switch (s) {
    case LinkSplit::kFixed: return "fixed";
    case LinkSplit::kSentence: return "sentence";
    case LinkSplit::kSemantic: return "semantic";
  }
  return "?";
}

StatusOr<LinkSplit> ParseLinkSplit(std::string_view name) {
  for (LinkSplit s : {LinkSplit::kFixed, LinkSplit::kSentence, LinkSplit::kSemantic})
    if (name == LinkSplitName(s)) return s;
  return InvalidArgumentError("unknown split '" + std::string(name) + "' (expected fixed, sentence or semantic)");
}

StatusOr<SplitContextResult> SplitContext(const LinkPrompt& prompt, const tokenizer::Tokenizer& tok, LinkSplit split,
                                          int chunk_tokens) {
  SplitContextResult out;
  if (split == LinkSplit::kSemantic) {
    pic::SplitOptions so;
    so.method = pic::SplitMethod::kSemantic;
    so.max_tokens = chunk_tokens;
    ATTIC_ASSIGN_OR_RETURN(std::vector<pic::TextChunk> chunks, pic::SplitDocument(tok, prompt.context_text, so));
    for (const pic::TextChunk& c : chunks) {
      if (c.tokens.empty()) continue;
      out.chunks.push_back({static_cast<int>(out.tokens.size()), static_cast<int>(c.tokens.size())});
      out.tokens.insert(out.tokens.end(), c.tokens.begin(), c.tokens.end());
    }
    return out;
  }
  out.tokens = prompt.context;
  const int n = static_cast<int>(prompt.context.size());
  std::vector<uint8_t> passage(static_cast<size_t>(n) + 1, 0), sentence(static_cast<size_t>(n) + 1, 0);
  if (split == LinkSplit::kSentence) {
    for (int s : prompt.passage_starts) passage[s] = 1;
    for (int i = 1; i < n; ++i) sentence[i] = EndsSentence(tok, prompt.context[i - 1]);
  }
  for (int b = 0; b < n;) {
    int e = std::min(n, b + chunk_tokens);
    if (split == LinkSplit::kSentence && e < n) {
      int best = 0;
      for (int c = e; c > b; --c) {
        if (passage[c]) {
          best = c;
          break;
        }
        if (!best && sentence[c]) best = -c;  // the latest sentence end, unless a passage start comes
      }
      if (best != 0) e = best > 0 ? best : -best;
    }
    out.chunks.push_back({b, e - b});
    b = e;
  }
  return out;
}

const char* ChunkOrderName(ChunkOrder o) {
  switch (o) {
    case ChunkOrder::kOriginal: return "original";
    case ChunkOrder::kReversed: return "reversed";
    case ChunkOrder::kShuffled: return "shuffled";
  }
  return "?";
}

StatusOr<ChunkOrder> ParseChunkOrder(std::string_view name) {
  for (ChunkOrder o : {ChunkOrder::kOriginal, ChunkOrder::kReversed, ChunkOrder::kShuffled})
    if (name == ChunkOrderName(o)) return o;
  return InvalidArgumentError("unknown chunk order '" + std::string(name) +
                              "' (expected original, reversed or shuffled)");
}

std::vector<int> OrderChunks(int n_chunks, ChunkOrder order, uint64_t seed) {
  std::vector<int> o(static_cast<size_t>(n_chunks));
  std::iota(o.begin(), o.end(), 0);
  if (order == ChunkOrder::kReversed) std::reverse(o.begin(), o.end());
  if (order == ChunkOrder::kShuffled) {
    uint64_t x = seed;
    for (int i = n_chunks - 1; i > 0; --i) {
      x = SplitMix64(x);
      std::swap(o[i], o[x % static_cast<uint64_t>(i + 1)]);
    }
  }
  return o;
}

}  // namespace attic::eval
