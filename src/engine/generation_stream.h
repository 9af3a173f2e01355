// GenerationStream (internal to the engine): the rules every generation applies to its
// sampled tokens -- Session::Generate (the CLI, benchmarks, tests) and the scheduler
// (the server) alike, so that a batched request produces exactly what `attic generate`
// produces:
//   - a stop token ends the generation ("stop"; it adds no text);
//   - a token's text joins the output through a StreamDecoder, so that emitted text never
//     splits a UTF-8 character;
//   - a stop string ends it too, the text cut before the string ("stop");
//   - text that could still turn into a stop string is held back until it cannot;
//   - at the length limit (or the window's end) whatever the decoder holds is flushed.
//
// Thread-safety: one per generation, used by one thread.
#pragma once

#include <string>
#include <vector>

#include "attic/tokenizer/tokenizer.h"

namespace attic::engine {

class GenerationStream {
 public:
  // stop_ids: token ids that end the generation (any order); stop_strings as sampling's.
  GenerationStream(const tokenizer::Tokenizer& tok, std::vector<int32_t> stop_ids,
                   std::vector<std::string> stop_strings);

  // What a sampled token did: the generation goes on, or stops here ("stop") at a stop
  // token (which adds no text) or at a stop string (whose text is cut off).
  enum class Step { kContinue, kStopToken, kStopString };
  Step Push(int32_t token);
  // The text that became safe to emit since the last call ("" when none).
  std::string TakeReady();
  // The generation ended: the text not emitted yet. `flush` (an end by length, not by a
  // stop or a cancel) also takes a character the decoder still holds incomplete.
  std::string TakeRest(bool flush);
  // The whole text so far (cut at a stop string).
  const std::string& text() const { return text_; }
  // After kStopString: the stop string that matched.
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  tokenizer::StreamDecoder decoder_;
  std::vector<int32_t> stop_ids_;  // sorted
  std::vector<std::string> stop_strings_;
  std::string text_;
  size_t emitted_ = 0;  // bytes of text_ already taken
  std::string matched_stop_;
};

}  // namespace attic::engine
