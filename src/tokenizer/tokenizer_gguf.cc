// Tokenizer::FromGguf: builds a BpeTokenizer from the tokenizer.ggml.* metadata of a
// GGUF file, following llama.cpp's conventions:
//  * model "llama": SentencePiece BPE. Without a merges list, any two adjacent symbols
//    whose concatenation is a normal token may merge, the token with the highest score
//    first; <0xNN> byte tokens (type 6) are the fallback for unknown characters.
//  * model "gpt2": byte-level BPE with ranked merges and a pre-tokenizer chosen by
//    tokenizer.ggml.pre (the regex lists of llama.cpp's llama-vocab.cpp).
// Control (3) and unknown (2) tokens are special: matched in text only with
// parse_special. User-defined (4) tokens are always matched.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "attic/model/model.h"
#include "attic/tokenizer/tokenizer.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace attic::tokenizer {

namespace {

constexpr char kMetaspace[] = "\xE2\x96\x81";  // U+2581 "▁"

enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

constexpr char kGpt2Regex[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr char kLlama3Regex[] =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Regex[] =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The regexes applied in sequence (each splits the pieces of the previous one, matches
// isolated) for a tokenizer.ggml.pre name; ignore_merges is set for Llama-3.
StatusOr<std::vector<std::string>> PreRegexes(const std::string& pre, bool* ignore_merges) {
  *ignore_merges = false;
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "dbrx" || pre == "smaug-bpe") {
    *ignore_merges = true;
    return std::vector<std::string>{kLlama3Regex};
  }
  if (pre == "qwen2" || pre == "stablelm2") return std::vector<std::string>{kQwen2Regex};
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" || pre == "codeshell" ||
      pre == "exaone" || pre == "minerva-7b") {
    return std::vector<std::string>{R"(\p{N})", kGpt2Regex};
  }
  if (pre == "gpt2" || pre == "gpt-2" || pre == "mpt" || pre == "olmo" || pre == "jais") {
    return std::vector<std::string>{kGpt2Regex};
  }
  if (pre.empty() || pre == "default") {
    return std::vector<std::string>{R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"};
  }
  return UnimplementedError("GGUF tokenizer.ggml.pre '" + pre +
                            "' is not supported (known: default, gpt2, smollm, llama-bpe, qwen2)");
}

// Ranks from scores: the highest score merges first; equal scores share a rank (the
// leftmost candidate then wins, as in llama.cpp).
std::vector<int32_t> RanksFromScores(const std::vector<float>& scores) {
  std::vector<float> distinct(scores);
  std::sort(distinct.begin(), distinct.end(), std::greater<float>());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<int32_t> ranks(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    ranks[i] = static_cast<int32_t>(std::lower_bound(distinct.begin(), distinct.end(), scores[i],
                                                     std::greater<float>()) -
                                    distinct.begin());
  }
  return ranks;
}

void AddScoreMerges(const std::vector<std::string>& keys, const std::vector<int32_t>& types,
                    const std::vector<float>& scores, BpeModel* bpe) {
  const std::vector<int32_t> ranks = RanksFromScores(scores);
  for (size_t id = 0; id < keys.size(); ++id) {
    const std::string& k = keys[id];
    if (k.empty() || (types[id] != kNormal && types[id] != kUserDefined)) continue;
    size_t pos = Utf8SeqLen(static_cast<uint8_t>(k[0]));
    while (pos < k.size()) {
      const int32_t l = bpe->KeyToId(std::string_view(k).substr(0, pos));
      const int32_t r = bpe->KeyToId(std::string_view(k).substr(pos));
      if (l >= 0 && r >= 0) bpe->AddMerge(l, r, static_cast<int32_t>(id), ranks[id]);
      pos += Utf8SeqLen(static_cast<uint8_t>(k[pos]));
    }
  }
}

Status AddRankedMerges(const std::vector<std::string>& merges, bool byte_level, BpeModel* bpe) {
  std::string left, right;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& m = merges[rank];
    if (!IsValidUtf8(m)) return InvalidArgumentError("GGUF: a merge is not valid UTF-8");
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos) return InvalidArgumentError("GGUF: bad merge '" + m + "'");
    const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    if (byte_level) {
      if (!ByteLevelToBytes(a, &left) || !ByteLevelToBytes(b, &right)) continue;
    } else {
      left = a;
      right = b;
    }
    const int32_t l = bpe->KeyToId(left), r = bpe->KeyToId(right), c = bpe->KeyToId(left + right);
    if (l >= 0 && r >= 0 && c >= 0) bpe->AddMerge(l, r, c, static_cast<int32_t>(rank));
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const model::GgufTokenizerData& data) {
  const size_t n = data.tokens.size();
  if (n == 0) return InvalidArgumentError("GGUF: tokenizer.ggml.tokens is empty");
  const bool spm = data.model == "llama";
  if (!spm && data.model != "gpt2") {
    return UnimplementedError("GGUF tokenizer model '" + data.model + "' is not supported (llama, gpt2)");
  }
  for (const std::string& t : data.tokens) {
    if (!IsValidUtf8(t)) return InvalidArgumentError("GGUF: a token is not valid UTF-8");
  }
  std::vector<int32_t> types(n, kNormal);
  for (size_t i = 0; i < n && i < data.token_types.size(); ++i) types[i] = data.token_types[i];

  TokenizerParts parts;
  parts.texts = data.tokens;
  parts.special.assign(n, 0);
  parts.bytes.assign(n, "");
  std::vector<std::string> keys(n);
  std::vector<int32_t> byte_ids(256, -1);
  std::string raw;
  int32_t first_unknown = -1;
  for (size_t id = 0; id < n; ++id) {
    const std::string& text = data.tokens[id];
    const int32_t type = types[id];
    const bool special = type == kControl || type == kUnknown;
    if (type == kUnknown && first_unknown < 0) first_unknown = static_cast<int32_t>(id);
    if (special || type == kUserDefined) {
      AddedTokenSpec t;
      t.id = static_cast<int32_t>(id);
      t.content = text;
      t.special = special;
      if (!text.empty()) parts.added.push_back(std::move(t));
      parts.special[id] = special ? 1 : 0;
      parts.bytes[id] = text;
      if (special) continue;
    }
    if (spm) {
      if (type == kByte) {
        const int b = ParseByteToken(text);
        if (b >= 0 && byte_ids[b] < 0) byte_ids[b] = static_cast<int32_t>(id);
        parts.bytes[id] = b >= 0 ? std::string(1, static_cast<char>(b)) : text;
        continue;
      }
      keys[id] = text;
      std::string b = text;
      for (size_t p = b.find(kMetaspace); p != std::string::npos; p = b.find(kMetaspace, p + 1)) {
        b.replace(p, 3, " ");
      }
      if (type != kUserDefined) parts.bytes[id] = std::move(b);
    } else {
      const bool mapped = ByteLevelToBytes(text, &raw);
      keys[id] = mapped ? raw : text;
      if (type != kUserDefined) parts.bytes[id] = mapped ? raw : text;
      if (mapped && raw.size() == 1 && byte_ids[static_cast<uint8_t>(raw[0])] < 0) {
        byte_ids[static_cast<uint8_t>(raw[0])] = static_cast<int32_t>(id);
      }
    }
  }

  BpeModel::Options mo;
  if (spm) {
    mo.unit = BpeModel::SymbolUnit::kUtf8Char;
    mo.byte_fallback = true;
    mo.unk_id = data.unk_id >= 0 && data.unk_id < static_cast<int>(n) ? data.unk_id : first_unknown;
    if (data.add_space_prefix) {
      NormalizerStep prepend;
      prepend.kind = NormalizerStep::Kind::kPrepend;
      prepend.content = kMetaspace;
      parts.pipeline.normalizers.push_back(std::move(prepend));
      parts.strip_leading_spaces = 1;
    }
    NormalizerStep replace;
    replace.kind = NormalizerStep::Kind::kReplace;
    replace.pattern = " ";
    replace.content = kMetaspace;
    parts.pipeline.normalizers.push_back(std::move(replace));
  } else {
    mo.unit = BpeModel::SymbolUnit::kByte;
    ATTIC_ASSIGN_OR_RETURN(std::vector<std::string> regexes, PreRegexes(data.pre, &mo.ignore_merges));
    for (const std::string& r : regexes) {
      PreTokenizerStep step;
      step.kind = PreTokenizerStep::Kind::kSplit;
      ATTIC_ASSIGN_OR_RETURN(step.regex, Regex::Compile(r));
      parts.pipeline.pre_tokenizers.push_back(std::move(step));
    }
  }
  parts.model = std::make_unique<BpeModel>(keys, byte_ids, mo);
  if (!data.merges.empty()) {
    ATTIC_RETURN_IF_ERROR(AddRankedMerges(data.merges, !spm, parts.model.get()));
  } else if (spm) {
    std::vector<float> scores(n, 0.0f);
    for (size_t i = 0; i < n && i < data.scores.size(); ++i) scores[i] = data.scores[i];
    AddScoreMerges(keys, types, scores, parts.model.get());
  } else {
    return InvalidArgumentError("GGUF: a gpt2 tokenizer needs tokenizer.ggml.merges");
  }

  const auto valid = [n](int id) { return id >= 0 && id < static_cast<int>(n) ? id : -1; };
  parts.bos_id = valid(data.bos_id);
  parts.eos_id = valid(data.eos_id);
  parts.add_bos = data.add_bos && parts.bos_id >= 0;
  parts.add_eos = data.add_eos && parts.eos_id >= 0;
  parts.chat_template = data.chat_template;
  return std::unique_ptr<Tokenizer>(new BpeTokenizer(std::move(parts)));
}

}  // namespace attic::tokenizer
