// A compiled PCRE2 pattern (UTF + UCP, JIT when available) used by normalizers and
// pre-tokenizers. Patterns come from tokenizer.json (written for Oniguruma) or from
// the llama.cpp pre-tokenizer names; the constructs they use (\p{L}, \p{N}, (?i:...),
// lookahead, {1,3}) mean the same in PCRE2.
//
// Thread-safety: immutable after Compile; FindAll may be called concurrently with
// distinct RegexScratch objects.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attic/core/status.h"

namespace attic::tokenizer {

// Per-call PCRE2 state (match data, match context, JIT stack), allocated once per
// Encode and reused for every FindAll of that call. Not shared between threads.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

 private:
  friend class Regex;
  void* match_data_ = nullptr;  // pcre2_match_data_8*
  void* context_ = nullptr;     // pcre2_match_context_8*
  void* jit_stack_ = nullptr;   // pcre2_jit_stack_8*
};

class Regex {
 public:
  // `literal` compiles `pattern` as a plain string (tokenizer.json {"String": ...}).
  static StatusOr<std::shared_ptr<const Regex>> Compile(const std::string& pattern, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the non-empty, non-overlapping matches [begin, end) in `subject`, left to
  // right, to *out. REQUIRES: `subject` is valid UTF-8 (not re-checked).
  void FindAll(std::string_view subject, RegexScratch* scratch, std::vector<std::pair<size_t, size_t>>* out) const;

  // The first non-empty match at or after `start`: sets [*begin, *end) and returns
  // true, or returns false if there is none. Lookarounds see the whole `subject`.
  // REQUIRES: `subject` is valid UTF-8.
  bool FindNext(std::string_view subject, size_t start, RegexScratch* scratch, size_t* begin, size_t* end) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
  std::string pattern_;
};

}  // namespace attic::tokenizer
