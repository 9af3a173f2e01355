#include "attic/engine/transformer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "attic/attention/attention.h"
#include "attic/backend/kernels.h"
#include "attic/kv/enter_rows.h"

namespace attic::engine {

namespace {

// Attention's view of one layer of the compute buffer (the block table is the caller's).
attention::KvLayerView KvView(kv::BlockPool& pool, int layer) {
  return kv::LayerView(pool.shape(), pool.k_data(layer), pool.v_data(layer));
}
float* F(AlignedBuffer& b) { return b.as<float>(); }
}  // namespace

attention::AttentionShape AttentionShapeOf(const model::ModelConfig& c) {
  attention::AttentionShape shape;
  shape.n_heads = c.n_heads;
  shape.n_kv_heads = c.n_kv_heads;
  shape.head_dim = c.head_dim;
  shape.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  return shape;
}

Status CheckTokenIds(const model::ModelConfig& config, std::span<const int32_t> tokens) {
  for (int32_t t : tokens) {
    if (t < 0 || t >= config.vocab_size) {
      return InvalidArgumentError("token id " + std::to_string(t) + " outside the vocabulary [0, " +
                                  std::to_string(config.vocab_size) + ")");
    }
  }
  return OkStatus();
}

backend::ModelLinears LinearsOf(model::Model& model) {
  backend::ModelLinears out;
  model::ModelWeights& w = model.mutable_weights();
  for (model::LayerWeights& l : w.layers)
    out.layers.push_back({&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down});
  out.lm_head = &w.lm_head;
  out.own = [&model](std::shared_ptr<void> memory) { model.Own(std::move(memory)); };
  return out;
}

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

Status Transformer::Forward(std::vector<BatchEntry>& batch, std::vector<float>* logits, kv::LayerHooks* hooks) {
  ATTIC_RETURN_IF_ERROR(Begin(batch));
  for (int l = 0; l < config_.n_layers; ++l) Layer(l, hooks);
  Finish(logits);
  return OkStatus();
}

namespace {

// An entry's `slots` against its sequence: in range, no duplicates, appended slots
// exactly n_slots, n_slots + 1, ... Returns how many slots it appends.
StatusOr<int> CheckSlots(const BatchEntry& e) {
  if (e.slots.size() != e.tokens.size()) return InvalidArgumentError("batch entry slots/tokens size mismatch");
  if (e.positions.empty()) return InvalidArgumentError("batch entry names slots but no positions");
  const int n_slots = e.seq->n_slots();
  std::vector<int32_t> sorted = e.slots;
  std::sort(sorted.begin(), sorted.end());
  const int n_append = static_cast<int>(sorted.end() - std::lower_bound(sorted.begin(), sorted.end(), n_slots));
  for (size_t j = 0; j < sorted.size(); ++j) {
    if (sorted[j] < 0 || sorted[j] >= n_slots + n_append) {
      return InvalidArgumentError("slot " + std::to_string(sorted[j]) + " outside the sequence's " +
                                  std::to_string(n_slots) + " slots and the " + std::to_string(n_append) +
                                  " appended after them (appended slots must follow the last one without gaps)");
    }
    if (j > 0 && sorted[j] == sorted[j - 1]) {
      return InvalidArgumentError("slot " + std::to_string(sorted[j]) + " written twice in one step");
    }
  }
  return n_append;
}

}  // namespace

Status Transformer::Begin(std::vector<BatchEntry>& batch) {
  int n_rows = 0;
  bool any_slots = false;
  std::vector<int> n_append(batch.size());  // with slots: how many the entry appends
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& e = batch[i];
    if (e.seq == nullptr || e.tokens.empty()) return InvalidArgumentError("batch entry without sequence or tokens");
    if (!e.positions.empty() && e.positions.size() != e.tokens.size()) {
      return InvalidArgumentError("batch entry positions/tokens size mismatch");
    }
    ATTIC_RETURN_IF_ERROR(CheckTokenIds(config_, e.tokens));
    for (int32_t p : e.positions) {
      if (p < 0) return InvalidArgumentError("negative position " + std::to_string(p));
    }
    if (!e.slots.empty()) {
      ATTIC_ASSIGN_OR_RETURN(n_append[i], CheckSlots(e));
      any_slots = true;
    }
    n_rows += static_cast<int>(e.tokens.size());
  }
  if (n_rows > max_tokens_) {
    return InvalidArgumentError("step of " + std::to_string(n_rows) + " tokens exceeds max_batch_tokens " +
                                std::to_string(max_tokens_));
  }
  if (any_slots) {
    std::vector<const kv::SequenceKv*> seqs;
    for (const auto& e : batch) seqs.push_back(e.seq);
    std::sort(seqs.begin(), seqs.end());
    if (std::adjacent_find(seqs.begin(), seqs.end()) != seqs.end()) {
      return InvalidArgumentError("a sequence appears in two entries of a step that names slots");
    }
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
    Status st;
    if (e.slots.empty()) {
      st = e.seq->Append(e.tokens.data(), pos[i].data(), static_cast<int>(e.tokens.size()));
    } else {
      // The appended slots' tokens and positions, in slot order.
      std::vector<int32_t> tok(n_append[i]), p(n_append[i]);
      for (size_t j = 0; j < e.slots.size(); ++j) {
        const int32_t k = e.slots[j] - first_slot[i];
        if (k < 0) continue;
        tok[k] = e.tokens[j];
        p[k] = pos[i][j];
      }
      if (n_append[i] > 0) st = e.seq->Append(tok.data(), p.data(), n_append[i]);
    }
    if (!st.ok()) {
      for (size_t j = 0; j < i; ++j) batch[j].seq->Truncate(first_slot[j]);
      return st;
    }
  }
  // Every reservation held: record the in-place slots' new tokens and positions.
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& e = batch[i];
    for (size_t j = 0; j < e.slots.size(); ++j) {
      if (e.slots[j] < first_slot[i]) e.seq->SetSlot(e.slots[j], e.tokens[j], pos[i][j]);
    }
  }
  batch_ = &batch;
  n_rows_ = n_rows;
  entry_offset_.assign(batch.size(), 0);
  entry_rows_.assign(batch.size(), 0);
  positions_.clear();
  row_slot_.resize(n_rows);
  row_token_.resize(n_rows);
  int row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& e = batch[i];
    entry_offset_[i] = row;
    entry_rows_[i] = static_cast<int>(e.tokens.size());
    positions_.insert(positions_.end(), pos[i].begin(), pos[i].end());
    for (size_t j = 0; j < e.tokens.size(); ++j, ++row) {
      row_slot_[row] = e.slots.empty() ? first_slot[i] + static_cast<int>(j) : e.slots[j];
      row_token_[row] = static_cast<int32_t>(j);
      kv_end_[row] = row_slot_[row] + 1;
    }
  }
  BuildRuns();
  // Embed.
  const int hidden = config_.hidden_size;
  row = 0;
  for (auto& e : batch) {
    for (int32_t t : e.tokens) backend::EmbeddingRow(model_.weights().tok_embeddings, t, F(x_) + static_cast<int64_t>(row++) * hidden);
  }
  return OkStatus();
}

