// Perplexity of a text under each method of the methods axis, and how far each method's
// next-token distributions are from full attention's (KL, top-1 agreement), at several
// window lengths. The protocol (docs/eval.md): the text is tokenized once, cut into
// non-overlapping windows of `length` tokens (BOS first), and every token of a window
// from index `score_from` on (1: every token after BOS) is scored.
//
// Thread-safety: drives the methods' engine; one thread at a time.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "attic/eval/method.h"
#include "attic/eval/metrics.h"

namespace attic::eval {

// Windows of `length` tokens cut from `text_tokens` (the text tokenized without BOS), in
// order, without overlap: with a BOS id (bos >= 0) window w is
//   [bos] + text_tokens[w * (length - 1), (w + 1) * (length - 1)),
// without one text_tokens[w * length, (w + 1) * length). A tail shorter than a window
// is dropped. At most max_windows windows (0 = all). REQUIRES: length >= 2.
std::vector<std::vector<int32_t>> MakeWindows(const std::vector<int32_t>& text_tokens, int32_t bos, int length,
                                              int max_windows);

// One point of the KV-type axis (`attic eval perplexity --kv-dtypes f32 f16 q8_0`): the
// compute buffer's element type, by name, and how the methods' engine is switched to it
// (the CLI: Engine::SetKvDtype).
struct KvTypePoint {
  std::string name;
  std::function<Status()> select;
};

struct MethodScores {
  std::string method;
  std::string kv_dtype;     // the KV-type axis point ("" without one)
  ScoreAccumulator scores;  // NLL of the true tokens; KL and top-1 against methods[0] on the same KV type
  // KL(the same method on the first KV type || this) and top-1 agreement with it, at the
  // same positions (0 and 1 on the first KV type itself; unused without a KV-type axis).
  ScoreAccumulator vs_reference_kv;
  double seconds = 0;  // spent in the method's Score calls
};

struct LengthResult {
  int length = 0;        // tokens per window, BOS included
  int first_scored = 1;  // index of the first scored token in each window
  int n_windows = 0;
  // Per KV type (in axis order; one pass without an axis), every method in methods-axis
  // order: methods[k * n_methods + m]. [0] is the reference of both axes.
  std::vector<MethodScores> methods;
};

// Scores every window under every method, on every point of `kv_types` (none: the
// engine as it is). methods[0] is the reference ("full"): KL(ref || method) and top-1
// agreement are measured against its logits at the same positions on the same KV type
// (for methods[0] itself they are 0 and 1 by definition). kv_types[0] is the reference
// KV type: each method on kv_types[k] is also measured against the same method on
// kv_types[0] (MethodScores::vs_reference_kv). A window runs on every KV type before the
// next one starts, so that only one window's logits are held. `progress(done, total)` is
// called after each window. REQUIRES: 1 <= first_scored < every window's size.
StatusOr<LengthResult> ScoreWindows(const std::vector<Method*>& methods,
                                    const std::vector<std::vector<int32_t>>& windows, int first_scored, int vocab,
                                    const std::function<void(int, int)>& progress = nullptr,
                                    const std::vector<KvTypePoint>& kv_types = {});

// One `attic eval perplexity` run, for its JSON and table.
struct PerplexityRun {
  std::string model;
  std::string text;         // path of the text file
  int64_t text_tokens = 0;  // tokens of the text scored from (without BOS; after --max-tokens)
  int score_from = 1;       // --score-from: index of the first scored token of a window
  std::vector<std::string> kv_dtypes;  // --kv-dtypes ([0]: the reference); empty without the axis
  std::vector<LengthResult> lengths;
};

nlohmann::json ToJson(const PerplexityRun& run);
// A markdown table: one row per (length, method), or per (length, KV type, method) with
// the KV-type axis (then also each row's perplexity change, KL and top-1 against the
// same method on the reference KV type).
std::string ToMarkdown(const PerplexityRun& run);

}  // namespace attic::eval
