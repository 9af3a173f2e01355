// KvStore's side of turns (include/attic/store/turn.h): finding and opening what a turn
// loads, the read buffer that fetches the next waiting jobs' entries ahead of their
// admission (paper 001 section 3.2, S_buf), the measured rates it is sized by, and the
// turn-bytes budget.
#include <algorithm>
#include <chrono>

#include "attic/store/kv_store.h"

namespace attic::store {

namespace {
constexpr int kMaxAhead = 2;  // waiting jobs whose entries the read buffer fetches
constexpr double kEma = 0.3;  // weight of a new sample in the measured rates

void Ema(double& x, double v) { x = x == 0 ? v : (1 - kEma) * x + kEma * v; }
}  // namespace

void KvStore::AttachComputeBuffer(kv::BlockPool* pool, const attention::RopeTable* rope) {
  ATTIC_CHECK(pool_ == nullptr && pool != nullptr && rope != nullptr);
  pool_ = pool;
  rope_ = rope;
  loader_ = std::make_unique<KvLoader>(*pool, *rope);
}

std::unique_ptr<Turn> KvStore::NewTurn(const std::string& tenant, const std::string& session_id, int64_t ttl_ms) {
  ATTIC_CHECK(pool_ != nullptr);
  return std::unique_ptr<Turn>(new Turn(*this, tenant, session_id, ttl_ms));
}

bool KvStore::TryAddTurnBytes(uint64_t add) {
  if (options_.turn_bytes == 0) {
    turn_bytes_.fetch_add(add);
    return true;
  }
  uint64_t now = turn_bytes_.load();
  do {
    if (now + add > options_.turn_bytes) {
      turns_over_budget_.fetch_add(1);
      return false;
    }
  } while (!turn_bytes_.compare_exchange_weak(now, now + add));
  return true;
}

std::optional<StoreHit> KvStore::FindForTurn(const std::string& tenant, const std::string& session_id,
                                             const std::vector<int32_t>& tokens, bool read_queued) {
  if (read_queued) {
    int common = 0;
    if (std::shared_ptr<const KvEntry> e = ReadQueuedSave(tenant, session_id, tokens, &common)) {
      StoreHit hit;
      hit.n_tokens = common;
      hit.entry_tokens = e->n_tokens();
      hit.queued = std::move(e);
      return hit;
    }
  }
  auto m = Lookup(tenant, session_id, tokens);
  if (!m) return std::nullopt;
  StoreHit hit;
  hit.key = m->key;
  hit.n_tokens = m->n_tokens;
  hit.entry_tokens = m->entry_tokens;
  return hit;
}

bool KvStore::MustWaitForSave(const std::string& tenant, const std::string& session_id,
                              const std::vector<int32_t>& tokens, bool read_queued) {
  int common = 0;
  if (read_queued && ReadQueuedSave(tenant, session_id, tokens, &common) != nullptr) return false;
  return SavePending(tenant, session_id, tokens);
}

StatusOr<std::shared_ptr<const KvSource>> KvStore::OpenForTurn(const StoreHit& hit) {
  if (hit.queued != nullptr) {
    RecordWriteBufferHit();
    return KvSource::Queued(hit.queued);
  }
  std::shared_ptr<StagedFetch> staged;
  {
    std::lock_guard<std::mutex> lock(rmu_);
    auto it = staged_.find(hit.key);
    if (it != staged_.end()) {
      staged = std::move(it->second);
      staged_.erase(it);
      ++staged_used_;
    }
  }
  if (staged != nullptr) return staged->Wait();
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<Fetched> f = Fetch(hit.key);
  {
    std::lock_guard<std::mutex> lock(rmu_);
    fetch_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!f.ok()) return f.status();
  return KvSource::Stored(std::move(f->bytes), std::move(f->header), hit.key);
}

void KvStore::SetReadBuffer(int64_t bytes, int min_tokens) {
  std::lock_guard<std::mutex> lock(rmu_);
  read_buffer_bytes_ = bytes;
  read_buffer_min_tokens_ = min_tokens;
}

void KvStore::ReportPrefillRate(double seconds_per_token) {
  std::lock_guard<std::mutex> lock(rmu_);
  Ema(t_prefill_, seconds_per_token);
}

KvStore::ReadBufferStats KvStore::ReadBuffer() const {
  std::lock_guard<std::mutex> lock(rmu_);
  return {staged_count_, staged_used_, fetch_seconds_, t_load_, t_prefill_};
}

void KvStore::ReportLoad(double enter_seconds, int rows) {
  if (rows <= 0) return;
  std::lock_guard<std::mutex> lock(rmu_);
  Ema(t_load_, enter_seconds / rows);
}

// REQUIRES: rmu_ held.
int64_t KvStore::AutoReadBufferBytes(int l_hist, int l_new, uint64_t entry_bytes) const {
  // S_buf = B * (T_load * L_hist - T_pref * L_new), B = bytes per second of loading.
  if (t_load_ <= 0 || t_prefill_ <= 0 || l_hist <= 0) return static_cast<int64_t>(entry_bytes);  // not measured yet
  const double gap = t_load_ * l_hist - t_prefill_ * l_new;
  if (gap <= 0) return 0;  // the job's own prefill hides its load
  const double bandwidth = static_cast<double>(entry_bytes) / (t_load_ * l_hist);
  return static_cast<int64_t>(bandwidth * gap);
}

void KvStore::StageReads(const std::vector<QueuedJob>& jobs) {
  int64_t budget = 0;
  int min_tokens = 0;
  {
    std::lock_guard<std::mutex> lock(rmu_);
    budget = read_buffer_bytes_;
    min_tokens = read_buffer_min_tokens_;
  }
  if (budget == 0 || loader_ == nullptr) return;
  // What each of the next jobs would read (no lookup counted, nothing waited for).
  struct Want {
    std::string key;
    uint64_t bytes = 0;
    int n_tokens = 0, prompt_tokens = 0;
  };
  std::vector<Want> wants;
  for (size_t i = 0; i < jobs.size() && static_cast<int>(i) < kMaxAhead; ++i) {
    const QueuedJob& j = jobs[i];
    Want w;
    auto m = Peek(j.tenant, j.session_id, *j.tokens, &w.bytes);
    if (!m || m->n_tokens < min_tokens) {
      wants.push_back(Want{});  // keeps its place: the buffer is filled in queue order
      continue;
    }
    w.key = m->key;
    w.n_tokens = m->n_tokens;
    w.prompt_tokens = j.prompt_tokens > 0 ? j.prompt_tokens : static_cast<int>(j.tokens->size());
    wants.push_back(std::move(w));
  }
  std::lock_guard<std::mutex> lock(rmu_);
  // Fetches of jobs no longer among the next ones (admitted elsewhere, cancelled) go.
  for (auto it = staged_.begin(); it != staged_.end();) {
    const bool wanted = std::any_of(wants.begin(), wants.end(), [&](const Want& w) { return w.key == it->first; });
    it = wanted ? std::next(it) : staged_.erase(it);
  }
  int64_t used = 0;
  for (const Want& w : wants) {
    if (w.key.empty()) continue;
    if (auto it = staged_.find(w.key); it != staged_.end()) {
      used += static_cast<int64_t>(it->second->bytes);
      continue;
    }
    if (budget > 0) {
      if (used + static_cast<int64_t>(w.bytes) > budget) break;  // the buffer is full
    } else if (AutoReadBufferBytes(w.n_tokens, w.prompt_tokens - w.n_tokens, w.bytes) <= 0) {
      continue;  // S_buf = 0: the job's own prefill hides its load
    }
    auto fetch = std::make_shared<StagedFetch>();
    fetch->key = w.key;
    fetch->bytes = w.bytes;
    loader_->Stage([this, fetch] {
      StatusOr<Fetched> f = Fetch(fetch->key);
      std::lock_guard<std::mutex> l(fetch->mu);
      if (f.ok()) {
        fetch->result = KvSource::Stored(std::move(f->bytes), std::move(f->header), fetch->key);
      } else {
        fetch->result = f.status();
      }
      fetch->ready = true;
      fetch->cv.notify_all();
    });
    staged_[w.key] = std::move(fetch);
    used += static_cast<int64_t>(w.bytes);
    ++staged_count_;
  }
}

}  // namespace attic::store
