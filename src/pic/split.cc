#include "attic/pic/split.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "pic/split_boundaries.h"

namespace attic::pic {

namespace {

using tokenizer::EncodeOptions;
using tokenizer::Tokenizer;

EncodeOptions ChunkEncodeOptions(const SplitOptions& opts) {
  EncodeOptions e;
  e.add_bos = false;
  e.parse_special = opts.parse_special;
  return e;
}

// Where each token of the document's encoding ends in the document (byte offsets,
// ascending). `exact` when the tokens' bytes spell the document, possibly after one
// space a SentencePiece normalizer prepended (that space is counted as the first
// token's, at offset 0). Otherwise `ends` is empty.
struct TokenEnds {
  std::vector<size_t> ends;
  bool exact = false;
};

TokenEnds MapTokenEnds(const Tokenizer& tok, std::string_view text, const std::vector<int32_t>& ids) {
  TokenEnds out;
  std::string spelled;
  spelled.reserve(text.size() + 1);
  std::vector<size_t> ends;
  ends.reserve(ids.size());
  for (int32_t id : ids) {
    spelled += tok.TokenBytes(id);
    ends.push_back(spelled.size());
  }
  size_t shift = 0;
  if (spelled == text) {
    shift = 0;
  } else if (spelled.size() == text.size() + 1 && spelled[0] == ' ' && std::string_view(spelled).substr(1) == text) {
    shift = 1;
  } else {
    return out;
  }
  for (size_t& e : ends) e = e >= shift ? e - shift : 0;
  out.ends = std::move(ends);
  out.exact = true;
  return out;
}

// Guesses how many tokens a slice of the document encodes to, from the whole
// document's encoding: the tokens whose bytes overlap the slice (or, when the tokens do
// not map onto the document, a share proportional to bytes). A piece's own encoding
// differs only near its edges, so the guess is close; it steers the search and is
// never trusted for the bound.
class TokenEstimate {
 public:
  TokenEstimate(const TokenEnds& map, size_t n_tokens, size_t n_bytes)
      : map_(map), n_tokens_(n_tokens), n_bytes_(n_bytes) {}

  size_t Count(size_t begin, size_t end) const {
    if (end <= begin) return 0;
    if (!map_.exact) return (end - begin) * n_tokens_ / std::max<size_t>(n_bytes_, 1) + 1;
    const auto& e = map_.ends;
    const size_t first = std::upper_bound(e.begin(), e.end(), begin) - e.begin();  // first token ending after begin
    const size_t last = std::lower_bound(e.begin(), e.end(), end) - e.begin();     // first token reaching end
    return (last < e.size() ? last + 1 : e.size()) - std::min(first, e.size());
  }

