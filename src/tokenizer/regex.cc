#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "attic/tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace attic::tokenizer {

namespace {
// Deep whitespace runs make patterns like \s+(?!\S) backtrack; a 1 MiB JIT stack is
// plenty and is allocated per call, so concurrent callers never share one.
constexpr size_t kJitStackMax = 1 << 20;

std::string ErrorText(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}
}  // namespace

StatusOr<std::shared_ptr<const Regex>> Regex::Compile(const std::string& pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  if (literal) options |= PCRE2_LITERAL;
  if (!IsValidUtf8(pattern)) return InvalidArgumentError("regex pattern is not valid UTF-8");
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &err, &err_off, nullptr);
  if (code == nullptr) {
    return InvalidArgumentError("cannot compile regex '" + pattern + "' at offset " +
                                std::to_string(err_off) + ": " + ErrorText(err));
  }
  // JIT is an optimisation only: if it is unavailable pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  std::shared_ptr<Regex> re(new Regex());
  re->code_ = code;
  re->pattern_ = pattern;
  return std::shared_ptr<const Regex>(std::move(re));
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

RegexScratch::RegexScratch() {
  match_data_ = pcre2_match_data_create(1, nullptr);  // only the whole match is needed
  auto* ctx = pcre2_match_context_create(nullptr);
  auto* jit = pcre2_jit_stack_create(32 * 1024, kJitStackMax, nullptr);
  if (ctx != nullptr && jit != nullptr) pcre2_jit_stack_assign(ctx, nullptr, jit);
  context_ = ctx;
  jit_stack_ = jit;
}

RegexScratch::~RegexScratch() {
  if (jit_stack_ != nullptr) pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
  if (context_ != nullptr) pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
  if (match_data_ != nullptr) pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
}

bool Regex::FindNext(std::string_view subject, size_t start, RegexScratch* scratch, size_t* begin,
                     size_t* end) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* md = static_cast<pcre2_match_data*>(scratch->match_data_);
  auto* mctx = static_cast<pcre2_match_context*>(scratch->context_);
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  while (start < subject.size()) {
    const int rc = pcre2_match(code, data, subject.size(), start, PCRE2_NO_UTF_CHECK, md, mctx);
    if (rc < 0) return false;  // PCRE2_ERROR_NOMATCH, or a resource limit: the rest stays unmatched
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] > ov[0]) {
      *begin = ov[0];
      *end = ov[1];
      return true;
    }
    // Empty match: step over one character so the scan makes progress.
    start = ov[0] + Utf8SeqLen(static_cast<uint8_t>(subject[ov[0]]));
  }
  return false;
}

void Regex::FindAll(std::string_view subject, RegexScratch* scratch,
                    std::vector<std::pair<size_t, size_t>>* out) const {
  size_t start = 0, b = 0, e = 0;
  while (FindNext(subject, start, scratch, &b, &e)) {
    out->emplace_back(b, e);
    start = e;
  }
}

}  // namespace attic::tokenizer
