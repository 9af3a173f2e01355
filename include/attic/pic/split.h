// KVSplit (paper 002, Epic): cutting one document into chunks whose KV caches are
// generated, stored and later linked independently of their position. Two methods
// besides "no split": fixed-size runs of tokens (CacheBlend's 512-token chunks), and
// semantic chunks that end at the best text boundary available (paragraph, line,
// sentence, word) while staying within a token budget.
//
// What holds for every method:
//  * the chunks' texts, concatenated, are the document byte for byte (kFixed: when the
//    tokenizer's tokens spell the document back exactly, see below);
//  * a chunk's tokens carry no BOS: the linker decides where a BOS goes.
//
// Thread-safety: pure functions of their arguments (Tokenizer is const and thread-safe).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attic/core/status.h"
#include "attic/tokenizer/tokenizer.h"

namespace attic::pic {

enum class SplitMethod {
  kNone,      // one chunk: the whole document
  kFixed,     // runs of exactly max_tokens tokens of the document's encoding (last one shorter)
  kSemantic,  // greedy chunks of at most max_tokens tokens, cut at paragraph > line > sentence > word
};

// "none" | "fixed" | "semantic"; InvalidArgument naming the accepted values otherwise.
StatusOr<SplitMethod> ParseSplitMethod(std::string_view name);
// The name ParseSplitMethod accepts for `m`.
const char* SplitMethodName(SplitMethod m);

// The largest max_tokens accepted.
inline constexpr int kMaxSplitTokens = 1 << 20;

struct SplitOptions {
  SplitMethod method = SplitMethod::kSemantic;
  // Token budget of one chunk, 1..kMaxSplitTokens. kFixed: every chunk but the last has
  // exactly this many; kSemantic: none has more; kNone: not used (still validated).
  int max_tokens = 512;
  // Whether special-token text written in the document ("<|im_start|>", "<s>") becomes
  // the control token. Default false: a document is data, and a chunk must not be able
  // to forge the chat template's markers.
  bool parse_special = false;
};

struct TextChunk {
  std::string text;             // a slice of the document (see SplitDocument)
  std::vector<int32_t> tokens;  // kNone/kSemantic: Encode(text) without BOS; kFixed: see below
};

// Splits one document (valid UTF-8) into chunks, in order.
//
// kFixed: the document is encoded once (no BOS) and cut into runs of max_tokens tokens;
// the runs concatenated are exactly that encoding. A chunk's text is the bytes its
// tokens stand for (for SentencePiece-style tokenizers, without the space the
// normalizer put before the first word), so the texts concatenate to the document;
// such a cut can fall inside a word and, where byte-fallback tokens spell one
// character, inside a UTF-8 sequence. If the tokens do not spell the document back
// (an <unk> token, "▁" in a SentencePiece tokenizer's input), the texts are still the
// tokens' bytes: they concatenate to Decode(all tokens), not to the document.
//
// kSemantic: cuts fall only after a run of whitespace (which therefore stays with the
// chunk before it) or right after a CJK sentence end (。！？, which needs no space),
// never inside a word or a UTF-8 sequence. Each chunk is as long as fits in max_tokens
// -- counted by encoding the chunk's own text -- and ends at the best kind of
// boundary that is available within that reach, best first:
//   paragraph  a whitespace run holding two or more '\n' ("\n\n", "\n  \n", "\r\n\r\n")
//   line       a whitespace run holding one '\n'
//   sentence   whitespace after . ! ? … 。！？ (closing quotes and brackets between allowed)
//   word       any other whitespace run (ASCII whitespace; CJK text without spaces has
//              only sentence ends as boundaries)
// so consecutive short paragraphs share a chunk, and a paragraph that fits in
// max_tokens by itself is never cut. The one exception to "never inside a word": a word
// (a run without any boundary) longer than max_tokens by itself is cut between UTF-8
// code points, as late as the budget allows.
//
// Errors (InvalidArgument): max_tokens outside 1..kMaxSplitTokens; an empty document; a
// document that is not valid UTF-8; kSemantic when a single code point alone encodes to
// more than max_tokens tokens (a max_tokens of 1-3 with byte-fallback tokenizers).
// Cost: kSemantic encodes the document once plus each chunk a few times (it guesses a
// chunk's end from the whole document's tokens and then checks the guess).
StatusOr<std::vector<TextChunk>> SplitDocument(const tokenizer::Tokenizer& tok, std::string_view text,
                                               const SplitOptions& opts);

}  // namespace attic::pic
