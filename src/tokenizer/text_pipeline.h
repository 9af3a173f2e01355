// What happens to a stretch of input text (between added tokens) before the BPE model
// sees it: the normalizers of tokenizer.json (Prepend, Replace, ...) and then the
// pre-tokenizers (Split by regex, Digits, ByteLevel, Metaspace, ...), which cut it
// into the pieces that are merged independently.
//
// Thread-safety: immutable after construction; Run is const and reentrant.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/regex.h"

namespace attic::tokenizer {

struct NormalizerStep {
  enum class Kind {
    kPrepend,  // prepend `content` to non-empty text
    kReplace,  // replace every match of `regex` (or literal `pattern`) with `content`
  };
  Kind kind = Kind::kPrepend;
  std::string pattern;                  // kReplace with a literal pattern
  std::shared_ptr<const Regex> regex;   // kReplace with a regex pattern (else null)
  std::string content;
};

// How a split keeps the matched delimiters (HF tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum class Kind {
    kSplit,      // split every piece by `regex` with `behavior` / `invert`
    kByteLevel,  // optional prefix space, then (if `regex`) an isolated GPT-2 split
    kMetaspace,  // ' ' -> `replacement`, prepend per `prepend`, optionally split on it
  };
  enum class Prepend { kAlways, kFirst, kNever };
  Kind kind = Kind::kSplit;
  std::shared_ptr<const Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  std::string replacement = "\xE2\x96\x81";  // kMetaspace: U+2581 "▁"
  Prepend prepend = Prepend::kAlways;
  bool split = true;
};

// Receives each final piece; the view is valid only during the call.
using PieceSink = std::function<void(std::string_view piece)>;

// PCRE2 state reused across Run calls of one Encode (not shared between threads).
struct PipelineScratch {
  RegexScratch regex;
};

class TextPipeline {
 public:
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;

  // Normalizes `segment`, cuts it into pieces and passes them, in order, to `sink`.
  // Pieces are produced depth first (each piece of a step goes through the remaining
  // steps before the next one is cut), so memory stays small for megabyte inputs.
  // `at_start`: the segment begins the input text (Metaspace prepend_scheme "first").
  // REQUIRES: `segment` is valid UTF-8.
  void Run(std::string_view segment, bool at_start, PipelineScratch* scratch, const PieceSink& sink) const;

 private:
  std::string Normalize(std::string_view text, PipelineScratch* scratch) const;
  void RunStep(size_t step, std::string_view piece, bool first_piece, PipelineScratch* scratch,
               const PieceSink& sink) const;
};

// Calls `f(part, is_first_part)` for the non-empty parts of `piece` split at the
// matches of `re` per `behavior` (HF tokenizers' semantics, including `invert`).
void SplitPiece(std::string_view piece, const Regex& re, SplitBehavior behavior, bool invert,
                PipelineScratch* scratch, const std::function<void(std::string_view, bool)>& f);

}  // namespace attic::tokenizer