void Transformer::BuildRuns() {
  runs_.clear();
  run_begin_.resize(entry_offset_.size() + 1);
  for (size_t i = 0; i < entry_offset_.size(); ++i) {
    run_begin_[i] = static_cast<int>(runs_.size());
    const int r0 = entry_offset_[i], r1 = r0 + entry_rows_[i];
    for (int r = r0; r < r1; ++r) {
      if (r > r0 && row_slot_[r] == runs_.back().slot + runs_.back().n) {
        ++runs_.back().n;
      } else {
        runs_.push_back(SlotRun{r, row_slot_[r], 1});
      }
    }
  }
  run_begin_[entry_offset_.size()] = static_cast<int>(runs_.size());
}

kv::EntryRows Transformer::Rows(int entry) const {
  const int off = entry_offset_[entry];
  kv::EntryRows r;
  r.entry = entry;
  r.n_rows = entry_rows_[entry];
  r.rows = row_token_.data() + off;
  r.slots = row_slot_.data() + off;
  r.positions = positions_.data() + off;
  return r;
}

const char* StepPhases::Name(int phase) {
  static const char* const kNames[kCount] = {"norm_qkv", "rope_kv", "attention", "out", "ffn_gate_up", "ffn_down", "logits"};
  return phase >= 0 && phase < kCount ? kNames[phase] : "?";
}

