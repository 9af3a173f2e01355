#include "attic/engine/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attic/attention/attention.h"
#include "attic/backend/kernels.h"

namespace attic::engine {

namespace {

// Attention's view of one layer of the compute buffer (the block table is the caller's).
attention::KvLayerView KvView(kv::BlockPool& pool, int layer) {
  attention::KvLayerView v;
  if (pool.shape().dtype == DType::kF16) {
    v.k_f16 = static_cast<const uint16_t*>(pool.k_data(layer));
    v.v_f16 = static_cast<const uint16_t*>(pool.v_data(layer));
  } else {
    v.k_pool = static_cast<const float*>(pool.k_data(layer));
    v.v_pool = static_cast<const float*>(pool.v_data(layer));
  }
  v.block_stride = pool.shape().block_stride();
  v.block_size = pool.shape().block_size;
  return v;
}
float* F(AlignedBuffer& b) { return b.as<float>(); }
}  // namespace

Transformer::Transformer(const model::Model& model, backend::ThreadPool& pool, int max_batch_tokens, bool row_invariant)
    : model_(model),
      config_(model.config()),
      pool_(pool),
      rope_(model.config()),
      max_tokens_(max_batch_tokens),
      linear_mode_(row_invariant ? backend::LinearMode::kRowInvariant : backend::LinearMode::kFastest),
      attend_mode_(row_invariant ? attention::AttendMode::kRowInvariant : attention::AttendMode::kFastest) {
  const size_t t = static_cast<size_t>(max_tokens_);
  const auto& c = config_;
  x_.Resize(t * c.hidden_size * 4);
  xn_.Resize(t * c.hidden_size * 4);
  q_.Resize(t * c.q_dim() * 4);
  k_.Resize(t * c.kv_dim() * 4);
  v_.Resize(t * c.kv_dim() * 4);
  kr_.Resize(t * c.kv_dim() * 4);
  attn_.Resize(t * std::max(c.q_dim(), c.hidden_size) * 4);
  gate_.Resize(t * c.intermediate_size * 4);
  up_.Resize(t * c.intermediate_size * 4);
  kv_end_.resize(t);
}

kv::KvShape Transformer::kv_shape(int block_size) const {
  kv::KvShape s;
  s.n_layers = config_.n_layers;
  s.n_kv_heads = config_.n_kv_heads;
  s.head_dim = config_.head_dim;
  s.block_size = block_size;
  return s;
}

Status Transformer::Forward(std::vector<BatchEntry>& batch, std::vector<float>* logits, const KvObserver& observer) {
  ATTIC_RETURN_IF_ERROR(Begin(batch));
  for (int l = 0; l < config_.n_layers; ++l) Layer(l, observer);
  Finish(logits);
  return OkStatus();
}

Status Transformer::Begin(std::vector<BatchEntry>& batch) {
  int n_rows = 0;
  for (auto& e : batch) {
    if (e.seq == nullptr || e.tokens.empty()) return InvalidArgumentError("batch entry without sequence or tokens");
    if (!e.positions.empty() && e.positions.size() != e.tokens.size()) {
      return InvalidArgumentError("batch entry positions/tokens size mismatch");
    }
    for (int32_t t : e.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return InvalidArgumentError("token id " + std::to_string(t) + " outside the vocabulary [0, " +
                                    std::to_string(config_.vocab_size) + ")");
      }
    }
    n_rows += static_cast<int>(e.tokens.size());
  }
  if (n_rows > max_tokens_) {
    return InvalidArgumentError("step of " + std::to_string(n_rows) + " tokens exceeds max_batch_tokens " +
                                std::to_string(max_tokens_));
  }
  // Reserve slots for every entry; roll back on failure so no sequence changes.
  std::vector<int> first_slot(batch.size());
  std::vector<std::vector<int32_t>> pos(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& e = batch[i];
    first_slot[i] = e.seq->n_slots();
    if (e.positions.empty()) {
      int32_t p0 = e.seq->n_slots() == 0 ? 0 : e.seq->positions().back() + 1;
      pos[i].resize(e.tokens.size());
      for (size_t j = 0; j < e.tokens.size(); ++j) pos[i][j] = p0 + static_cast<int32_t>(j);
    } else {
      pos[i] = e.positions;
    }
    Status st = e.seq->Append(e.tokens.data(), pos[i].data(), static_cast<int>(e.tokens.size()));
    if (!st.ok()) {
      for (size_t j = 0; j < i; ++j) batch[j].seq->Truncate(first_slot[j]);
      return st;
    }
  }
  batch_ = &batch;
  n_rows_ = n_rows;
  entry_offset_.assign(batch.size(), 0);
  entry_first_slot_ = first_slot;
  positions_.clear();
  int row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    entry_offset_[i] = row;
    positions_.insert(positions_.end(), pos[i].begin(), pos[i].end());
    for (size_t j = 0; j < batch[i].tokens.size(); ++j, ++row) {
      kv_end_[row] = first_slot[i] + static_cast<int>(j) + 1;
    }
  }
  // Embed.
  const int hidden = config_.hidden_size;
  row = 0;
  for (auto& e : batch) {
    for (int32_t t : e.tokens) backend::EmbeddingRow(model_.weights().tok_embeddings, t, F(x_) + static_cast<int64_t>(row++) * hidden);
  }
  return OkStatus();
}

