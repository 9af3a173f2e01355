// `attic eval link`: linking separately prefilled chunks (paper 002's RQ1 and RQ4)
// measured against full attention. A prompt is a context of passages cut into chunks,
// then a query of new tokens and a continuation:
//
//   [BOS] chunk_o(0) chunk_o(1) ... chunk_o(N-1) query continuation
//
// where o is a chunk order (original, reversed, shuffled). Every method on the axis
// scores the query and the continuation under teacher forcing (KL vs full, perplexity,
// top-1 agreement) and decodes greedily after the query (agreement with full's greedy
// tokens; exact match for prompts that carry an answer, retriever-1m's pass keys).
// docs/eval.md ("Linking") defines every figure.
//
// Thread-safety: drives the methods' engine; one thread at a time.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "attic/core/status.h"
#include "attic/eval/method.h"
#include "attic/eval/metrics.h"
#include "attic/tokenizer/tokenizer.h"

namespace attic::eval {

// One prompt before splitting: the context's tokens (no BOS) with the places where a
// passage starts, the new tokens after the context, and the tokens to score.
struct LinkPrompt {
  std::string id;                     // where it comes from ("tinystories@4480", "musique#3")
  std::vector<int32_t> context;
  std::vector<int> passage_starts;    // ascending indices into context (0 first)
  std::string context_text;           // the context as text, passages apart by a blank line (`semantic` cuts it)
  std::vector<int32_t> query;         // new tokens: scored, computed by every method
  std::vector<int32_t> continuation;  // scored after the query
  std::string answer;                 // exact-match target of the greedy output ("" = none)
  int answer_tokens = 0;              // greedy tokens for the exact match
};

// Prompts from a text file tokenized once (no BOS): prompt p's context is the
// context_tokens tokens from p * (context_tokens + continuation_tokens) on, its
// continuation the continuation_tokens after them (the true text); no query. Passages
// start after every newline. At most n_prompts (fewer when the text runs out).
std::vector<LinkPrompt> TextPrompts(const std::vector<int32_t>& text_tokens, const tokenizer::Tokenizer& tok,
                                    int context_tokens, int continuation_tokens, int n_prompts);

// Prompts from MuSiQue records (LongBench's musique_s.json as CacheBlend ships it:
// [{ctxs: [{title, text}], question, answers}]): the passages' texts, each as its own
// passage, until context_tokens are filled (the last one cut); the query
// "Question: <question> Answer:"; the continuation "<first answer>" (each piece encoded on
// its own: with SentencePiece-style tokenizers every piece opens with a space). InvalidArgument
// for a file of another shape.
StatusOr<std::vector<LinkPrompt>> MusiquePrompts(const std::string& json_text, const tokenizer::Tokenizer& tok,
                                                 int context_tokens, int n_prompts);

// Prompts of pass-key retrieval (retriever-1m's format, needle.h): the filler with the
// needle as context (passages start at its sentences), the question as the query, the
// key ("48213.") as the continuation and the exact-match answer. Needle depths cycle
// through 0, 0.25, .., 1 over the prompts. `length`: prompt tokens with BOS, at most.
StatusOr<std::vector<LinkPrompt>> PassKeyPrompts(const tokenizer::Tokenizer& tok,
                                                 const std::vector<std::string>& haystack, int length,
                                                 int n_prompts, uint64_t seed);

// How a context is cut (paper 002's KVSplit).
//   fixed     runs of chunk_tokens tokens of prompt.context (the last one shorter)
//   sentence  chunks of prompt.context of at most chunk_tokens that end at the latest
//             passage start within reach, else at the latest sentence end (after a token
//             ending in . ! ? or a closing quote after one), else at chunk_tokens: the
//             same tokens as fixed, cut elsewhere
//   semantic  pic::SplitDocument's semantic cut of prompt.context_text (chunks of at
//             most chunk_tokens ending at the best of paragraph > line > sentence > word
//             boundaries): the text's own encoding, cut between tokens, so the context's
//             tokens are prompt.context wherever encoding the text gives those back
//             (MuSiQue: not quite, its passages were encoded one by one)
enum class LinkSplit { kFixed, kSentence, kSemantic };
const char* LinkSplitName(LinkSplit s);  // "fixed", "sentence", "semantic"
StatusOr<LinkSplit> ParseLinkSplit(std::string_view name);
// A context cut into chunks: its tokens (no BOS) and the chunks' places in them.
struct SplitContextResult {
  std::vector<int32_t> tokens;
  std::vector<ContextChunk> chunks;  // tile tokens, in order
};
// REQUIRES: chunk_tokens >= 1. semantic: SplitDocument's errors.
StatusOr<SplitContextResult> SplitContext(const LinkPrompt& prompt, const tokenizer::Tokenizer& tok, LinkSplit split,
                                          int chunk_tokens);

// Chunk orders: original, reversed, and shuffled (Fisher-Yates under SplitMix64(seed + prompt index)).
enum class ChunkOrder { kOriginal, kReversed, kShuffled };
const char* ChunkOrderName(ChunkOrder o);  // "original", "reversed", "shuffled"
StatusOr<ChunkOrder> ParseChunkOrder(std::string_view name);
std::vector<int> OrderChunks(int n_chunks, ChunkOrder order, uint64_t seed);

struct LinkEvalOptions {
  std::vector<LinkSplit> splits{LinkSplit::kFixed};
  int chunk_tokens = 64;
  std::vector<ChunkOrder> orders{ChunkOrder::kOriginal, ChunkOrder::kReversed, ChunkOrder::kShuffled};
  uint64_t seed = 1;      // the shuffled order
  int greedy_tokens = 32;  // G: greedy tokens compared with full's
};

// One method's figures over the prompts of one split (and one order, or all of them).
struct LinkCell {
  std::string split;
  std::string order;  // "all" for the aggregate over orders
  std::string method;
  ScoreAccumulator scores;    // windows = prompts x orders
  double greedy_agreement = 0;  // mean over prompts of common-prefix / max length vs full's
  int exact = 0, exact_of = 0;  // greedy exact matches (prompts with an answer)
  int64_t recomputed = 0, linked = 0;  // cached chunk tokens recomputed / linked
  double link_seconds = 0;    // summed first-token time (full: its prefill)
  int n_prompts = 0;          // prompts x orders
  int64_t n_chunks = 0;
};

struct LinkRun {
  std::string model;
  std::string source;  // text file, musique file or "passkey"
  std::string chunk_store_dtype = "f32";  // the chunks' KV read back as this store type's entries
  LinkEvalOptions options;
  int n_prompts = 0;
  std::vector<std::string> methods;
  std::vector<LinkCell> cells;  // per split: the aggregate rows, then per order
};

// Runs every prompt under every split, order and method. methods[0] is the reference.
// `progress` gets a line after each (split, order).
StatusOr<LinkRun> RunLinkEval(const std::vector<Method*>& methods, const tokenizer::Tokenizer& tok, int32_t bos,
                              const std::vector<LinkPrompt>& prompts, const LinkEvalOptions& options,
                              const std::function<void(const std::string&)>& progress = nullptr);

nlohmann::json ToJson(const LinkRun& run);
// Markdown: per split, one row per method (all orders), then KL vs full per order.
std::string ToMarkdown(const LinkRun& run);
// SVG: per split, KL vs full (log scale) against the share of chunk tokens recomputed.
std::string ToSvg(const LinkRun& run);

}  // namespace attic::eval
