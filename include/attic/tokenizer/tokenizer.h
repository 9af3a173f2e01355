// Tokenizer: BPE in the two families Llama-style models use.
//  * SentencePiece-style (stories260K, Llama-2, Mistral, TinyLlama): normalizer that
//    prepends/replaces spaces with U+2581 "▁", merges by rank (or score), byte fallback
//    tokens <0xNN>.
//  * Byte-level (GPT-2, Llama-3, Qwen2, SmolLM2): regex pre-tokenizer (PCRE2), GPT-2
//    byte<->unicode map, merges by rank.
// Built from a tokenizer.json (+ optional tokenizer_config.json) or from GGUF metadata.
//
// Thread-safety: Encode/Decode are const and safe to call concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attic/core/status.h"

namespace attic::model {
struct GgufTokenizerData;
}

namespace attic::tokenizer {

struct EncodeOptions {
  bool add_bos = true;        // prepend BOS when the tokenizer's config says so (add_bos_token)
  bool parse_special = true;  // recognise special/added tokens written in the text
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // `tokenizer_config_json` may be "" (then defaults: add_bos from the post-processor).
  static StatusOr<std::unique_ptr<Tokenizer>> FromJson(const std::string& tokenizer_json,
                                                       const std::string& tokenizer_config_json);
  // Reads tokenizer.json and, if present, tokenizer_config.json from a directory.
  static StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir);
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const model::GgufTokenizerData& data);

  // InvalidArgument for text that is not valid UTF-8.
  virtual StatusOr<std::vector<int32_t>> Encode(std::string_view text, const EncodeOptions& opts = {}) const = 0;
  // Concatenated bytes of the tokens (special tokens rendered as their text unless
  // skip_special). May end in an incomplete UTF-8 sequence only if the ids do.
  virtual std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  // Raw bytes of one token (byte-fallback and byte-level tokens decoded; SentencePiece
  // "▁" mapped to ' '). A leading space after BOS is *not* stripped here.
  virtual std::string TokenBytes(int32_t id) const = 0;
  // The token's string as stored in the vocabulary.
  virtual const std::string& TokenText(int32_t id) const = 0;
  // -1 if not in the vocabulary.
  virtual int32_t TokenId(std::string_view text) const = 0;

  virtual int vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;  // control / added special tokens
  virtual bool add_bos() const = 0;
  // Chat template text from tokenizer_config.json / GGUF ("" if none).
  virtual const std::string& chat_template() const = 0;
  // True for SentencePiece-style tokenizers, whose decoder drops the space that the
  // normalizer put before the first word ("▁Hello" -> "Hello"). StreamDecoder uses it.
  virtual bool StripsLeadingSpace() const { return false; }
};

// Turns a stream of token ids into text that is always valid UTF-8: bytes of an
// incomplete multi-byte sequence are held back until the sequence completes.
// SentencePiece tokenizers: the leading space of the first piece is dropped.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tok, bool skip_special = true);
  // Returns the text that became complete with this token (possibly "").
  std::string Push(int32_t id);
  // Returns whatever is pending (invalid leftovers as U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;
};

// True if `s` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
bool IsValidUtf8(std::string_view s);

}  // namespace attic::tokenizer
