// Turn: a sequence's rows as the store keeps them for its save (include/attic/store/turn.h).
#include "attic/store/turn.h"

#include <algorithm>
#include <utility>

#include "attic/attention/kv_q8.h"
#include "attic/backend/convert.h"
#include "attic/store/kv_store.h"

namespace attic::store {

namespace {

// n rows of kv_dim f32 values appended to one layer's own rows of a tensor whose row type
// is `type`, by the row vector's element: f32 copied (an f32 tensor, or kivi4's K, f32
// until saved), f16 rounded, a quantized type's rows quantized one by one.
void AppendRows(KvDtype, std::vector<float>& rows, const float* x, int n, int kv_dim, int) {
  rows.insert(rows.end(), x, x + static_cast<size_t>(n) * kv_dim);
}
void AppendRows(KvDtype, std::vector<uint16_t>& rows, const float* x, int n, int kv_dim, int) {
  const size_t at = rows.size(), elems = static_cast<size_t>(n) * kv_dim;
  rows.resize(at + elems);
  backend::ConvertF32ToF16(x, rows.data() + at, static_cast<int64_t>(elems));
}
void AppendRows(KvDtype type, std::vector<uint8_t>& rows, const float* x, int n, int kv_dim, int group) {
  const size_t row = KvRowBytes(type, kv_dim, group);
  size_t at = rows.size();
  rows.resize(at + static_cast<size_t>(n) * row);
  for (int i = 0; i < n; ++i, at += row)
    QuantizeRow(type, x + static_cast<size_t>(i) * kv_dim, kv_dim, group, rows.data() + at);
}

// Own row `own` of one layer of a tensor replaced by x's kv_dim values, as AppendRows keeps them.
void PutRow(KvDtype, std::vector<float>& rows, size_t own, const float* x, int kv_dim, int) {
  std::copy(x, x + kv_dim, rows.data() + own * kv_dim);
}
void PutRow(KvDtype, std::vector<uint16_t>& rows, size_t own, const float* x, int kv_dim, int) {
  backend::ConvertF32ToF16(x, rows.data() + own * kv_dim, kv_dim);
}
void PutRow(KvDtype type, std::vector<uint8_t>& rows, size_t own, const float* x, int kv_dim, int group) {
  QuantizeRow(type, x, kv_dim, group, rows.data() + own * KvRowBytes(type, kv_dim, group));
}

}  // namespace

uint64_t TurnRows::own_bytes() const { return OwnRowBytes(*this); }

Turn::Turn(KvStore& store, std::string tenant, std::string session_id, int64_t ttl_ms)
    : store_(store), tenant_(std::move(tenant)), session_id_(std::move(session_id)), ttl_ms_(ttl_ms) {
  const kv::KvShape& shape = store.compute_shape();
  n_layers_ = shape.n_layers;
  kv_dim_ = shape.kv_dim();
  dtype_ = store.kv_dtype();
  group_ = KvDtypeQuantized(dtype_) ? attention::KvQ8Group(shape.head_dim) : 0;
  // kivi4: the turn keeps its own K rows in f32 until they are saved (a group is
  // quantized as a whole, when the entry is serialized).
  k_row_size_ = KvDtypeGroupedK(dtype_) ? static_cast<size_t>(kv_dim_) * sizeof(float)
                                        : KvRowBytes(KvTensorDtype(dtype_, false), kv_dim_, group_);
  v_row_size_ = KvRowBytes(KvTensorDtype(dtype_, true), kv_dim_, group_);
  rows_.ResizeLayers(n_layers_);
}

Turn::~Turn() {
  if (load_) load_->WaitAll();  // the loader writes into the sequence's blocks and our rows
  store_.AddTurnBytes(-static_cast<int64_t>(accounted_));
}

void Turn::AccountOwnBytes() {
  const uint64_t now = rows_.own_bytes();
  store_.AddTurnBytes(static_cast<int64_t>(now) - static_cast<int64_t>(accounted_));
  accounted_ = now;
}

void Turn::Invalidate() {
  valid_ = false;
  rows_ = TurnRows();
  saved_.reset();
  AccountOwnBytes();
}

void Turn::Renew(std::string session_id, int64_t ttl_ms) {
  session_id_ = std::move(session_id);
  ttl_ms_ = ttl_ms;
  supersedes_.clear();
}

void Turn::Reserve(int max_slots) {
  if (!valid_) return;
  const size_t n = static_cast<size_t>(std::max(0, max_slots - rows_.base.n_rows));
  rows_.ResizeLayers(n_layers_);
  WithOwnRows(dtype_, rows_, [&](auto& k, auto& v) {
    for (auto& x : k) x.reserve(n * RowUnits(k, false));
    for (auto& x : v) x.reserve(n * RowUnits(v, true));
  });
}

void Turn::BaseOn(std::shared_ptr<const KvEntry> e, int n) {
  // A kivi4 entry's base is serialized (its groups are written from there): its own f32
  // rows are copied instead.
  const bool copy = e->base.unserialized_depth() + 1 > kMaxUnserializedDepth || KvDtypeGroupedK(e->dtype);
  rows_.ForEachRows([](auto& rows, bool) {
    for (auto& x : rows) x.clear();
  });
  if (!copy) {
    rows_.base.entry = std::move(e);
    rows_.base.n_rows = n;
    rows_.base.bytes.reset();
    return;
  }
  rows_.base = e->base;
  rows_.base.n_rows = std::min(e->base.n_rows, n);
  if (n > e->base.n_rows) {
    const size_t own = static_cast<size_t>(n - e->base.n_rows);
    WithOwnRows(e->dtype, rows_, *e, [&](auto& k, auto& v, const auto& ek, const auto& ev) {
      const size_t k_units = own * RowUnits(k, false), v_units = own * RowUnits(v, true);
      for (int l = 0; l < n_layers_; ++l) {
        k[l].assign(ek[l].begin(), ek[l].begin() + k_units);
        v[l].assign(ev[l].begin(), ev[l].begin() + v_units);
      }
    });
  }
}

void Turn::Load(std::vector<LoadSegment> segments, std::vector<int32_t> blocks, std::vector<int32_t> positions,
                int max_slots, Preload mode, backend::ThreadPool& threads) {
  ATTIC_CHECK(!segments.empty() && n_slots() == 0 && load_ == nullptr);
  // Rows of another store type enter the buffer like any, but the turn cannot keep them
  // as its own (its rows and its save are of the store's type): it is not saved.
  for (const LoadSegment& seg : segments)
    if (seg.source->dtype() != dtype_) Invalidate();
  auto job = std::make_shared<LoadJob>();
  const LoadSegment& first = segments.front();
  // Slots the sequence has when it starts: the segments' and any slots between them
  // (computed in place later).
  const int n_plan = std::max(static_cast<int>(positions.size()), segments.back().dst_slot + segments.back().n);
  const bool prefix = first.src_row == 0 && first.dst_slot == 0;
  if (prefix && valid_) {
    // Rows that are a prefix of their source: shared in place, never copied.
    const KvSource& src = *first.source;
    if (src.queued()) {
      BaseOn(src.queued_entry(), first.n);
    } else {
      rows_.base = EntryRowsBase(src.bytes(), src.header(), first.n);
    }
    // A turn that extends a whole stored entry replaces it when saved.
    if (segments.size() == 1 && !src.key().empty() && first.n == src.n_rows()) supersedes_ = src.key();
  }
  Reserve(max_slots);
  const int base = rows_.base.n_rows;
  if (valid_ && n_plan > base) {
    // The other slots (truncation's kept rows, linked chunks, slots computed in place
    // between them) are the turn's own: the loader copies what it enters, by slot, as
    // it enters it; the forward writes the rest (Write).
    const size_t own = static_cast<size_t>(n_plan - base);
    WithOwnRows(dtype_, rows_, [&](auto& k, auto& v) {
      for (auto& x : k) x.resize(own * RowUnits(k, false));
      for (auto& x : v) x.resize(own * RowUnits(v, true));
      job->CopyInto(&k, &v);
    });
    job->copy_first_slot = base;
    job->copy_from_segment = base > 0 ? 1 : 0;
  }
  job->segments = std::move(segments);
  job->blocks = std::move(blocks);
  job->positions = std::move(positions);
  store_.loader().Start(job, mode, threads);
  load_ = std::move(job);
  AccountOwnBytes();
}

bool Turn::NoteLoadFailure() {
  if (!load_->failed()) return false;
  load_failure_ = load_->failure();
  valid_ = false;
  return true;
}

double Turn::WaitLoad() {
  if (!load_) return 0;
  const double waited = load_->WaitAll();
  NoteLoadFailure();
  return waited;
}

bool Turn::CollectLoad(double* enter_seconds, int* rows, uint64_t* bytes) {
  if (!load_ || !load_->done()) return false;
  if (NoteLoadFailure()) {  // no rate to learn from; the slots are recomputed
    load_.reset();
    return false;
  }
  *enter_seconds = load_->enter_seconds;
  *rows = load_->n_rows();
  if (bytes != nullptr) *bytes = load_->stored_bytes();
  store_.ReportLoad(*enter_seconds, *rows);
  load_.reset();
  AccountOwnBytes();  // the rows a load copied
  return true;
}

void Turn::Append(int layer, const float* k, const float* v, int n) {
  if (!valid_) return;
  if (layer == 0) {
    // The step's rows of every layer, counted before any is kept.
    const uint64_t add = static_cast<uint64_t>(n_layers_) * n * (k_row_size_ + v_row_size_);
    if (!store_.TryAddTurnBytes(add)) {
      Invalidate();
      return;
    }
    accounted_ += add;
  }
  // Each row kept in its tensor's row type in one pass (quantized, rounded to f16 or
  // copied; kivi4's K copied: f32 until saved).
  WithOwnRows(dtype_, rows_, [&](auto& kr, auto& vr) {
    AppendRows(KvTensorDtype(dtype_, false), kr[layer], k, n, kv_dim_, group_);
    AppendRows(KvTensorDtype(dtype_, true), vr[layer], v, n, kv_dim_, group_);
  });
}

void Turn::Write(int layer, const int32_t* slots, const float* k, const float* v, int n) {
  if (!valid_) return;
  const int base = rows_.base.n_rows;
  for (int i = 0; i < n; ++i) {
    if (slots[i] < base || slots[i] >= n_slots()) {
      Invalidate();  // a shared row (or no row) to overwrite: the turn no longer knows its KV
      return;
    }
  }
  WithOwnRows(dtype_, rows_, [&](auto& kr, auto& vr) {
    for (int i = 0; i < n; ++i) {
      const size_t own = static_cast<size_t>(slots[i] - base);
      PutRow(KvTensorDtype(dtype_, false), kr[layer], own, k + static_cast<size_t>(i) * kv_dim_, kv_dim_, group_);
      PutRow(KvTensorDtype(dtype_, true), vr[layer], own, v + static_cast<size_t>(i) * kv_dim_, kv_dim_, group_);
    }
  });
}

void Turn::Truncate(int n) {
  if (!valid_) return;
  rows_.base.n_rows = std::min(rows_.base.n_rows, n);
  const size_t own = static_cast<size_t>(std::max(0, n - rows_.base.n_rows));  // rows
  rows_.ForEachRows([&](auto& rows, bool v) {
    for (auto& x : rows) x.resize(std::min(x.size(), own * RowUnits(rows, v)));
  });
  AccountOwnBytes();
}

std::unique_ptr<Turn> Turn::Branch(int n, std::string session_id, int64_t ttl_ms) const {
  std::unique_ptr<Turn> t(new Turn(store_, tenant_, std::move(session_id), ttl_ms));
  if (!valid_ || n_slots() < n) {
    t->Invalidate();
    return t;
  }
  t->rows_ = rows_;
  t->saved_ = saved_;
  t->Truncate(n);  // accounts the copy
  return t;
}

void Turn::RebaseOnPlacedSave(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions) {
  if (saved_ == nullptr) return;
  const int n_saved = saved_->n_tokens();
  if (n_saved < rows_.base.n_rows || n_saved > n_slots() || static_cast<int>(tokens.size()) < n_saved) return;
  auto f = store_.FetchFromDram(saved_->key().ToString());
  if (!f.ok()) return;  // not placed yet, or not in DRAM: keep sharing the entry
  const KvEntry& meta = f->header.meta;
  // The rows must still be the save's (a branch may have replaced its tail since).
  if (meta.n_tokens() != n_saved || !std::equal(meta.tokens.begin(), meta.tokens.end(), tokens.begin()) ||
      !std::equal(meta.positions.begin(), meta.positions.end(), positions.begin()))
    return;
  const size_t covered = static_cast<size_t>(n_saved - rows_.base.n_rows);  // own rows now in the tier
  rows_.ForEachRows([&](auto& rows, bool v) {
    const size_t units = covered * RowUnits(rows, v);
    for (auto& x : rows) x.erase(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(std::min(units, x.size())));
  });
  rows_.base = EntryRowsBase(f->bytes, f->header, n_saved);
  saved_.reset();
}

void Turn::Commit(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions, bool keep_rows,
                  std::vector<EntryAttachment> attachments) {
  WaitLoad();
  const int n = static_cast<int>(tokens.size());
  if (!valid_ || n == 0 || n_slots() != n || static_cast<int>(rows_.k.size()) != n_layers_) return;
  KvEntry e;
  e.tenant = tenant_;
  e.session_id = session_id_;
  e.fingerprint = store_.options().fingerprint;
  e.n_layers = n_layers_;
  e.kv_dim = kv_dim_;
  e.dtype = dtype_;
  e.group = group_;
  e.tokens = tokens;
  e.positions = positions;
  e.attachments = std::move(attachments);
  if (keep_rows) RebaseOnPlacedSave(tokens, positions);
  e.base = rows_.base;  // the stored history is written from where it is
  // The rows since the base move into the entry (no copy on the step loop).
  e.k = std::move(rows_.k);
  e.v = std::move(rows_.v);
  e.k16 = std::move(rows_.k16);
  e.v16 = std::move(rows_.v16);
  e.kq = std::move(rows_.kq);
  e.vq = std::move(rows_.vq);
  // Asynchronous: the writer thread serializes and places it (paper 3.2); the next
  // lookup of this session waits for it (or reads it from the write buffer).
  std::shared_ptr<const KvEntry> saved = store_.SaveAsync(std::move(e), supersedes_, ttl_ms_);
  rows_ = TurnRows();
  rows_.ResizeLayers(n_layers_);
  if (!keep_rows) {
    valid_ = false;  // records nothing more
    AccountOwnBytes();
    return;
  }
  // Staying resident: the saved entry, immutable from now on, is the base of all its
  // rows (shared with the writer, as a queued save read by a next turn is).
  BaseOn(saved, n);
  saved_ = std::move(saved);
  AccountOwnBytes();
}

}  // namespace attic::store
