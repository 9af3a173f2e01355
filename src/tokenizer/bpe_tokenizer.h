// BpeTokenizer: the one Tokenizer implementation. Loaders (tokenizer.json in
// tokenizer_json.cc, GGUF metadata in tokenizer_gguf.cc) fill a TokenizerParts and
// hand it over; Encode runs added-token matching -> TextPipeline -> BpeModel.
//
// Thread-safety: immutable after construction; every method is const and reentrant
// (Encode keeps its scratch buffers and piece cache on the stack).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attic/tokenizer/tokenizer.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/text_pipeline.h"

namespace attic::tokenizer {

struct AddedTokenSpec {
  int32_t id = -1;
  std::string content;
  bool special = false;  // matched only with parse_special
  bool lstrip = false;   // swallows whitespace on its left
  bool rstrip = false;   // swallows whitespace on its right
};

struct TokenizerParts {
  std::vector<std::string> texts;        // id -> token text as stored in the vocabulary
  std::vector<std::string> bytes;        // id -> decoded bytes (TokenBytes)
  std::vector<uint8_t> special;          // id -> 1 for control / added special tokens
  std::vector<AddedTokenSpec> added;     // matched in the raw text before normalization
  TextPipeline pipeline;
  std::unique_ptr<BpeModel> model;
  int strip_leading_spaces = 0;          // decoder "Strip": leading spaces Decode drops
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;
  bool add_eos = false;
  std::string chat_template;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(TokenizerParts parts);

  StatusOr<std::vector<int32_t>> Encode(std::string_view text, const EncodeOptions& opts) const override;
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  std::string TokenBytes(int32_t id) const override;
  const std::string& TokenText(int32_t id) const override;
  int32_t TokenId(std::string_view text) const override;
  int vocab_size() const override { return static_cast<int>(p_.texts.size()); }
  int32_t bos_id() const override { return p_.bos_id; }
  int32_t eos_id() const override { return p_.eos_id; }
  bool IsSpecial(int32_t id) const override;
  bool add_bos() const override { return p_.add_bos; }
  const std::string& chat_template() const override { return p_.chat_template; }
  bool StripsLeadingSpace() const override { return p_.strip_leading_spaces > 0; }

 private:
  struct Span {
    size_t begin;
    size_t end;
    int32_t token;  // -1: plain text [begin, end)
  };
  // Cuts `text` at added tokens (leftmost, then longest match).
  std::vector<Span> SplitAddedTokens(std::string_view text, bool parse_special) const;
  bool ValidId(int32_t id) const { return id >= 0 && id < static_cast<int32_t>(p_.texts.size()); }

  // Calls `f` for the parts of `piece` cut before every run of split_marker_ (see
  // BpeModel::MarkerOnlyLeads).
  template <typename F>
  void CutAtMarker(std::string_view piece, F&& f) const;

  TokenizerParts p_;
  // "▁" when SentencePiece text may be cut into words before BPE (exactly the same
  // ids, but words repeat and are memoised); "" otherwise.
  std::string split_marker_;
  StringIdMap text_to_id_;
  // Added tokens grouped by first byte, longest first.
  std::vector<std::vector<int>> added_by_byte_;
};

}  // namespace attic::tokenizer