void Transformer::Layer(int layer, const KvObserver& observer) {
  const auto& c = config_;
  const auto& w = model_.weights().layers[layer];
  const int64_t n = n_rows_;
  const int hidden = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();
  float* x = F(x_);
  float* xn = F(xn_);
  float* q = F(q_);
  float* k = F(k_);
  float* v = F(v_);
  float* kr = F(kr_);
  float* attn = F(attn_);

  // Attention block.
  backend::RmsNorm(pool_, x, w.attn_norm, n, hidden, c.rms_norm_eps, xn);
  const backend::LinearOutput qkv[] = {{&w.wq, w.bq, q}, {&w.wk, w.bk, k}, {&w.wv, w.bv, v}};
  backend::LinearMulti(pool_, xn, n, qkv, 3, linear_mode_);
  auto& batch = *batch_;
  if (observer) {
    for (size_t i = 0; i < batch.size(); ++i) {
      int off = entry_offset_[i];
      observer(layer, static_cast<int>(i), k + static_cast<int64_t>(off) * kvd, v + static_cast<int64_t>(off) * kvd,
               static_cast<int>(batch[i].tokens.size()));
    }
  }
  std::memcpy(kr, k, static_cast<size_t>(n) * kvd * 4);
  rope_.Apply(q, n, c.n_heads, positions_.data());
  rope_.Apply(kr, n, c.n_kv_heads, positions_.data());

  attention::AttentionShape shape;
  shape.n_heads = c.n_heads;
  shape.n_kv_heads = c.n_kv_heads;
  shape.head_dim = c.head_dim;
  shape.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // All sequences' attention in one parallel pass (continuous batching's decode steps
  // are one row each: too small to keep the pool busy one sequence at a time).
  requests_.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& e = batch[i];
    const int off = entry_offset_[i];
    const int nt = static_cast<int>(e.tokens.size());
    e.seq->WriteKv(layer, entry_first_slot_[i], nt, kr + static_cast<int64_t>(off) * kvd,
                   v + static_cast<int64_t>(off) * kvd);
    attention::AttendRequest& r = requests_[i];
    r.q = q + static_cast<int64_t>(off) * qd;
    r.n_q = nt;
    r.kv_end = kv_end_.data() + off;
    r.indices = nullptr;
    r.n_indices = 0;
    r.kv = KvView(*e.seq->pool(), layer);
    r.kv.block_table = e.seq->block_table().data();
    r.kv.n_slots = e.seq->n_slots();
    r.out = attn + static_cast<int64_t>(off) * qd;
  }
  attention::AttendBatch(pool_, shape, requests_.data(), static_cast<int>(requests_.size()), attend_mode_);
  backend::Linear(pool_, attn, n, w.wo, nullptr, xn, linear_mode_);
  backend::Add(x, xn, n * hidden);

  // Feed-forward block.
  float* gate = F(gate_);
  float* up = F(up_);
  backend::RmsNorm(pool_, x, w.ffn_norm, n, hidden, c.rms_norm_eps, xn);
  const backend::LinearOutput gate_up[] = {{&w.w_gate, nullptr, gate}, {&w.w_up, nullptr, up}};
  backend::LinearMulti(pool_, xn, n, gate_up, 2, linear_mode_);
  backend::SiluMul(pool_, gate, up, n * c.intermediate_size);
  backend::Linear(pool_, gate, n, w.w_down, nullptr, xn, linear_mode_);
  backend::Add(x, xn, n * hidden);
}

void Transformer::Finish(std::vector<float>* logits) {
  const auto& c = config_;
  auto& batch = *batch_;
  const int hidden = c.hidden_size;
  int n_out = 0;
  float* rows = F(xn_);
  for (size_t i = 0; i < batch.size(); ++i) {
    const int n_tokens = static_cast<int>(batch[i].tokens.size());
    const int n_rows = batch[i].all_logits ? n_tokens : batch[i].want_logits ? 1 : 0;
    const int first = entry_offset_[i] + n_tokens - n_rows;
    std::memcpy(rows + static_cast<int64_t>(n_out) * hidden, F(x_) + static_cast<int64_t>(first) * hidden,
                 static_cast<size_t>(n_rows) * hidden * 4);
    n_out += n_rows;
  }
  if (logits != nullptr) {
    logits->resize(static_cast<size_t>(n_out) * c.vocab_size);
    if (n_out > 0) {
      backend::RmsNorm(pool_, rows, model_.weights().final_norm, n_out, hidden, c.rms_norm_eps, rows);
      backend::Linear(pool_, rows, n_out, model_.weights().lm_head, nullptr, logits->data(), linear_mode_);
    }
  }
  batch_ = nullptr;
}

void Transformer::EnterKv(kv::SequenceKv* seq, int layer, int first, int n, const float* k_pre_rope, const float* v) {
  const int kvd = config_.kv_dim();
  enter_k_.Reserve(static_cast<size_t>(n) * kvd * 4);
  float* k = F(enter_k_);
  std::memcpy(k, k_pre_rope, static_cast<size_t>(n) * kvd * 4);
  rope_.Apply(k, n, config_.n_kv_heads, seq->positions().data() + first);
  seq->WriteKv(layer, first, n, k, v);
}

}  // namespace attic::engine
