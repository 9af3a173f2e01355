#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

namespace attic::tokenizer {

namespace {

bool IsAsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Pieces up to this many bytes are memoised for the duration of one Encode call:
// real text repeats its words a lot.
constexpr size_t kMaxCachedPiece = 64;

const std::string& EmptyString() {
  static const std::string empty;
  return empty;
}

}  // namespace

BpeTokenizer::BpeTokenizer(TokenizerParts parts) : p_(std::move(parts)) {
  const size_t n = p_.texts.size();
  p_.bytes.resize(n);
  p_.special.resize(n, 0);
  text_to_id_.reserve(n * 2);
  for (size_t id = 0; id < n; ++id) text_to_id_.emplace(p_.texts[id], static_cast<int32_t>(id));
  // Added tokens win over vocabulary entries of the same text.
  for (const AddedTokenSpec& t : p_.added) {
    if (ValidId(t.id)) text_to_id_[t.content] = t.id;
  }
  static const std::string kMetaspace = "\xE2\x96\x81";
  if (p_.model->KeyToId(kMetaspace) >= 0 && p_.model->MarkerOnlyLeads(kMetaspace)) split_marker_ = kMetaspace;
  added_by_byte_.resize(256);
  for (size_t i = 0; i < p_.added.size(); ++i) {
    const AddedTokenSpec& t = p_.added[i];
    if (t.content.empty() || !ValidId(t.id)) continue;
    added_by_byte_[static_cast<uint8_t>(t.content[0])].push_back(static_cast<int>(i));
  }
  for (auto& list : added_by_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
      return p_.added[a].content.size() > p_.added[b].content.size();
    });
  }
}

std::vector<BpeTokenizer::Span> BpeTokenizer::SplitAddedTokens(std::string_view text,
                                                               bool parse_special) const {
  std::vector<Span> spans;
  size_t plain_begin = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& candidates = added_by_byte_[static_cast<uint8_t>(text[pos])];
    const AddedTokenSpec* hit = nullptr;
    for (int idx : candidates) {
      const AddedTokenSpec& t = p_.added[idx];
      if (t.special && !parse_special) continue;
      if (text.compare(pos, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos;
    size_t end = pos + hit->content.size();
    if (hit->lstrip) {
      while (begin > plain_begin && IsAsciiSpace(text[begin - 1])) --begin;
    }
    if (hit->rstrip) {
      while (end < text.size() && IsAsciiSpace(text[end])) ++end;
    }
    if (begin > plain_begin) spans.push_back({plain_begin, begin, -1});
    spans.push_back({begin, end, hit->id});
    plain_begin = pos = end;
  }
  if (plain_begin < text.size()) spans.push_back({plain_begin, text.size(), -1});
  return spans;
}

template <typename F>
void BpeTokenizer::CutAtMarker(std::string_view piece, F&& f) const {
  const std::string_view m = split_marker_;
  size_t start = 0;
  for (size_t hit = piece.find(m, 1); hit != std::string_view::npos; hit = piece.find(m, hit + m.size())) {
    // Cut only where a run of markers begins: "a▁▁b" -> "a", "▁▁b".
    if (hit >= m.size() && piece.substr(hit - m.size(), m.size()) == m) continue;
    f(piece.substr(start, hit - start));
    start = hit;
  }
  f(piece.substr(start));
}

StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text, const EncodeOptions& opts) const {
  if (!IsValidUtf8(text)) return InvalidArgumentError("text to tokenize is not valid UTF-8");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (opts.add_bos && p_.add_bos && p_.bos_id >= 0) ids.push_back(p_.bos_id);

  BpeModel::Scratch scratch;
  PipelineScratch pipe_scratch;
  // Memo of piece -> [offset, count) in cache_ids, for this call only.
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<int32_t> cache_ids;
  const auto encode_word = [&](std::string_view word) {
    if (word.empty()) return;
    if (word.size() > kMaxCachedPiece) {
      p_.model->Encode(word, &ids, &scratch);
      return;
    }
    auto it = cache.find(word);
    if (it == cache.end()) {
      const size_t before = cache_ids.size();
      p_.model->Encode(word, &cache_ids, &scratch);
      it = cache.emplace(std::string(word), std::make_pair(static_cast<uint32_t>(before),
                                                           static_cast<uint32_t>(cache_ids.size() - before)))
               .first;
    }
    ids.insert(ids.end(), cache_ids.begin() + it->second.first,
               cache_ids.begin() + it->second.first + it->second.second);
  };
  PieceSink sink;
  if (split_marker_.empty()) {
    sink = encode_word;
  } else {
    sink = [&](std::string_view piece) { CutAtMarker(piece, encode_word); };
  }
  for (const Span& span : SplitAddedTokens(text, opts.parse_special)) {
    if (span.token >= 0) {
      ids.push_back(span.token);
      continue;
    }
    p_.pipeline.Run(text.substr(span.begin, span.end - span.begin), span.begin == 0, &pipe_scratch, sink);
  }
  if (opts.add_bos && p_.add_eos && p_.eos_id >= 0) ids.push_back(p_.eos_id);
  return ids;
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (!ValidId(id)) continue;
    if (skip_special && p_.special[id]) continue;
    out += p_.bytes[id];
  }
  int strip = p_.strip_leading_spaces;
  size_t cut = 0;
  while (strip-- > 0 && cut < out.size() && out[cut] == ' ') ++cut;
  out.erase(0, cut);
  return out;
}

std::string BpeTokenizer::TokenBytes(int32_t id) const { return ValidId(id) ? p_.bytes[id] : std::string(); }

const std::string& BpeTokenizer::TokenText(int32_t id) const {
  return ValidId(id) ? p_.texts[id] : EmptyString();
}

int32_t BpeTokenizer::TokenId(std::string_view text) const {
  auto it = text_to_id_.find(text);
  return it == text_to_id_.end() ? -1 : it->second;
}

bool BpeTokenizer::IsSpecial(int32_t id) const { return ValidId(id) && p_.special[id] != 0; }

}  // namespace attic::tokenizer
