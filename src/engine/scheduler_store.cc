// Scheduler <-> KV store (paper 001): loading a request's stored KV at admission,
// saving each finished turn's pre-RoPE KV, and handing the store look-ahead hints from
// the waiting queue for prefetch and eviction (DESIGN.md decision 6).
//
// Loads: the entry is found at admission (fetched ahead by the read buffer when the job
// waited), and its layers enter the compute buffer on the loader thread while the
// job's first forward step computes the earlier layers (KvPreload::kLayerwise). Saves
// go through the store's write buffer (KvStore::SaveAsync).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/scheduler_internal.h"

namespace attic::engine {

void Scheduler::TruncatePrompt(GenerationRequest& req, int limit, Truncation* t) const {
  const std::vector<int32_t>& p = req.prompt;
  const int n = static_cast<int>(p.size());
  const int keep = std::clamp(options_.truncate_keep_first, 0, limit / 2);
  // Sticky: where the session's stored entry resumes after its kept head, the same
  // tokens were dropped before; start from there.
  int o = keep;
  if (!req.session_id.empty()) {
    auto stored = store_->SessionTokens(req.tenant, req.session_id);
    if (stored.ok() && static_cast<int>(stored->size()) > keep &&
        std::equal(stored->begin(), stored->begin() + keep, p.begin())) {
      // The offset where the most of the stored tail reappears (text may repeat, so the
      // first short match is not enough).
      const int m = static_cast<int>(stored->size()) - keep;
      int best = 0;
      for (int at = keep; at < n; ++at) {
        if (p[at] != (*stored)[keep]) continue;
        int len = 0;
        while (len < m && at + len < n && p[at + len] == (*stored)[keep + len]) ++len;
        if (len > best) {
          best = len;
          o = at;
        }
      }
      if (best < std::min(m, 8)) o = keep;  // no convincing match: truncate afresh
    }
  }
  const int tail = n - o;
  int skip = 0;
  if (keep + tail > limit) {
    skip = std::max(keep + tail - limit, static_cast<int>(std::ceil(options_.truncate_ratio * tail)));
    skip = std::min(skip, tail - 1);
  }
  t->active = true;
  t->keep = keep;
  t->skip = skip;
  t->store_view.assign(p.begin(), p.begin() + keep);
  t->store_view.insert(t->store_view.end(), p.begin() + o, p.end());
  std::vector<int32_t> kept(p.begin(), p.begin() + keep);
  kept.insert(kept.end(), p.begin() + o + skip, p.end());
  req.prompt = std::move(kept);
}

// Truncated prompt: the stored rows [0, keep) + [keep+skip, c) are reused.
static bool GatherTruncated(const Truncation& t, int c, int cap, std::vector<int>* rows) {
  for (int i = 0; i < std::min(c, t.keep); ++i) rows->push_back(i);
  if (c >= t.keep)
    for (int i = t.keep + t.skip; i < c; ++i) rows->push_back(i);
  if (static_cast<int>(rows->size()) > cap) rows->resize(cap);
  return !rows->empty();
}

// The session's previous turn is still in the write buffer: its KV is read from there
// (the store's writer shares the entry `e`, whose tokens share `common` with the
// prompt) instead of waiting for the save.
bool Scheduler::LoadFromQueuedSave(Running& r, std::shared_ptr<const store::KvEntry> e, int common, int min_tokens) {
  const std::vector<int32_t>& prompt = *r.prompt;
  const kv::KvShape& shape = pool_.shape();
  const int usable = std::min(common, static_cast<int>(prompt.size()) - 1);
  if (usable < min_tokens || e->n_layers != shape.n_layers || e->kv_dim != shape.kv_dim()) return false;
  EnsureFree(BlocksFor(usable), nullptr);
  auto seq = std::make_unique<kv::SequenceKv>(&pool_);
  if (!seq->Append(e->tokens.data(), e->positions.data(), usable).ok()) return false;
  // The turn's own save needs the rows' pre-RoPE KV: the queued entry's rows, shared in
  // place (it is immutable once queued; copying them here would stall the step loop
  // for the whole history when turns follow each other faster than the writer).
  auto host = std::make_unique<HostKv>();
  host->BaseOn(e, usable, std::max(r.max_slots, usable), shape.n_layers, shape.kv_dim());
  auto job = std::make_shared<LoadJob>();
  job->rows.resize(usable);
  for (int i = 0; i < usable; ++i) job->rows[i] = i;
  job->blocks = seq->block_table();
  job->positions = seq->positions();
  job->queued = std::move(e);
  ++load_stats_.loads;
  ++load_stats_.write_buffer_loads;
  StartLoad(r, std::move(job));
  r.kv = std::move(seq);
  r.host = std::move(host);
  store_->RecordWriteBufferHit();
  store_->RecordReuse(usable);
  return true;
}

void Scheduler::HostKv::BaseOn(std::shared_ptr<const store::KvEntry> e, int n, int max_slots, int n_layers,
                               int kv_dim) {
  const bool copy = e->base.unserialized_depth() + 1 > kMaxUnserializedDepth;
  if (!copy) {
    base.entry = e;
    base.n_rows = n;
  } else {
    base = e->base;
    base.n_rows = std::min(e->base.n_rows, n);
  }
  Reserve(n_layers, std::max(max_slots, n), kv_dim);
  if (copy && n > e->base.n_rows) {
    const size_t floats = static_cast<size_t>(n - e->base.n_rows) * kv_dim;
    for (int l = 0; l < n_layers; ++l) {
      k[l].assign(e->k[l].begin(), e->k[l].begin() + floats);
      v[l].assign(e->v[l].begin(), e->v[l].begin() + floats);
    }
  }
}

void Scheduler::HostKv::RebaseOnPlacedSave(store::KvStore& store, const std::vector<int32_t>& tokens,
                                           const std::vector<int32_t>& positions, int kv_dim) {
  if (saved == nullptr) return;
  const int n_saved = saved->n_tokens();
  if (n_saved < base.n_rows || n_saved > n(kv_dim) || static_cast<int>(tokens.size()) < n_saved) return;
  auto f = store.FetchFromDram(saved->key().ToString());
  if (!f.ok()) return;  // not placed yet, or not in DRAM: keep sharing the entry
  const store::KvEntry& meta = f->header.meta;
  // The rows must still be the save's (a branch may have replaced its tail since).
  if (meta.n_tokens() != n_saved || !std::equal(meta.tokens.begin(), meta.tokens.end(), tokens.begin()) ||
      !std::equal(meta.positions.begin(), meta.positions.end(), positions.begin()))
    return;
  const size_t covered = static_cast<size_t>(n_saved - base.n_rows) * kv_dim;  // own rows now in the tier's bytes
  for (auto* rows : {&k, &v})
    for (auto& x : *rows) x.erase(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(std::min(covered, x.size())));
  base = store::EntryRowsBase(f->bytes, f->header, n_saved);
  saved.reset();
}

// Hands a load job to the loader the way KvPreload says.
void Scheduler::StartLoad(Running& r, std::shared_ptr<LoadJob> job) {
  if (options_.kv_preload == KvPreload::kLayerwise) {
    ++load_stats_.layerwise_loads;
    Loader().Enter(job);  // the step's forward waits per layer
  } else if (options_.kv_preload == KvPreload::kInline) {
    ++load_stats_.layerwise_loads;
    job->inline_loader = &Loader();  // the step's forward enters each layer first
    job->inline_threads = &engine_.threads();
  } else {
    Loader().EnterNow(*job, engine_.threads());
    load_stats_.enter_seconds += job->enter_seconds;
  }
  r.load.job = std::move(job);
}

bool Scheduler::LoadFromStore(Running& r, Waiting& w, int min_tokens) {
  const std::vector<int32_t>& prompt = *r.prompt;
  const bool trunc = r.truncation.active;
  if (trunc && options_.truncate_recompute) return false;  // TT: recompute what is kept
  // The session's newest state, still in the write buffer (Admit read it): a stored
  // entry would be an older one (waiting for the save would block the step loop for
  // nothing).
  if (w.queued_save != nullptr) return LoadFromQueuedSave(r, std::move(w.queued_save), w.queued_common, min_tokens);
  auto m = store_->Lookup(r.req.tenant, r.req.session_id, trunc ? r.truncation.store_view : prompt);
  if (!m) return false;
  // Entry rows to reuse, in slot order. At least the last prompt token is computed, so
  // that its logits exist.
  std::vector<int> rows;
  if (trunc) {
    if (!GatherTruncated(r.truncation, m->n_tokens, static_cast<int>(prompt.size()) - 1, &rows)) return false;
  } else {
    const int usable = std::min<int>(m->n_tokens, static_cast<int>(prompt.size()) - 1);
    for (int i = 0; i < usable; ++i) rows.push_back(i);
  }
  const int usable = static_cast<int>(rows.size());
  if (usable < min_tokens) return false;
  // The entry's bytes: fetched ahead by the read buffer, else now (a bad entry is a
  // miss; the store dropped it).
  const auto t0 = SchedClock::now();
  StatusOr<store::KvStore::Fetched> f = NotFoundError("");
  if (w.staged != nullptr && w.staged->key == m->key) {
    f = std::move(w.staged->Wait());
    ++load_stats_.staged_used;
  } else {
    f = store_->Fetch(m->key);
  }
  load_stats_.fetch_seconds += std::chrono::duration<double>(SchedClock::now() - t0).count();
  if (!f.ok()) return false;
  const kv::KvShape& shape = pool_.shape();
  const store::KvEntry& meta = f->header.meta;
  if (meta.n_layers != shape.n_layers || meta.kv_dim != shape.kv_dim() || meta.n_tokens() < m->n_tokens ||
      meta.n_tokens() <= rows.back())
    return false;
  EnsureFree(BlocksFor(usable), nullptr);
  auto seq = std::make_unique<kv::SequenceKv>(&pool_);
  if (trunc) {
    // Truncated: the kept rows re-enter at positions 0, 1, ... (K is pre-RoPE, so
    // re-embedding is exact per token; the KV itself was computed with the dropped
    // tokens in context -- the paper's approximation).
    std::vector<int32_t> positions(usable);
    for (int i = 0; i < usable; ++i) positions[i] = i;
    if (!seq->Append(prompt.data(), positions.data(), usable).ok()) return false;
  } else if (!seq->Append(meta.tokens.data(), meta.positions.data(), usable).ok()) {
    return false;
  }
  auto host = std::make_unique<HostKv>();
  if (!trunc) host->base = store::EntryRowsBase(f->bytes, f->header, usable);  // the history, in place
  host->Reserve(shape.n_layers, std::max(r.max_slots, usable), shape.kv_dim());
  auto job = std::make_shared<LoadJob>();
  job->rows = std::move(rows);
  job->blocks = seq->block_table();
  job->positions = seq->positions();
  if (trunc) {  // the kept rows are not a prefix of the entry: the loader copies them
    job->host_k = &host->k;
    job->host_v = &host->v;
  }
  if (!trunc && usable == m->entry_tokens) r.store_key = m->key;  // the new turn's entry supersedes it
  job->entry = std::move(*f);
  ++load_stats_.loads;
  StartLoad(r, std::move(job));
  r.kv = std::move(seq);
  r.host = std::move(host);
  store_->RecordReuse(usable);
  return true;
}

KvLoader& Scheduler::Loader() {
  if (loader_ == nullptr)
    loader_ = std::make_unique<KvLoader>(pool_, engine_.transformer().rope(), pool_.shape().n_kv_heads);
  return *loader_;
}

int64_t Scheduler::AutoReadBufferBytes(int l_hist, int l_new, uint64_t entry_bytes) const {
  // S_buf = B * (T_load * L_hist - T_pref * L_new), B = bytes per second of loading.
  const double t_load = load_stats_.t_load_per_token, t_pref = load_stats_.t_prefill_per_token;
  if (t_load <= 0 || t_pref <= 0 || l_hist <= 0) return static_cast<int64_t>(entry_bytes);  // not measured yet
  const double gap = t_load * l_hist - t_pref * l_new;
  if (gap <= 0) return 0;  // the job's own prefill hides its load
  const double bandwidth = static_cast<double>(entry_bytes) / (t_load * l_hist);
  return static_cast<int64_t>(bandwidth * gap);
}

// REQUIRES: mu_ held (called from Admit).
void Scheduler::StageReads() {
  if (options_.kv_read_buffer_bytes == 0) return;
  constexpr int kMaxAhead = 2;  // jobs fetched ahead
  int ahead = 0;
  int64_t used = 0;
  for (const auto& w : waiting_) {
    if (ahead >= kMaxAhead) break;
    ++ahead;
    if (w->staged != nullptr) {
      used += static_cast<int64_t>(w->staged->bytes);
      continue;
    }
    uint64_t bytes = 0;
    auto m = store_->Peek(w->req.tenant, w->req.session_id, w->truncation.active ? w->truncation.store_view : *w->prompt,
                          &bytes);
    if (!m || m->n_tokens < options_.min_reuse_tokens) continue;
    if (options_.kv_read_buffer_bytes > 0) {
      if (used + static_cast<int64_t>(bytes) > options_.kv_read_buffer_bytes) break;  // the buffer is full
    } else if (AutoReadBufferBytes(m->n_tokens, static_cast<int>(w->prompt->size()) - m->n_tokens, bytes) <= 0) {
      continue;  // S_buf = 0: the job's own prefill hides its load
    }
    auto fetch = std::make_shared<StagedFetch>();
    fetch->key = m->key;
    fetch->bytes = bytes;
    Loader().Stage(fetch, store_);
    w->staged = std::move(fetch);
    used += static_cast<int64_t>(bytes);
    ++load_stats_.staged;
  }
}

void Scheduler::SaveToStore(Running& r, bool keep_host) {
  if (store_ == nullptr || !options_.store_save || !r.kv || !r.host || !r.host->valid) return;
  const kv::KvShape& shape = pool_.shape();
  const int n = r.kv->n_slots();
  if (n == 0 || r.host->n(shape.kv_dim()) != n || static_cast<int>(r.host->k.size()) != shape.n_layers) return;
  store::KvEntry e;
  e.tenant = r.req.tenant;
  e.session_id = r.req.session_id;
  e.fingerprint = engine_.model().fingerprint();
  e.n_layers = shape.n_layers;
  e.kv_dim = shape.kv_dim();
  e.tokens = r.kv->tokens();
  e.positions = r.kv->positions();
  HostKv& host = *r.host;
  if (keep_host) host.RebaseOnPlacedSave(*store_, e.tokens, e.positions, shape.kv_dim());
  e.base = host.base;  // the stored history is written from where it is
  // The rows since the base move into the entry (no copy on the step loop).
  e.k = std::move(host.k);
  e.v = std::move(host.v);
  // Asynchronous: the writer thread serializes and places it (paper 3.2); the next
  // lookup of this session waits for it.
  std::shared_ptr<const store::KvEntry> saved = store_->SaveAsync(std::move(e), r.store_key, r.req.session_ttl_ms);
  if (!keep_host) {
    r.host.reset();
    return;
  }
  // Staying resident: the saved entry, immutable from now on, is the base of all its
  // rows (shared with the writer, as a queued save read by a next turn is).
  host = HostKv();
  host.BaseOn(saved, n, n, shape.n_layers, shape.kv_dim());
  host.saved = std::move(saved);
}

// REQUIRES: mu_ held (called from Admit).
void Scheduler::HintStore() {
  std::vector<store::QueuedJob> jobs;
  for (const auto& w : waiting_) {
    if (static_cast<int>(jobs.size()) >= options_.store_lookahead) break;
    jobs.push_back({w->req.tenant, w->req.session_id, *w->prompt});
  }
  const bool any = !jobs.empty();
  store_->SetLookAhead(std::move(jobs));
  if (any) store_->RequestPrefetch();
  StageReads();
}

}  // namespace attic::engine