 private:
  const TokenEnds& map_;
  size_t n_tokens_;
  size_t n_bytes_;
};

// The last index i in [lo, end) with pred(i), assuming pred is true up to some index and
// false after it; lo - 1 if pred(lo) is false. Starts at `hint` and gallops, so a good
// hint costs about two calls of pred.
template <typename Pred>
ptrdiff_t LastTrue(ptrdiff_t lo, ptrdiff_t end, ptrdiff_t hint, Pred&& pred) {
  ptrdiff_t good = lo - 1;  // pred(good) is true (or good == lo - 1)
  ptrdiff_t bad = end;      // pred(bad) is false (or bad == end)
  if (pred(hint)) {
    good = hint;
    for (ptrdiff_t step = 1; good + step < bad; step *= 2) {
      if (!pred(good + step)) {
        bad = good + step;
        break;
      }
      good += step;
    }
  } else {
    bad = hint;
    for (ptrdiff_t step = 1; bad - step > good; step *= 2) {
      if (pred(bad - step)) {
        good = bad - step;
        break;
      }
      bad -= step;
    }
  }
  while (bad - good > 1) {
    const ptrdiff_t mid = good + (bad - good) / 2;
    if (pred(mid)) {
      good = mid;
    } else {
      bad = mid;
    }
  }
  return good;
}

// The last index in [lo, end) whose estimate is within `budget` (lo if none is):
// where the search for a chunk's end starts.
template <typename EstimateAt>
ptrdiff_t GuessLastWithin(ptrdiff_t lo, ptrdiff_t end, size_t budget, EstimateAt&& estimate_at) {
  ptrdiff_t good = lo, bad = end;
  if (estimate_at(lo) > budget) return lo;
  while (bad - good > 1) {
    const ptrdiff_t mid = good + (bad - good) / 2;
    if (estimate_at(mid) <= budget) {
      good = mid;
    } else {
      bad = mid;
    }
  }
  return good;
}

class SemanticSplitter {
 public:
  SemanticSplitter(const Tokenizer& tok, std::string_view text, const SplitOptions& opts, const TokenEstimate& estimate)
      : tok_(tok),
        text_(text),
        encode_opts_(ChunkEncodeOptions(opts)),
        max_tokens_(static_cast<size_t>(opts.max_tokens)),
        // Beyond twice the budget (plus slack for edge effects) a slice is taken not to
        // fit without encoding it, so that a long word costs no encode of the whole rest.
        prune_above_(2 * static_cast<size_t>(opts.max_tokens) + 16),
        estimate_(estimate),
        cuts_(FindCuts(text)) {
    cuts_.push_back({text.size(), CutLevel::kParagraph});  // the document's end
  }

  StatusOr<std::vector<TextChunk>> Run() {
    std::vector<TextChunk> chunks;
    size_t start = 0;
    size_t lo = 0;  // first cut after start
    while (start < text_.size()) {
      while (cuts_[lo].pos <= start) ++lo;
      encoded_.clear();
      size_t end = 0;
      const ptrdiff_t last = FarthestFittingCut(start, lo);
      if (last >= static_cast<ptrdiff_t>(lo)) {
        end = BestCut(start, lo, static_cast<size_t>(last));
      } else {
        ATTIC_ASSIGN_OR_RETURN(end, FarthestFittingCodePoint(start, cuts_[lo].pos));
      }
      TextChunk chunk;
      chunk.text = std::string(text_.substr(start, end - start));
      ATTIC_ASSIGN_OR_RETURN(chunk.tokens, Tokens(start, end));
      ATTIC_CHECK(chunk.tokens.size() <= max_tokens_);
      chunks.push_back(std::move(chunk));
      start = end;
    }
    return chunks;
  }

 private:
  // Encodes text_[begin, end); remembers the encodings of the current chunk's search.
  StatusOr<std::vector<int32_t>> Tokens(size_t begin, size_t end) {
    for (auto& [pos, ids] : encoded_) {
      if (pos == end) return ids;
    }
    ATTIC_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok_.Encode(text_.substr(begin, end - begin), encode_opts_));
    encoded_.emplace_back(end, ids);
    return ids;
  }

  bool Fits(size_t begin, size_t end) {
    if (estimate_.Count(begin, end) > prune_above_) return false;
    auto ids = Tokens(begin, end);
    return ids.ok() && ids->size() <= max_tokens_;
  }

  // The index of the farthest cut c >= lo with text_[start, c) within budget; lo - 1 if
  // not even the first cut is.
  ptrdiff_t FarthestFittingCut(size_t start, size_t lo) {
    const ptrdiff_t end = static_cast<ptrdiff_t>(cuts_.size());
    const ptrdiff_t hint = GuessLastWithin(static_cast<ptrdiff_t>(lo), end, max_tokens_,
                                           [&](ptrdiff_t i) { return estimate_.Count(start, cuts_[i].pos); });
    return LastTrue(static_cast<ptrdiff_t>(lo), end, hint, [&](ptrdiff_t i) { return Fits(start, cuts_[i].pos); });
  }

