#include "attic/pic/split.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "pic/split_boundaries.h"

namespace attic::pic {

namespace {

using tokenizer::EncodeOptions;
using tokenizer::Tokenizer;

EncodeOptions DocumentEncodeOptions(const SplitOptions& opts) {
  EncodeOptions e;
  e.add_bos = false;
  e.parse_special = opts.parse_special;
  return e;
}

// The document as its tokens spell it, and where each token starts in that spelling:
// the document itself when the tokens' bytes are the document, possibly after one
// space a SentencePiece normalizer prepended (that space is dropped: the first token
// starts at 0 and is one byte shorter); otherwise the tokens' bytes (a leading space
// dropped as Decode drops it), not the document.
struct Spelling {
  std::string text;
  std::vector<size_t> starts;  // [n_tokens + 1]: token i is text[starts[i], starts[i + 1])
};

Spelling Spell(const Tokenizer& tok, std::string_view doc, const std::vector<int32_t>& ids) {
  Spelling out;
  out.text.reserve(doc.size() + 1);
  out.starts.reserve(ids.size() + 1);
  for (int32_t id : ids) {
    out.starts.push_back(out.text.size());
    out.text += tok.TokenBytes(id);
  }
  out.starts.push_back(out.text.size());
  bool shift = false;
  if (out.text != doc && !out.text.empty() && out.text[0] == ' ') {
    shift = std::string_view(out.text).substr(1) == doc || tok.StripsLeadingSpace();
  }
  if (shift) {
    out.text.erase(0, 1);
    for (size_t& s : out.starts) s = s > 0 ? s - 1 : 0;
  }
  return out;
}

// The chunk of tokens [first, last) of the document's encoding; its text is the bytes
// those tokens spell.
TextChunk Slice(const std::vector<int32_t>& ids, const Spelling& sp, size_t first, size_t last) {
  TextChunk chunk;
  chunk.tokens.assign(ids.begin() + first, ids.begin() + last);
  chunk.text = sp.text.substr(sp.starts[first], sp.starts[last] - sp.starts[first]);
  return chunk;
}

std::vector<TextChunk> FixedChunks(const std::vector<int32_t>& ids, const Spelling& sp, size_t max_tokens) {
  std::vector<TextChunk> chunks;
  for (size_t first = 0; first < ids.size(); first += max_tokens) {
    chunks.push_back(Slice(ids, sp, first, std::min(ids.size(), first + max_tokens)));
  }
  return chunks;
}

constexpr int kLevels = static_cast<int>(CutLevel::kCharacter) + 1;

// The token boundaries where a semantic chunk may end, by level: k in by_level[l] means
// that token k starts at a boundary of level l (or, kCharacter, at the start of a code
// point), so a chunk may be tokens [.., k). Ascending; 0 < k < n_tokens.
std::array<std::vector<size_t>, kLevels> TokenCuts(const Spelling& sp) {
  std::array<std::vector<size_t>, kLevels> by_level;
  const std::vector<Boundary> bounds = FindBoundaries(sp.text);
  const size_t n_tokens = sp.starts.size() - 1;
  size_t j = 0;
  for (size_t k = 1; k < n_tokens; ++k) {
    const size_t pos = sp.starts[k];
    if (pos == 0 || pos >= sp.text.size()) continue;  // an empty chunk before or after
    while (j < bounds.size() && bounds[j].end < pos) ++j;
    if (j < bounds.size() && bounds[j].begin <= pos) {
      by_level[static_cast<int>(bounds[j].level)].push_back(k);
    } else if (!IsUtf8Continuation(sp.text[pos])) {
      by_level[static_cast<int>(CutLevel::kCharacter)].push_back(k);
    }
  }
  return by_level;
}

StatusOr<std::vector<TextChunk>> SemanticChunks(const std::vector<int32_t>& ids, const Spelling& sp,
                                                size_t max_tokens) {
  const auto by_level = TokenCuts(sp);
  std::vector<TextChunk> chunks;
  const size_t n = ids.size();
  for (size_t first = 0; first < n;) {
    size_t last = n;  // exclusive
    if (n - first > max_tokens) {
      // The farthest cut within reach of the best level there is.
      const size_t reach = first + max_tokens;
      last = 0;
      for (const std::vector<size_t>& cuts : by_level) {
        auto it = std::upper_bound(cuts.begin(), cuts.end(), reach);
        if (it == cuts.begin()) continue;
        const size_t k = *--it;
        if (k > first && sp.starts[k] > sp.starts[first]) {
          last = k;
          break;
        }
      }
      if (last == 0) {
        size_t k = first + 1;
        while (k < n && (sp.starts[k] == sp.starts[first] || IsUtf8Continuation(sp.text[sp.starts[k]]))) ++k;
        return InvalidArgumentError("max_tokens " + std::to_string(max_tokens) +
                                    " is too small: the character at byte " + std::to_string(sp.starts[first]) +
                                    " takes " + std::to_string(k - first) + " tokens");
      }
    }
    chunks.push_back(Slice(ids, sp, first, last));
    first = last;
  }
  return chunks;
}

}  // namespace

StatusOr<SplitMethod> ParseSplitMethod(std::string_view name) {
  if (name == "none") return SplitMethod::kNone;
  if (name == "fixed") return SplitMethod::kFixed;
  if (name == "semantic") return SplitMethod::kSemantic;
  return InvalidArgumentError("unknown split method '" + std::string(name) + "': must be one of none, fixed, semantic");
}

const char* SplitMethodName(SplitMethod m) {
  switch (m) {
    case SplitMethod::kNone:
      return "none";
    case SplitMethod::kFixed:
      return "fixed";
    case SplitMethod::kSemantic:
      return "semantic";
  }
  return "unknown";
}

StatusOr<std::vector<TextChunk>> SplitDocument(const Tokenizer& tok, std::string_view text, const SplitOptions& opts) {
  if (opts.max_tokens < 1 || opts.max_tokens > kMaxSplitTokens) {
    return InvalidArgumentError("split max_tokens must be in 1.." + std::to_string(kMaxSplitTokens) + ", got " +
                                std::to_string(opts.max_tokens));
  }
  if (text.empty()) return InvalidArgumentError("cannot split an empty document");
  if (!tokenizer::IsValidUtf8(text)) return InvalidArgumentError("document to split is not valid UTF-8");

  ATTIC_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text, DocumentEncodeOptions(opts)));
  switch (opts.method) {
    case SplitMethod::kNone: {
      std::vector<TextChunk> one(1);
      one[0].text = std::string(text);
      one[0].tokens = std::move(ids);
      return one;
    }
    case SplitMethod::kFixed:
      return FixedChunks(ids, Spell(tok, text, ids), static_cast<size_t>(opts.max_tokens));
    case SplitMethod::kSemantic:
      return SemanticChunks(ids, Spell(tok, text, ids), static_cast<size_t>(opts.max_tokens));
  }
  return InvalidArgumentError("unknown split method");
}

}  // namespace attic::pic
