#include "engine/generation_stream.h"

#include <algorithm>

#include "attic/engine/sampler.h"

namespace attic::engine {

GenerationStream::GenerationStream(const tokenizer::Tokenizer& tok, std::vector<int32_t> stop_ids,
                                   std::vector<std::string> stop_strings)
    : decoder_(tok), stop_ids_(std::move(stop_ids)), stop_strings_(std::move(stop_strings)) {
  std::sort(stop_ids_.begin(), stop_ids_.end());
}

GenerationStream::Step GenerationStream::Push(int32_t token) {
  if (std::binary_search(stop_ids_.begin(), stop_ids_.end(), token)) return Step::kStopToken;
  const size_t before = text_.size();
  text_ += decoder_.Push(token);
  const size_t cut = FindStopString(text_, stop_strings_, before);
  if (cut == std::string::npos) return Step::kContinue;
  for (const std::string& s : stop_strings_) {
    if (text_.compare(cut, s.size(), s) == 0 && s.size() > matched_stop_.size()) matched_stop_ = s;
  }
  text_.resize(cut);
  return Step::kStopString;
}

std::string GenerationStream::TakeReady() {
  const size_t safe = text_.size() - StopPrefixHoldback(text_, stop_strings_);
  if (safe <= emitted_) return "";
  std::string piece = text_.substr(emitted_, safe - emitted_);
  emitted_ = safe;
  return piece;
}

std::string GenerationStream::TakeRest(bool flush) {
  if (flush) text_ += decoder_.Flush();
  if (text_.size() <= emitted_) return "";
  std::string rest = text_.substr(emitted_);
  emitted_ = text_.size();
  return rest;
}

}  // namespace attic::engine
