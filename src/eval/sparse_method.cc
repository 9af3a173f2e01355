// Sparse decoding on the methods axis (attic/eval/sparse_method.h).
#include "attic/eval/sparse_method.h"

#include <algorithm>
#include <cmath>

#include "attic/engine/sampler.h"

namespace attic::eval {

namespace {

// Whether the "@..." part of a sparse method's name sets `key`.
bool NameSetsKey(const std::string& name, const std::string& key) {
  const size_t at = name.find('@');
  if (at == std::string::npos) return false;
  size_t pos = at + 1;
  while (pos <= name.size()) {
    const size_t comma = std::min(name.find(',', pos), name.size());
    const std::string item = name.substr(pos, comma - pos);
    if (item.substr(0, item.find('=')) == key) return true;
    pos = comma + 1;
  }
  return false;
}

Status OneStep(engine::Engine& engine, kv::SequenceKv* seq, const int32_t* tokens, size_t n, bool want,
               pq::SparseAttention* hooks, std::vector<float>* logits) {
  std::vector<engine::BatchEntry> batch(1);
  batch[0].seq = seq;
  batch[0].tokens.assign(tokens, tokens + n);
  batch[0].want_logits = want;
  return engine.transformer().Forward(batch, logits, hooks);
}

}  // namespace

SparseDecodingMethod::SparseDecodingMethod(engine::Engine& engine, std::string name, pq::SparseOptions options)
    : engine_(engine), name_(std::move(name)), options_(options) {}

std::unique_ptr<pq::SparseAttention> SparseDecodingMethod::NewHooks() const {
  const auto& c = engine_.model().config();
  return pq::MakeSparseAttention(options_, engine::AttentionShapeOf(c), c.n_layers, engine_.threads());
}

Status SparseDecodingMethod::Prefill(const std::vector<int32_t>& tokens, size_t n, kv::SequenceKv* seq,
                                     pq::SparseAttention* hooks, std::vector<float>* last) {
  const size_t chunk = static_cast<size_t>(engine_.transformer().max_batch_tokens());
  for (size_t pos = 0; pos < n; pos += chunk) {
    const size_t end = std::min(n, pos + chunk);
    ATTIC_RETURN_IF_ERROR(OneStep(engine_, seq, tokens.data() + pos, end - pos, end == n, hooks, last));
  }
  return OkStatus();
}

Status SparseDecodingMethod::Score(const std::vector<int32_t>& tokens, int first_scored, std::vector<float>* logits) {
  const size_t n = tokens.size();
  ATTIC_RETURN_IF_ERROR(CheckScore(engine_, n, first_scored));
  auto hooks = NewHooks();
  kv::SequenceKv seq(&engine_.kv_pool());
  std::vector<float> row;
  ATTIC_RETURN_IF_ERROR(Prefill(tokens, static_cast<size_t>(first_scored), &seq, hooks.get(), &row));
  logits->assign(row.begin(), row.end());  // predicts tokens[first_scored]
  // Teacher forcing: token p enters at slot p; its output predicts tokens[p + 1].
  for (size_t p = static_cast<size_t>(first_scored); p + 1 < n; ++p) {
    ATTIC_RETURN_IF_ERROR(OneStep(engine_, &seq, tokens.data() + p, 1, true, hooks.get(), &row));
    logits->insert(logits->end(), row.begin(), row.end());
  }
  stats_ = hooks->stats();
  return OkStatus();
}

StatusOr<std::vector<int32_t>> SparseDecodingMethod::Greedy(const std::vector<int32_t>& prompt, int max_new) {
  if (prompt.empty()) return InvalidArgumentError("prompt is empty");
  ATTIC_RETURN_IF_ERROR(CheckFits(engine_, prompt.size() + static_cast<size_t>(std::max(0, max_new))));
  const int vocab = engine_.model().config().vocab_size;
  const auto& stops = engine_.stop_token_ids();
  auto hooks = NewHooks();
  kv::SequenceKv seq(&engine_.kv_pool());
  std::vector<float> logits;
  ATTIC_RETURN_IF_ERROR(Prefill(prompt, prompt.size(), &seq, hooks.get(), &logits));
  std::vector<int32_t> out;
  for (int i = 0; i < max_new; ++i) {
    const int32_t tok = engine::Argmax(logits.data(), vocab);
    if (std::find(stops.begin(), stops.end(), tok) != stops.end()) break;
    out.push_back(tok);
    if (i + 1 == max_new) break;
    ATTIC_RETURN_IF_ERROR(OneStep(engine_, &seq, &tok, 1, true, hooks.get(), &logits));
  }
  stats_ = hooks->stats();
  return out;
}

bool IsSparseMethodName(const std::string& name) {
  auto o = pq::ParseSparseOptions(name);
  return o.ok() && o->method != pq::SparseMethod::kFull;
}

StatusOr<std::unique_ptr<Method>> MakeSparseMethod(const std::string& name, engine::Engine& engine) {
  if (!IsSparseMethodName(name)) return NotFoundError("'" + name + "' is not a sparse method");
  ATTIC_ASSIGN_OR_RETURN(pq::SparseOptions o, pq::ParseSparseOptions(name));
  if (!NameSetsKey(name, "min")) o.min_slots = kEvalMinSlots;
  if (Status s = o.Validate(engine.model().config().head_dim); !s.ok()) {
    return InvalidArgumentError("method '" + name + "': " + s.message());
  }
  return std::unique_ptr<Method>(std::make_unique<SparseDecodingMethod>(engine, name, o));
}

}  // namespace attic::eval
