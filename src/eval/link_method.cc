// Linked methods on the methods axis (attic/eval/link_method.h).
#include "attic/eval/link_method.h"

#include <algorithm>
#include <chrono>

#include "attic/attention/kv_q8.h"
#include "attic/engine/sampler.h"
#include "attic/store/entry.h"

namespace attic::eval {

namespace {

// A chunk's pre-RoPE K and V at every layer: k[l], v[l] are [n_rows, kv_dim].
struct ChunkKv {
  std::vector<std::vector<float>> k, v;
};

// Prefills `tokens` on a sequence of its own from position 0 and returns every layer's
// pre-RoPE K and V (the sequence's KV is released before it returns).
StatusOr<ChunkKv> PrefillAlone(engine::Engine& engine, const std::vector<int32_t>& tokens) {
  const int n_layers = engine.model().config().n_layers;
  const size_t kvd = static_cast<size_t>(engine.model().config().kv_dim());
  ChunkKv out;
  out.k.resize(static_cast<size_t>(n_layers));
  out.v.resize(static_cast<size_t>(n_layers));
  kv::KvObserverHooks observe([&](int layer, int, const float* k, const float* v, int n_rows) {
    out.k[layer].insert(out.k[layer].end(), k, k + n_rows * kvd);
    out.v[layer].insert(out.v[layer].end(), v, v + n_rows * kvd);
  });
  kv::SequenceKv seq(&engine.kv_pool());
  const size_t step = static_cast<size_t>(engine.transformer().max_batch_tokens());
  std::vector<float> unused;
  for (size_t pos = 0; pos < tokens.size(); pos += step) {
    std::vector<engine::BatchEntry> batch(1);
    batch[0].seq = &seq;
    batch[0].tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(pos),
                           tokens.begin() + static_cast<std::ptrdiff_t>(std::min(tokens.size(), pos + step)));
    batch[0].want_logits = false;
    ATTIC_RETURN_IF_ERROR(engine.transformer().Forward(batch, &unused, &observe));
  }
  return out;
}

}  // namespace

LinkedMethod::LinkedMethod(engine::Engine& engine, std::string name, pic::LinkOptions options, bool chunk_bos)
    : engine_(engine), name_(std::move(name)), options_(options), chunk_bos_(chunk_bos) {}

StatusOr<std::vector<ContextChunk>> LinkedMethod::ChunksFor(const std::vector<int32_t>& tokens, int n_prompt) const {
  if (chunks_.empty()) {
    // The default cut: fixed runs after the BOS.
    const int32_t bos = engine_.tokenizer().add_bos() ? engine_.tokenizer().bos_id() : -1;
    const int start = (bos >= 0 && !tokens.empty() && tokens[0] == bos) ? 1 : 0;
    std::vector<ContextChunk> cut;
    for (int b = start; b < n_prompt; b += kDefaultChunkTokens) cut.push_back({b, std::min(kDefaultChunkTokens, n_prompt - b)});
    return cut;
  }
  int end = 0;
  for (const ContextChunk& c : chunks_) {
    if (c.n < 1 || c.begin < end || c.begin + c.n > n_prompt) {
      return InvalidArgumentError("chunks must be non-empty, ascending, disjoint and inside the context of " +
                                  std::to_string(n_prompt) + " tokens");
    }
    end = c.begin + c.n;
  }
  return chunks_;
}

Status LinkedMethod::Link(const std::vector<int32_t>& tokens, int n_prompt, kv::SequenceKv* seq,
                          std::vector<float>* last) {
  ATTIC_ASSIGN_OR_RETURN(std::vector<ContextChunk> chunks, ChunksFor(tokens, n_prompt));
  const int n_layers = engine_.model().config().n_layers;
  const size_t kvd = static_cast<size_t>(engine_.model().config().kv_dim());
  const int32_t bos = engine_.tokenizer().bos_id();
  const int src_row = chunk_bos_ ? 1 : 0;  // the chunk's first token's row in its own prefill

  // The chunk store type's group (store::RoundTripRows).
  const int group =
      store::KvDtypeQuantized(chunk_dtype_) ? attention::KvQ8Group(engine_.model().config().head_dim) : 0;

  // 1. Each chunk on its own, from position 0 (what the context cache holds).
  std::vector<ChunkKv> cached;
  for (const ContextChunk& c : chunks) {
    std::vector<int32_t> alone(static_cast<size_t>(c.n) + (chunk_bos_ ? 1 : 0), bos);
    std::copy(tokens.begin() + c.begin, tokens.begin() + c.begin + c.n, alone.begin() + (chunk_bos_ ? 1 : 0));
    ATTIC_ASSIGN_OR_RETURN(ChunkKv kv, PrefillAlone(engine_, alone));
    // What an entry of the cache's type gives back for the chunk's rows (the rows its
    // entry holds: from src_row on).
    for (int l = 0; l < n_layers; ++l) {
      store::RoundTripRows(chunk_dtype_, false, c.n, static_cast<int>(kvd), group, kv.k[l].data() + src_row * kvd);
      store::RoundTripRows(chunk_dtype_, true, c.n, static_cast<int>(kvd), group, kv.v[l].data() + src_row * kvd);
    }
    cached.push_back(std::move(kv));
  }

  // 2. Every slot of the prompt at its position; the chunks' KV entered at theirs.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> positions(static_cast<size_t>(n_prompt));
  for (int i = 0; i < n_prompt; ++i) positions[i] = i;
  ATTIC_RETURN_IF_ERROR(seq->Append(tokens.data(), positions.data(), n_prompt));
  engine::Transformer& tf = engine_.transformer();
  std::vector<pic::LinkedChunk> present;
  linked_ = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ContextChunk& c = chunks[i];
    for (int l = 0; l < n_layers; ++l) {
      tf.EnterKv(seq, l, c.begin, c.n, cached[i].k[l].data() + src_row * kvd, cached[i].v[l].data() + src_row * kvd);
    }
    present.push_back({c.begin, c.n, "chunk", src_row});
    linked_ += c.n;
  }

  // 3. The method's slots recomputed in place, in slot order (pic::LinkRun, as the
  // scheduler does).
  pic::LinkRun link(options_, present, 0, n_prompt, seq);
  link.set_entry(0);
  const std::vector<int32_t>& slots = link.compute_slots();
  const size_t step = static_cast<size_t>(tf.max_batch_tokens());
  for (size_t i = 0; i < slots.size(); i += step) {
    const size_t end = std::min(slots.size(), i + step);
    std::vector<engine::BatchEntry> batch(1);
    batch[0].seq = seq;
    batch[0].slots.assign(slots.begin() + static_cast<std::ptrdiff_t>(i), slots.begin() + static_cast<std::ptrdiff_t>(end));
    for (int32_t s : batch[0].slots) batch[0].tokens.push_back(tokens[s]);
    batch[0].positions = batch[0].slots;  // slot s sits at position s
    batch[0].want_logits = end == slots.size();  // the last slot is always computed
    ATTIC_RETURN_IF_ERROR(tf.Forward(batch, last, link.hooks()));
  }
  link_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  recomputed_ = link.recomputed();
  return OkStatus();
}

