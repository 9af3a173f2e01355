// KVSplit (paper 002, Epic): cutting one document into chunks whose KV caches are
// generated, stored and later linked independently of their position. Two methods
// besides "no split": fixed-size runs of tokens (CacheBlend's 512-token chunks), and
// semantic chunks that end at the best text boundary available (paragraph, line,
// sentence, word) while staying within a token budget.
//
// What holds for every method:
//  * the document is encoded once (no BOS), and the chunks' tokens, concatenated, are
//    exactly that encoding: linking the chunks in order gives the prompt the document
//    is, token for token (a chunk's tokens need not be its text encoded on its own: a
//    SentencePiece tokenizer would put a "▁" before that text's first word, for one);
//  * a chunk's text is the bytes its tokens stand for, so the texts, concatenated, are
//    the document byte for byte when the tokens spell it back (see below);
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
  kSemantic,  // greedy runs of at most max_tokens tokens, cut at paragraph > line > sentence > word
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
  std::string text;             // the bytes `tokens` stand for: a slice of the document (see SplitDocument)
  std::vector<int32_t> tokens;  // a run of the document's encoding (no BOS)
};

// Splits one document (valid UTF-8) into chunks, in order. Every method cuts the
// document's encoding (no BOS, special-token text parsed as opts.parse_special says)
// between tokens; a chunk's text is the bytes its tokens stand for (for
// SentencePiece-style tokenizers, without the space the normalizer put before the first
// word), so the texts concatenate to the document. If the tokens do not spell the
// document back (an <unk> token, "▁" in a SentencePiece tokenizer's input), the texts
// are still the tokens' bytes: they concatenate to Decode(all tokens), not to the
// document, and kSemantic finds its boundaries in that text.
//
// kNone: one chunk, the document itself and its whole encoding.
//
// kFixed: runs of max_tokens tokens (the last one shorter). A cut can fall inside a
// word and, where byte-fallback tokens spell one character, inside a UTF-8 sequence.
//
// kSemantic: a cut falls only where the next token starts at a boundary: at or inside a
// run of whitespace (with SentencePiece and byte-level BPE tokenizers the space before
// a word starts the word's token, "▁word" / "Ġword", so the whitespace mostly goes to
// the chunk after the cut), or right after a CJK sentence end (。！？, which needs no
// space); never inside a word or a UTF-8 sequence. Each chunk holds as many tokens as
// fit in max_tokens up to the best kind of boundary within that reach, and of that
// kind the farthest, best first:
//   paragraph  a whitespace run holding two or more '\n' ("\n\n", "\n  \n", "\r\n\r\n")
//   line       a whitespace run holding one '\n'
//   sentence   whitespace after . ! ? … 。！？ (closing quotes and brackets between allowed)
//   word       any other whitespace run (ASCII whitespace; CJK text without spaces has
//              only sentence ends as boundaries)
// Whitespace at the very beginning or end of the document is no boundary (it belongs to
// the first or last word). So consecutive short paragraphs share a chunk, and a
// paragraph whose tokens (from the boundary before it to the one after) fit in
// max_tokens is never cut. The one exception to "never inside a word": where no
// boundary is within reach (a word longer than max_tokens tokens), the chunk ends at
// the farthest token within reach that starts a code point. A boundary no token starts
// at or inside (a token spanning the whole whitespace run) cannot be cut at.
//
// Errors (InvalidArgument): max_tokens outside 1..kMaxSplitTokens; an empty document; a
// document that is not valid UTF-8; kSemantic when a single code point takes more than
// max_tokens tokens (a max_tokens of 1-3 with byte-fallback tokenizers).
// Cost: one encode of the document and a pass over its tokens, for every method.
StatusOr<std::vector<TextChunk>> SplitDocument(const tokenizer::Tokenizer& tok, std::string_view text,
                                               const SplitOptions& opts);

}  // namespace attic::pic
