#include "attic/eval/method.h"

#include <algorithm>
#include <functional>

#include "attic/engine/sampler.h"
#include "attic/eval/link_method.h"
#include "attic/eval/sparse_method.h"

namespace attic::eval {

Status CheckFits(const engine::Engine& engine, size_t n_tokens) {
  if (n_tokens > static_cast<size_t>(engine.context_length())) {
    return OutOfRangeError("a sequence of " + std::to_string(n_tokens) + " tokens exceeds the context window of " +
                           std::to_string(engine.context_length()) + " tokens (-c)");
  }
  return OkStatus();
}

namespace {

// One forward step of `seq` over tokens[begin, end): rows of logits for every new token
// when `all`, else for the last one only when `last`, else none.
Status Step(engine::Engine& engine, kv::SequenceKv* seq, const std::vector<int32_t>& tokens, size_t begin,
            size_t end, bool all, bool last, std::vector<float>* logits) {
  std::vector<engine::BatchEntry> batch(1);
  batch[0].seq = seq;
  batch[0].tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                         tokens.begin() + static_cast<std::ptrdiff_t>(end));
  batch[0].all_logits = all;
  batch[0].want_logits = last;
  return engine.transformer().Forward(batch, logits);
}

}  // namespace

Status CheckScore(const engine::Engine& engine, size_t n_tokens, int first_scored) {
  if (first_scored < 1 || static_cast<size_t>(first_scored) >= n_tokens) {
    return InvalidArgumentError("nothing to score: first scored token " + std::to_string(first_scored) + " of " +
                                std::to_string(n_tokens));
  }
  return CheckFits(engine, n_tokens);
}

Status FullAttention::Score(const std::vector<int32_t>& tokens, int first_scored, std::vector<float>* logits) {
  const size_t n = tokens.size();
  ATTIC_RETURN_IF_ERROR(CheckScore(engine_, n, first_scored));
  const int vocab = engine_.model().config().vocab_size;
  logits->clear();
  logits->reserve((n - static_cast<size_t>(first_scored)) * static_cast<size_t>(vocab));
  // The last token predicts nothing that is scored, so tokens [0, n-1) are run; the
  // output at position p predicts tokens[p + 1].
  const size_t n_run = n - 1;
  const size_t first_row = static_cast<size_t>(first_scored) - 1;  // position of the first wanted output
  const size_t chunk = static_cast<size_t>(engine_.transformer().max_batch_tokens());
  kv::SequenceKv seq(&engine_.kv_pool());  // released when it goes out of scope
  std::vector<float> rows;
  for (size_t pos = 0; pos < n_run; pos += chunk) {
    const size_t end = std::min(n_run, pos + chunk);
    const bool wanted = end > first_row;
    ATTIC_RETURN_IF_ERROR(Step(engine_, &seq, tokens, pos, end, wanted, false, &rows));
    if (!wanted) continue;
    const size_t skip = first_row > pos ? first_row - pos : 0;
    logits->insert(logits->end(), rows.begin() + static_cast<std::ptrdiff_t>(skip * vocab), rows.end());
  }
  return OkStatus();
}

StatusOr<std::vector<int32_t>> FullAttention::Greedy(const std::vector<int32_t>& prompt, int max_new) {
  if (prompt.empty()) return InvalidArgumentError("prompt is empty");
  ATTIC_RETURN_IF_ERROR(CheckFits(engine_, prompt.size() + static_cast<size_t>(std::max(0, max_new))));
  const int vocab = engine_.model().config().vocab_size;
  const auto& stops = engine_.stop_token_ids();
  kv::SequenceKv seq(&engine_.kv_pool());
  const size_t chunk = static_cast<size_t>(engine_.transformer().max_batch_tokens());
  std::vector<float> logits;
  for (size_t pos = 0; pos < prompt.size(); pos += chunk) {
    const size_t end = std::min(prompt.size(), pos + chunk);
    ATTIC_RETURN_IF_ERROR(Step(engine_, &seq, prompt, pos, end, false, end == prompt.size(), &logits));
  }
  std::vector<int32_t> out;
  for (int i = 0; i < max_new; ++i) {
    const int32_t tok = engine::Argmax(logits.data(), vocab);
    if (std::find(stops.begin(), stops.end(), tok) != stops.end()) break;
    out.push_back(tok);
    if (i + 1 == max_new) break;
    ATTIC_RETURN_IF_ERROR(Step(engine_, &seq, out, out.size() - 1, out.size(), false, true, &logits));
  }
  return out;
}

namespace {

using Factory = std::function<std::unique_ptr<Method>(engine::Engine&)>;

// The methods axis. Later approximations add a line here.
const std::vector<std::pair<std::string, Factory>>& Registry() {
  static const std::vector<std::pair<std::string, Factory>> registry = {
      {kReferenceMethod, [](engine::Engine& e) { return std::make_unique<FullAttention>(e); }},
  };
  return registry;
}

// Linked methods (link_method.h) and sparse decoding (sparse_method.h) are parametric
// families, listed by pattern.
const std::vector<std::string>& LinkedPatterns() {
  static const std::vector<std::string> patterns = {"naive[+bos]", "attnlink-K[+bos]", "cacheblend-R[@LAYER][+bos]",
                                                     "pq-R|N[@OPTS]", "oracle-R|N[@OPTS]", "streaming-R|N[@OPTS]",
                                                     "h2o-R|N[@OPTS]"};
  return patterns;
}

std::string KnownNames() {
  std::string s;
  for (const std::string& name : MethodNames()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

bool Known(const std::string& name) {
  for (const auto& [n, factory] : Registry())
    if (n == name) return true;
  return IsLinkedMethodName(name) || IsSparseMethodName(name);
}

}  // namespace

std::vector<std::string> MethodNames() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : Registry()) names.push_back(name);
  names.insert(names.end(), LinkedPatterns().begin(), LinkedPatterns().end());
  return names;
}

StatusOr<std::unique_ptr<Method>> MakeMethod(const std::string& name, engine::Engine& engine) {
  for (const auto& [n, factory] : Registry()) {
    if (n == name) return factory(engine);
  }
  if (IsLinkedMethodName(name)) return MakeLinkedMethod(name, engine);
  if (IsSparseMethodName(name)) return MakeSparseMethod(name, engine);
  return InvalidArgumentError("unknown method '" + name + "' (methods: " + KnownNames() + ")");
}

StatusOr<std::vector<std::string>> MethodsAxis(const std::vector<std::string>& names) {
  std::vector<std::string> axis{kReferenceMethod};
  for (const std::string& name : names) {
    if (!Known(name)) return InvalidArgumentError("unknown method '" + name + "' (methods: " + KnownNames() + ")");
    if (std::find(axis.begin(), axis.end(), name) == axis.end()) axis.push_back(name);
  }
  return axis;
}

}  // namespace attic::eval