Status LinkedMethod::Score(const std::vector<int32_t>& tokens, int first_scored, std::vector<float>* logits) {
  const size_t n = tokens.size();
  ATTIC_RETURN_IF_ERROR(CheckScore(engine_, n, first_scored));
  kv::SequenceKv seq(&engine_.kv_pool());
  ATTIC_RETURN_IF_ERROR(Link(tokens, first_scored, &seq, logits));
  // Teacher forcing: tokens [first_scored, n-1) appended; each row predicts the next.
  const size_t step = static_cast<size_t>(engine_.transformer().max_batch_tokens());
  std::vector<float> rows;
  for (size_t pos = static_cast<size_t>(first_scored); pos + 1 < n; pos += step) {
    std::vector<engine::BatchEntry> batch(1);
    batch[0].seq = &seq;
    batch[0].tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(pos),
                           tokens.begin() + static_cast<std::ptrdiff_t>(std::min(n - 1, pos + step)));
    batch[0].all_logits = true;
    ATTIC_RETURN_IF_ERROR(engine_.transformer().Forward(batch, &rows));
    logits->insert(logits->end(), rows.begin(), rows.end());
  }
  return OkStatus();
}

StatusOr<std::vector<int32_t>> LinkedMethod::Greedy(const std::vector<int32_t>& prompt, int max_new) {
  if (prompt.empty()) return InvalidArgumentError("prompt is empty");
  ATTIC_RETURN_IF_ERROR(CheckFits(engine_, prompt.size() + static_cast<size_t>(std::max(0, max_new))));
  const int vocab = engine_.model().config().vocab_size;
  const auto& stops = engine_.stop_token_ids();
  kv::SequenceKv seq(&engine_.kv_pool());
  std::vector<float> logits;
  ATTIC_RETURN_IF_ERROR(Link(prompt, static_cast<int>(prompt.size()), &seq, &logits));
  std::vector<int32_t> out;
  for (int i = 0; i < max_new; ++i) {
    const int32_t tok = engine::Argmax(logits.data(), vocab);
    if (std::find(stops.begin(), stops.end(), tok) != stops.end()) break;
    out.push_back(tok);
    if (i + 1 == max_new) break;
    std::vector<engine::BatchEntry> batch(1);
    batch[0].seq = &seq;
    batch[0].tokens = {tok};
    ATTIC_RETURN_IF_ERROR(engine_.transformer().Forward(batch, &logits));
  }
  return out;
}

bool IsLinkedMethodName(const std::string& name) {
  std::string base = name;
  if (base.size() > std::string(kBosSuffix).size() && base.ends_with(kBosSuffix))
    base.resize(base.size() - std::string(kBosSuffix).size());
  auto o = pic::ParseLinkOptions(base);
  return o.ok() && o->method != pic::LinkMethod::kFull;
}

StatusOr<std::unique_ptr<Method>> MakeLinkedMethod(const std::string& name, engine::Engine& engine) {
  if (!IsLinkedMethodName(name)) return NotFoundError("'" + name + "' is not a linked method");
  const bool bos = name.ends_with(kBosSuffix);
  const std::string base = bos ? name.substr(0, name.size() - std::string(kBosSuffix).size()) : name;
  ATTIC_ASSIGN_OR_RETURN(pic::LinkOptions o, pic::ParseLinkOptions(base));
  ATTIC_RETURN_IF_ERROR(o.Validate(engine.model().config().n_layers));
  if (bos && !(engine.tokenizer().add_bos() && engine.tokenizer().bos_id() >= 0))
    return InvalidArgumentError("method '" + name + "': the model's tokenizer has no BOS token to prefill chunks after");
  return std::unique_ptr<Method>(std::make_unique<LinkedMethod>(engine, name, o, bos));
}

}  // namespace attic::eval
