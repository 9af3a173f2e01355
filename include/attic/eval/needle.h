// Needle in a haystack: a fact hidden at a chosen depth of natural filler text, asked for
// at the end, answered by greedy decoding, scored by exact match of its digits. A grid
// of prompt lengths x depths x trials, for every needle kind and method (docs/eval.md).
//
// Needles follow retriever-1m's training format (../shared/models/retriever-1m/README.md):
//   pass key:    "The pass key is 48213. Remember it. 48213 is the pass key."
//                ... "What is the pass key? The pass key is"        -> " 48213"
//   named fact:  "Mira's number is 7051."
//                ... "What is Mira's number? Mira's number is"      -> " 7051"
// Prompts are text -- filler sentences, the needle and the question joined by single
// spaces (so every sentence starts with a space, as that model saw them) -- tokenized
// once, BOS first. Keys, names and where the filler starts are drawn from the seed and
// the trial number only: the same for every length, depth and method.
//
// Thread-safety: plain functions; RunNeedleGrid drives the methods' engine.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "attic/eval/method.h"
#include "attic/tokenizer/tokenizer.h"

namespace attic::eval {

enum class NeedleKind { kPassKey, kNamedFact };

const char* NeedleKindName(NeedleKind kind);  // "passkey", "fact"
StatusOr<NeedleKind> ParseNeedleKind(const std::string& name);

// Sentences of filler text from `path`: a text file, or a directory whose *.txt files
// are read in name order. Whitespace runs become single spaces; a sentence ends after
// '.', '!' or '?' followed by a space. NotFound for a missing path, InvalidArgument when
// it holds no text.
StatusOr<std::vector<std::string>> LoadHaystack(const std::string& path);

struct Needle {
  NeedleKind kind = NeedleKind::kPassKey;
  std::string sentence;  // hidden in the filler
  std::string question;  // ends the prompt; the model continues it with the answer
  std::string answer;    // the digits a correct continuation starts with
};

// The needle of `trial` under `seed`: a 5-digit pass key, or a name and a 4-digit number.
Needle MakeNeedle(NeedleKind kind, uint64_t seed, int trial);

// Tokens greedily decoded after a needle prompt: the answer's digits (one token each at
// worst) plus room for a leading space token and one digit too many.
int AnswerTokens(const Needle& needle);
// The most AnswerTokens() of any needle: the context a prompt of L tokens needs is L + this.
inline constexpr int kMaxAnswerTokens = 8;

struct NeedlePrompt {
  std::vector<int32_t> tokens;  // BOS (when the tokenizer adds one) + filler with the needle + question
  int filler_sentences = 0;     // whole filler sentences, from haystack[start] on
  int lead_in_words = 0;        // words of the text before haystack[start] that open the filler
  int needle_after = 0;         // filler pieces (the lead-in, then sentences) before the needle
  int needle_token = 0;         // index of the needle's first token (approximate: the
                                // text before it tokenized on its own)
  double depth = 0;             // filler tokens before the needle / all filler tokens
};

// The longest prompt of at most `length` tokens. The filler is a lead-in of whole words
// (the end of the text before haystack[start]: it makes the length exact to a word),
// then whole sentences from haystack[start] on, wrapping round. The needle goes at the
// piece boundary nearest to `depth` of the filler's tokens (0: first, right after BOS;
// 1: last, just before the question); the question ends the prompt. InvalidArgument
// when not even the needle and the question fit.
StatusOr<NeedlePrompt> BuildNeedlePrompt(const tokenizer::Tokenizer& tok, const std::vector<std::string>& haystack,
                                         size_t start, const Needle& needle, int length, double depth);

struct NeedleOptions {
  std::vector<int> lengths{512, 1024, 2048};          // prompt lengths in tokens (at most)
  std::vector<double> depths{0, 0.25, 0.5, 0.75, 1};  // needle depth in the filler, 0..1
  std::vector<NeedleKind> kinds{NeedleKind::kPassKey, NeedleKind::kNamedFact};
  int trials = 5;     // prompts per cell: different keys and filler
  uint64_t seed = 1;  // keys, names and filler starts
};

// One prompt under one method.
struct NeedleTrial {
  NeedleKind kind = NeedleKind::kPassKey;
  int length = 0;
  double depth = 0;  // asked for
  int trial = 0;
  std::string method;
  int n_tokens = 0;          // prompt tokens
  double actual_depth = 0;   // NeedlePrompt::depth
  std::string answer;        // expected digits
  std::string output;        // the greedy continuation's text
  bool correct = false;
};

struct NeedleRun {
  std::string model;
  std::string haystack;  // path
  int trained_length = 0;  // the model's max_position_embeddings
  NeedleOptions options;
  std::vector<std::string> methods;
  std::vector<NeedleTrial> trials;
};

// Runs every (kind, length, depth, trial) prompt under every method. `progress` gets a
// line of text after each length.
StatusOr<NeedleRun> RunNeedleGrid(const std::vector<Method*>& methods, const tokenizer::Tokenizer& tok,
                                  const std::vector<std::string>& haystack, const NeedleOptions& options,
                                  const std::function<void(const std::string&)>& progress = nullptr);

// The correct continuation's digits: true when `output`, after leading whitespace, starts
// with exactly `answer` and no further digit.
bool ExactMatch(const std::string& output, const std::string& answer);

// Exact-match rate of a cell (method, kind, length, depth); NaN for a cell with no trials.
double CellAccuracy(const NeedleRun& run, const std::string& method, NeedleKind kind, int length, double depth);

nlohmann::json ToJson(const NeedleRun& run);
// Markdown: a table per (method, kind), depths down, lengths across.
std::string ToMarkdown(const NeedleRun& run);
// SVG heatmap: a panel per (method, kind), depths down, lengths across, exact-match rate
// as colour (red 0 .. green 1) and as a number.
std::string ToSvg(const NeedleRun& run);

}  // namespace attic::eval