  // Among cuts lo..last (all within reach), the farthest one of the best level.
  size_t BestCut(size_t start, size_t lo, size_t last) {
    size_t best = last;
    for (size_t i = last + 1; i-- > lo;) {
      if (cuts_[i].level < cuts_[best].level) best = i;
    }
    // Reaching `last` fits; an earlier cut almost surely does too (token counts grow
    // with the text), but a tokenizer may merge differently, so check.
    if (best != last && !Fits(start, cuts_[best].pos)) best = last;
    return cuts_[best].pos;
  }

  // No boundary is within reach of `start`: the word there is longer than the budget.
  // Cuts it at the farthest code point (before `limit`, the first boundary) that fits.
  StatusOr<size_t> FarthestFittingCodePoint(size_t start, size_t limit) {
    std::vector<size_t> points;
    for (size_t p = start + 1; p < limit; ++p) {
      if (IsUtf8Continuation(text_[p])) continue;
      if (estimate_.Count(start, p) > prune_above_) break;
      points.push_back(p);
    }
    if (!points.empty()) {
      const ptrdiff_t n = static_cast<ptrdiff_t>(points.size());
      const ptrdiff_t hint =
          GuessLastWithin(0, n, max_tokens_, [&](ptrdiff_t i) { return estimate_.Count(start, points[i]); });
      const ptrdiff_t last = LastTrue(0, n, hint, [&](ptrdiff_t i) { return Fits(start, points[i]); });
      if (last >= 0) return points[last];
    }
    size_t one = start + 1;
    while (one < text_.size() && IsUtf8Continuation(text_[one])) ++one;
    ATTIC_ASSIGN_OR_RETURN(std::vector<int32_t> ids, Tokens(start, one));
    return InvalidArgumentError("max_tokens " + std::to_string(max_tokens_) + " is too small: the character at byte " +
                                std::to_string(start) + " alone encodes to " + std::to_string(ids.size()) + " tokens");
  }

  const Tokenizer& tok_;
  std::string_view text_;
  EncodeOptions encode_opts_;
  size_t max_tokens_;
  size_t prune_above_;
  const TokenEstimate& estimate_;
  std::vector<Cut> cuts_;
  std::vector<std::pair<size_t, std::vector<int32_t>>> encoded_;
};

std::vector<TextChunk> FixedChunks(const Tokenizer& tok, std::string_view text, std::vector<int32_t> ids,
                                   const TokenEnds& map, size_t max_tokens) {
  std::vector<TextChunk> chunks;
  for (size_t first = 0; first < ids.size(); first += max_tokens) {
    const size_t last = std::min(ids.size(), first + max_tokens);  // exclusive
    TextChunk chunk;
    chunk.tokens.assign(ids.begin() + first, ids.begin() + last);
    if (map.exact) {
      const size_t begin = first == 0 ? 0 : map.ends[first - 1];
      const size_t end = last == ids.size() ? text.size() : map.ends[last - 1];
      chunk.text = std::string(text.substr(begin, end - begin));
    } else {
      // The tokens' bytes, as Decode would render the whole document piece by piece.
      for (int32_t id : chunk.tokens) chunk.text += tok.TokenBytes(id);
      if (first == 0 && tok.StripsLeadingSpace() && !chunk.text.empty() && chunk.text[0] == ' ') {
        chunk.text.erase(0, 1);
      }
    }
    chunks.push_back(std::move(chunk));
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

  ATTIC_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text, ChunkEncodeOptions(opts)));
  switch (opts.method) {
    case SplitMethod::kNone: {
      std::vector<TextChunk> one(1);
      one[0].text = std::string(text);
      one[0].tokens = std::move(ids);
      return one;
    }
    case SplitMethod::kFixed: {
      const TokenEnds map = MapTokenEnds(tok, text, ids);
      return FixedChunks(tok, text, std::move(ids), map, static_cast<size_t>(opts.max_tokens));
    }
    case SplitMethod::kSemantic: {
      const TokenEnds map = MapTokenEnds(tok, text, ids);
      const TokenEstimate estimate(map, ids.size(), text.size());
      return SemanticSplitter(tok, text, opts, estimate).Run();
    }
  }
  return InvalidArgumentError("unknown split method");
}

}  // namespace attic::pic
