// StreamDecoder: incremental detokenization that only ever emits whole UTF-8
// characters (an emoji split over four <0xNN> byte tokens comes out once complete).
#include <string>

#include "attic/tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace attic::tokenizer {

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special) : tok_(tok), skip_special_(skip_special) {}

std::string StreamDecoder::Push(int32_t id) {
  if (skip_special_ && tok_.IsSpecial(id)) return "";
  std::string bytes = tok_.TokenBytes(id);
  if (bytes.empty()) return "";
  if (first_) {
    // The same rule as Tokenizer::Decode: the space the SentencePiece normalizer put
    // before the first word is not part of the text.
    first_ = false;
    if (tok_.StripsLeadingSpace() && bytes[0] == ' ') bytes.erase(0, 1);
  }
  pending_ += bytes;
  std::string out;
  while (!pending_.empty()) {
    size_t invalid_at = std::string::npos;
    const size_t ok = CompleteUtf8Prefix(pending_, &invalid_at);
    out.append(pending_, 0, ok);
    if (invalid_at == std::string::npos) {
      pending_.erase(0, ok);  // what is left is an incomplete but valid sequence
      break;
    }
    // A byte that can never become valid: show it as U+FFFD and go on after it.
    out.append(kReplacementChar);
    pending_.erase(0, invalid_at + 1);
  }
  return out;
}

std::string StreamDecoder::Flush() {
  if (pending_.empty()) return "";
  pending_.clear();
  return std::string(kReplacementChar);
}

}  // namespace attic::tokenizer