namespace {

// Adds the time since the previous mark to a phase; does nothing without StepPhases.
class PhaseClock {
 public:
  explicit PhaseClock(StepPhases* phases) : phases_(phases) {
    if (phases_ != nullptr) last_ = std::chrono::steady_clock::now();
  }
  void Mark(StepPhases::Phase phase) {
    if (phases_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    phases_->seconds[phase] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  StepPhases* phases_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace

void Transformer::Layer(int layer, kv::LayerHooks* hooks) {
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
  auto& batch = *batch_;
  const int n_entries = static_cast<int>(batch.size());

  PhaseClock clock(phases_);
  // Attention block.
  backend::RmsNorm(pool_, x, w.attn_norm, n, hidden, c.rms_norm_eps, xn);
  const backend::LinearOutput qkv[] = {{&w.wq, w.bq, q}, {&w.wk, w.bk, k}, {&w.wv, w.bv, v}};
  backend::LinearMulti(pool_, xn, n, qkv, 3, linear_mode_);
  clock.Mark(StepPhases::kNormQkv);
  std::memcpy(kr, k, static_cast<size_t>(n) * kvd * 4);
  rope_.Apply(q, n, c.n_heads, positions_.data());
  rope_.Apply(kr, n, c.n_kv_heads, positions_.data());
  if (hooks != nullptr) {
    for (int i = 0; i < n_entries; ++i) {
      const int64_t off = static_cast<int64_t>(entry_offset_[i]) * kvd;
      hooks->OnKv(layer, Rows(i), kv::LayerKv{k + off, kr + off, v + off});
    }
  }

  const attention::AttentionShape shape = AttentionShapeOf(c);
  // All sequences' attention in one parallel pass (continuous batching's decode steps
  // are one row each: too small to keep the pool busy one sequence at a time).
  int32_t* kv_end = kv_end_.data();
  if (hooks != nullptr) {
    hook_kv_end_.assign(kv_end_.begin(), kv_end_.begin() + n);  // a hook's changes last one layer
    kv_end = hook_kv_end_.data();
  }
  requests_.resize(batch.size());
  for (int i = 0; i < n_entries; ++i) {
    auto& e = batch[i];
    const int off = entry_offset_[i];
    for (int ri = run_begin_[i]; ri < run_begin_[i + 1]; ++ri) {
      const SlotRun& run = runs_[ri];
      e.seq->WriteKv(layer, run.slot, run.n, kr + static_cast<int64_t>(run.row) * kvd,
                     v + static_cast<int64_t>(run.row) * kvd);
    }
    attention::AttendRequest& r = requests_[i];
    r.q = q + static_cast<int64_t>(off) * qd;
    r.n_q = entry_rows_[i];
    r.kv_end = kv_end + off;
    r.indices = nullptr;
    r.n_indices = 0;
    r.head_indices = nullptr;
    r.n_head_indices = nullptr;
    r.kv = KvView(*e.seq->pool(), layer);
    r.kv.block_table = e.seq->block_table().data();
    r.kv.n_slots = e.seq->n_slots();
    r.out = attn + static_cast<int64_t>(off) * qd;
    if (hooks != nullptr) {
      kv::Visibility vis;
      vis.kv_end = kv_end + off;
      vis.n_slots = r.kv.n_slots;
      vis.q = r.q;
      vis.kv = &r.kv;
      hooks->BeforeAttention(layer, Rows(i), &vis);
      if (vis.view != nullptr) r.kv = *vis.view;
      r.indices = vis.indices;
      r.n_indices = vis.n_indices;
      r.head_indices = vis.head_indices;
      r.n_head_indices = vis.n_head_indices;
    }
  }
  clock.Mark(StepPhases::kRopeKv);
  attention::AttendBatch(pool_, shape, requests_.data(), static_cast<int>(requests_.size()), attend_mode_);
  clock.Mark(StepPhases::kAttention);
  backend::Linear(pool_, attn, n, w.wo, nullptr, xn, linear_mode_);
  backend::Add(x, xn, n * hidden);
  clock.Mark(StepPhases::kOut);

  // Feed-forward block.
  float* gate = F(gate_);
  float* up = F(up_);
  backend::RmsNorm(pool_, x, w.ffn_norm, n, hidden, c.rms_norm_eps, xn);
  const backend::LinearOutput gate_up[] = {{&w.w_gate, nullptr, gate}, {&w.w_up, nullptr, up}};
  backend::LinearMulti(pool_, xn, n, gate_up, 2, linear_mode_);
  backend::SiluMul(pool_, gate, up, n * c.intermediate_size);
  clock.Mark(StepPhases::kFfnGateUp);
  backend::Linear(pool_, gate, n, w.w_down, nullptr, xn, linear_mode_);
  backend::Add(x, xn, n * hidden);
  clock.Mark(StepPhases::kFfnDown);

  if (hooks != nullptr) DropRows(layer, hooks);
}

void Transformer::DropRows(int layer, kv::LayerHooks* hooks) {
  keep_.assign(n_rows_, 1);
  const int n_entries = static_cast<int>(entry_offset_.size());
  for (int i = 0; i < n_entries; ++i) hooks->AfterLayer(layer, Rows(i), keep_.data() + entry_offset_[i]);
  if (std::find(keep_.begin(), keep_.end(), 0) == keep_.end()) return;
  // Move the kept rows down, in order (a row only ever moves to a lower index).
  const int hidden = config_.hidden_size;
  float* x = F(x_);
  int dst = 0;
  for (int i = 0; i < n_entries; ++i) {
    const int r0 = entry_offset_[i], r1 = r0 + entry_rows_[i];
    entry_offset_[i] = dst;
    for (int r = r0; r < r1; ++r) {
      if (!keep_[r]) continue;
      if (dst != r) {
        std::memmove(x + static_cast<int64_t>(dst) * hidden, x + static_cast<int64_t>(r) * hidden,
                     static_cast<size_t>(hidden) * 4);
        positions_[dst] = positions_[r];
        row_slot_[dst] = row_slot_[r];
        row_token_[dst] = row_token_[r];
        kv_end_[dst] = kv_end_[r];
      }
      ++dst;
    }
    entry_rows_[i] = dst - entry_offset_[i];
  }
  n_rows_ = dst;
  positions_.resize(dst);
  row_slot_.resize(dst);
  row_token_.resize(dst);
  BuildRuns();
}

void Transformer::Finish(std::vector<float>* logits) {
  const auto& c = config_;
  auto& batch = *batch_;
  const int hidden = c.hidden_size;
  int n_out = 0;
  float* rows = F(xn_);
  for (size_t i = 0; i < batch.size(); ++i) {
    const int n_kept = entry_rows_[i];
    const int n_rows = batch[i].all_logits ? n_kept : batch[i].want_logits ? std::min(1, n_kept) : 0;
    const int first = entry_offset_[i] + n_kept - n_rows;
    std::memcpy(rows + static_cast<int64_t>(n_out) * hidden, F(x_) + static_cast<int64_t>(first) * hidden,
                 static_cast<size_t>(n_rows) * hidden * 4);
    n_out += n_rows;
  }
  if (logits != nullptr) {
    PhaseClock clock(phases_);
    logits->resize(static_cast<size_t>(n_out) * c.vocab_size);
    if (n_out > 0) {
      backend::RmsNorm(pool_, rows, model_.weights().final_norm, n_out, hidden, c.rms_norm_eps, rows);
      backend::Linear(pool_, rows, n_out, model_.weights().lm_head, nullptr, logits->data(), linear_mode_);
    }
    clock.Mark(StepPhases::kLogits);
  }
  if (phases_ != nullptr) ++phases_->steps;
  batch_ = nullptr;
}

std::span<const int32_t> Transformer::kept_rows(int entry) const {
  return std::span<const int32_t>(row_token_.data() + entry_offset_[entry], entry_rows_[entry]);
}

void Transformer::EnterKv(kv::SequenceKv* seq, int layer, int first, int n, const float* k_pre_rope, const float* v) {
  const int64_t kvd = config_.kv_dim();
  kv::EnterRotatedRows(*seq->pool(), rope_, layer, seq->block_table().data(), first, n, seq->positions().data(),
                       [&](int s) { return k_pre_rope + (s - first) * kvd; },
                       [&](int s) { return v + (s - first) * kvd; });
}

}  // namespace attic::engine
