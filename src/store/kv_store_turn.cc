// KvStore's side of turns (include/attic/store/turn.h): finding and opening what a turn
// loads, the read buffer that fetches the next waiting jobs' entries ahead of their
// admission (paper 001 section 3.2, S_buf), the measured rates it is sized by, and the
// turn-bytes budget.
#include <algorithm>
#include <chrono>

#include "attic/store/kv_store.h"

namespace attic::store {

namespace {
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
  auto opened = [&]() -> StatusOr<std::shared_ptr<const KvSource>> {
    if (auto streamed = OpenStreamed(hit.key)) return std::move(*streamed);
    StatusOr<Fetched> f = Fetch(hit.key);
    if (!f.ok()) return f.status();
    return KvSource::Stored(std::move(f->bytes), std::move(f->header), hit.key);
  }();
  std::lock_guard<std::mutex> lock(rmu_);
  fetch_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return opened;
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

void KvStore::StageReads(const std::vector<QueuedJob>& jobs) {
  {
    std::lock_guard<std::mutex> lock(rmu_);
    if (read_buffer_bytes_ == 0 || loader_ == nullptr) return;
  }
  // What each of the next jobs would read (no lookup counted, nothing waited for).
  std::vector<AheadEntry> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < jobs.size() && static_cast<int>(i) < prefetch_->stage_ahead(); ++i)
      next.push_back(ResolveLocked(jobs[i]));
  }
  std::lock_guard<std::mutex> lock(rmu_);
  ReadBufferState rb;
  rb.budget = read_buffer_bytes_;
  rb.min_tokens = read_buffer_min_tokens_;
  rb.t_load_per_token = t_load_;
  rb.t_prefill_per_token = t_prefill_;
  const StagePlan plan = prefetch_->PlanStaging(next, rb, [&](const std::string& key) -> int64_t {
    auto it = staged_.find(key);
    return it == staged_.end() ? -1 : static_cast<int64_t>(it->second->bytes);
  });
  // Fetches of jobs no longer among the next ones (admitted elsewhere, cancelled) go.
  for (auto it = staged_.begin(); it != staged_.end();) {
    const bool wanted = std::find(plan.keep.begin(), plan.keep.end(), it->first) != plan.keep.end();
    it = wanted ? std::next(it) : staged_.erase(it);
  }
  for (const AheadEntry& e : plan.start) {
    auto fetch = std::make_shared<StagedFetch>();
    fetch->key = e.key;
    fetch->bytes = e.bytes;
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
    staged_[e.key] = std::move(fetch);
    ++staged_count_;
  }
}

}  // namespace attic::store
