// Scheduler <-> KV store (paper 001): loading a request's stored KV at admission,
// saving each finished turn's pre-RoPE KV, and handing the store look-ahead hints from
// the waiting queue for prefetch and eviction (DESIGN.md decision 6).
//
// Loads run synchronously on the step loop (layer-wise overlap is future work, see
// docs/store.md); saves go through the store's write buffer (KvStore::SaveAsync).
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

// Truncated prompt: stored rows [0, keep) + [keep+skip, c) re-enter at positions
// 0, 1, ... (their K is pre-RoPE, so re-embedding is exact per token; the KV itself was
// computed with the dropped tokens in context -- the paper's approximation).
static bool GatherTruncated(const Truncation& t, int c, int cap, std::vector<int>* rows) {
  for (int i = 0; i < std::min(c, t.keep); ++i) rows->push_back(i);
  if (c >= t.keep)
    for (int i = t.keep + t.skip; i < c; ++i) rows->push_back(i);
  if (static_cast<int>(rows->size()) > cap) rows->resize(cap);
  return !rows->empty();
}

bool Scheduler::LoadFromStore(Running& r, int min_tokens) {
  if (r.truncation.active) {
    const std::vector<int32_t>& prompt = *r.prompt;
    auto m = store_->Lookup(r.req.tenant, r.req.session_id, r.truncation.store_view);
    if (!m) return false;
    std::vector<int> rows;
    if (!GatherTruncated(r.truncation, m->n_tokens, static_cast<int>(prompt.size()) - 1, &rows)) return false;
    const int usable = static_cast<int>(rows.size());
    if (usable < min_tokens) return false;
    auto entry = store_->Load(m->key);
    if (!entry.ok()) return false;
    const kv::KvShape& shape = pool_.shape();
    if (entry->n_layers != shape.n_layers || entry->kv_dim != shape.kv_dim() || entry->n_tokens() < m->n_tokens)
      return false;
    EnsureFree(BlocksFor(usable), nullptr);
    std::vector<int32_t> positions(usable);
    for (int i = 0; i < usable; ++i) positions[i] = i;
    auto seq = std::make_unique<kv::SequenceKv>(&pool_);
    if (!seq->Append(prompt.data(), positions.data(), usable).ok()) return false;
    auto host = std::make_unique<HostKv>();
    host->k.resize(shape.n_layers);
    host->v.resize(shape.n_layers);
    const size_t kvd = static_cast<size_t>(shape.kv_dim());
    for (int l = 0; l < shape.n_layers; ++l) {
      host->k[l].resize(usable * kvd);
      host->v[l].resize(usable * kvd);
      for (int i = 0; i < usable; ++i) {
        std::copy_n(entry->k[l].begin() + rows[i] * kvd, kvd, host->k[l].begin() + i * kvd);
        std::copy_n(entry->v[l].begin() + rows[i] * kvd, kvd, host->v[l].begin() + i * kvd);
      }
      engine_.transformer().EnterKv(seq.get(), l, 0, usable, host->k[l].data(), host->v[l].data());
    }
    r.kv = std::move(seq);
    r.host = std::move(host);
    store_->RecordReuse(usable);
    return true;
  }
  const std::vector<int32_t>& prompt = *r.prompt;
  auto m = store_->Lookup(r.req.tenant, r.req.session_id, prompt);
  if (!m) return false;
  // At least the last prompt token is computed, so that its logits exist.
  const int usable = std::min<int>(m->n_tokens, static_cast<int>(prompt.size()) - 1);
  if (usable < min_tokens) return false;
  auto entry = store_->Load(m->key);
  if (!entry.ok()) return false;  // a bad entry is a miss (the store dropped it)
  const kv::KvShape& shape = pool_.shape();
  if (entry->n_layers != shape.n_layers || entry->kv_dim != shape.kv_dim() || entry->n_tokens() < usable) return false;
  EnsureFree(BlocksFor(usable), nullptr);
  auto seq = std::make_unique<kv::SequenceKv>(&pool_);
  if (!seq->Append(entry->tokens.data(), entry->positions.data(), usable).ok()) return false;
  Transformer& tf = engine_.transformer();
  auto host = std::make_unique<HostKv>();
  host->k.resize(shape.n_layers);
  host->v.resize(shape.n_layers);
  const size_t n = static_cast<size_t>(usable) * shape.kv_dim();
  for (int l = 0; l < shape.n_layers; ++l) {
    // RoPE is applied here, at the slots' positions (paper 3.4).
    tf.EnterKv(seq.get(), l, 0, usable, entry->k[l].data(), entry->v[l].data());
    host->k[l].assign(entry->k[l].begin(), entry->k[l].begin() + n);
    host->v[l].assign(entry->v[l].begin(), entry->v[l].begin() + n);
  }
  r.kv = std::move(seq);
  r.host = std::move(host);
  // The new turn's entry supersedes the one it extends.
  if (usable == m->entry_tokens) r.store_key = m->key;
  store_->RecordReuse(usable);
  return true;
}

void Scheduler::SaveToStore(Running& r, bool keep_host) {
  if (store_ == nullptr || !r.kv || !r.host || !r.host->valid) return;
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
  if (keep_host) {
    e.k = r.host->k;
    e.v = r.host->v;
  } else {  // the sequence is not kept resident: hand its buffers over
    e.k = std::move(r.host->k);
    e.v = std::move(r.host->v);
    r.host.reset();
  }
  // Asynchronous: the writer thread serializes and places it (paper 3.2); the next
  // lookup of this tenant waits for it.
  store_->SaveAsync(std::move(e), r.store_key, r.req.session_ttl_ms);
}

// REQUIRES: mu_ held (called from Admit).
void Scheduler::HintStore() {
  std::vector<store::QueuedJob> jobs;
  for (const auto& w : waiting_) {
    if (static_cast<int>(jobs.size()) >= options_.store_lookahead) break;
    jobs.push_back({w->req.tenant, w->req.session_id, *w->prompt});
  }
  store_->SetLookAhead(jobs);
  if (!jobs.empty()) store_->RequestPrefetch();
}

}  // namespace attic::engine
