// KvStore: opening (tiers, rebuild of the index from the tiers, the start-up report),
// the session API, expiry and statistics. Placement, the index, the write buffer,
// prefetch, reads and turns are in the other kv_store_*.cc files.
#include "attic/store/kv_store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "attic/core/hash.h"
#include "attic/core/log.h"
#include "attic/core/progress.h"
#include "attic/core/thread_name.h"
#include "store/kv_store_internal.h"

namespace attic::store {

using internal::SessionKey;

StatusOr<std::vector<std::unique_ptr<Tier>>> KvStore::LocalTiers(const StoreOptions& options) {
  if (options.fingerprint.empty()) return InvalidArgumentError("KV store needs the model fingerprint");
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::make_unique<DramTier>(options.dram_bytes));
  if (!options.ssd_dir.empty()) {
    ATTIC_ASSIGN_OR_RETURN(std::unique_ptr<SsdTier> ssd,
                           SsdTier::Open(options.ssd_dir, options.fingerprint, options.ssd_bytes, options.ssd_env));
    tiers.push_back(std::move(ssd));
  }
  return tiers;
}

StatusOr<std::unique_ptr<KvStore>> KvStore::Open(const StoreOptions& options, const Clock* clock) {
  ATTIC_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Tier>> tiers, LocalTiers(options));
  return Open(options, std::move(tiers), clock);
}

StatusOr<std::unique_ptr<KvStore>> KvStore::Open(const StoreOptions& options, std::unique_ptr<Tier> dram,
                                                 std::unique_ptr<Tier> ssd, const Clock* clock) {
  if (dram == nullptr) return InvalidArgumentError("KV store needs a DRAM tier");
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::move(dram));
  if (ssd != nullptr) tiers.push_back(std::move(ssd));
  return Open(options, std::move(tiers), clock);
}

StatusOr<std::unique_ptr<KvStore>> KvStore::Open(const StoreOptions& options, std::vector<std::unique_ptr<Tier>> tiers,
                                                 const Clock* clock) {
  if (options.fingerprint.empty()) return InvalidArgumentError("KV store needs the model fingerprint");
  if (options.prefix_block <= 0) return InvalidArgumentError("prefix_block must be positive");
  if (tiers.empty() || std::any_of(tiers.begin(), tiers.end(), [](const auto& t) { return t == nullptr; }))
    return InvalidArgumentError("KV store needs its tiers (none null)");
  std::unique_ptr<KvStore> store(
      new KvStore(options, std::move(tiers), clock != nullptr ? clock : SystemClock::Default()));
  ATTIC_RETURN_IF_ERROR(store->Rebuild());
  return store;
}

namespace {
std::vector<TierTraits> TraitsOf(const std::vector<std::unique_ptr<Tier>>& tiers) {
  std::vector<TierTraits> out;
  for (const auto& t : tiers) out.push_back(t->traits());
  return out;
}
}  // namespace

KvStore::KvStore(const StoreOptions& options, std::vector<std::unique_ptr<Tier>> tiers, const Clock* clock)
    : options_(options),
      clock_(clock),
      tiers_(std::move(tiers)),
      traits_(TraitsOf(tiers_)),
      any_shared_(std::any_of(traits_.begin(), traits_.end(), [](const TierTraits& t) { return t.shared; })),
      policy_(MakePolicy(options.policy)),
      prefetch_(MakePrefetchPolicy(options.policy)) {
  for (const auto& t : tiers_) stats_.tiers.push_back(StoreStats::Tier{t->name()});
  if (options_.reserve_dram == DramReserve::kAtOpen) {
    ProgressReporter progress("reserving KV store DRAM", /*min_total=*/256 << 20);
    reserved_ = Bytes::Reserve(options_.dram_bytes + options_.write_buffer_bytes, progress.Callback());
    progress.Finish();
  } else if (options_.reserve_dram == DramReserve::kOnDemand) {
    reserved_ = Bytes::ReserveOnDemand(options_.dram_bytes + options_.write_buffer_bytes);
  }
  if (options_.write_buffer_bytes > 0) writer_ = StartNamedThread("attic-writer", [this] { WriterLoop(); });
  if (n_tiers() > 1 && prefetch_->promotes())
    prefetcher_ = StartNamedThread("attic-prefetch", [this] { PrefetchLoop(); });
}

KvStore::~KvStore() {
  // Streamed reads still queued or running fail (Cancelled), releasing a load that
  // waits for them; then the loader, whose thread may be fetching for the read buffer.
  {
    std::lock_guard<std::mutex> lock(smu_);
    stop_streamer_ = true;
  }
  scv_.notify_all();
  if (streamer_.joinable()) streamer_.join();
  loader_.reset();
  {
    std::lock_guard<std::mutex> lock(pmu_);
    stop_prefetcher_ = true;
  }
  pcv_.notify_all();
  if (prefetcher_.joinable()) prefetcher_.join();
  {
    std::lock_guard<std::mutex> lock(wmu_);
    stop_writer_ = true;
  }
  wcv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

Status KvStore::Rebuild() {
  // At open: nothing else uses the store yet, so tier I/O under the locks is fine.
  std::lock_guard<std::mutex> placing(place_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  StoreOpenReport& report = open_report_;
  for (const auto& t : tiers_) {
    const auto* ssd = dynamic_cast<const SsdTier*>(t.get());
    if (ssd == nullptr) continue;
    const SsdScan& scan = ssd->scan();
    report.ssd_root = scan.root;
    report.ssd_dir = scan.dir;
    report.ssd_created = scan.created;
    report.removed_temp_files = scan.removed_temp_files;
    report.other_model_entries = scan.other_model_entries;
    report.other_model_bytes = scan.other_model_bytes;
    report.other_models = scan.other_models;
    report.foreign = scan.foreign;
    report.foreign_example = scan.foreign_example;
    break;
  }
  for (int level = 0; level < n_tiers(); ++level) {
    Tier* tier = tiers_[level].get();
    if (!traits_[level].enumerable) continue;  // its entries are found when read, not listed
    std::vector<std::string> keys = tier->Keys();
    std::sort(keys.begin(), keys.end());
    for (const std::string& key : keys) {
      // Verified in place: only the header is kept.
      StatusOr<Fetched> read = ReadChecked(*tier, key, true);
      if (!read.ok()) {
        const ReadError kind = ClassifyReadError(read.status());
        if (kind == ReadError::kVanished) continue;
        if (kind == ReadError::kTransient) {  // not indexed now; the bytes stay where they are
          Log(LogLevel::kWarn, "KV store: cannot read entry %s from the %s tier now (%s): not restored", key.c_str(),
              tier->name().c_str(), read.status().ToString().c_str());
          continue;
        }
      }
      auto dup = entries_.find(key);
      if (read.ok() && dup != entries_.end() && traits_[level].shared && dup->second.copy_level < 0) {
        dup->second.copy_level = level;  // a shared tier's copy of an entry found above it
        continue;
      }
      if (!read.ok() || dup != entries_.end()) {
        // Corrupt, truncated, misnamed (e.g. another model's bytes under this model's
        // name) or duplicated: never served. (The SSD tier lists only this model's
        // entry files: nothing else is ever read or removed.)
        Log(LogLevel::kWarn, "KV store: removing corrupt entry %s from the %s tier (%s)", key.c_str(),
            tier->name().c_str(), read.ok() ? "duplicated" : read.status().ToString().c_str());
        tier->Erase(key).IgnoreError();
        ++stats_.corrupt;
        ++report.removed_corrupt;
        continue;
      }
      EntryInfo info = internal::ReadEntryInfo(key, read->header.meta, read->bytes->size(), level);
      info.inserted_seq = info.access_seq = ++seq_;
      if (Expired(info)) {
        tier->Erase(key).IgnoreError();
        ++stats_.expired;
        ++report.removed_expired;
        continue;
      }
      IndexLocked(std::move(info));
    }
  }
  // Capacities may have shrunk since the files were written.
  const size_t before = entries_.size();
  for (int level = 0; level < n_tiers(); ++level) {
    if (traits_[level].evicts_itself || tiers_[level]->bytes() <= tiers_[level]->capacity()) continue;
    ATTIC_RETURN_IF_ERROR(MakeRoom(lock, level, 0, ""));
  }
  report.evicted = before - entries_.size();
  for (const auto& [k, e] : entries_) {
    if (e.tier == TierLevel::kDram) {
      ++report.dram_entries;
      report.dram_bytes += e.bytes;
    } else if (e.tier == TierLevel::kSsd) {
      ++report.ssd_entries;
      report.ssd_bytes += e.bytes;
    }
  }
  return OkStatus();
}

namespace {

std::string ByteSize(uint64_t n) {
  char buf[32];
  const double x = static_cast<double>(n);
  if (n >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", x / (1ull << 30));
  } else if (n >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", x / (1ull << 20));
  } else if (n >= (1ull << 10)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", x / (1ull << 10));
  } else {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(n));
  }
  return buf;
}

std::string Count(uint64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

std::string FormatOpenReport(const StoreOpenReport& r) {
  std::string line = "KV store: ";
  const uint64_t restored = r.dram_entries + r.ssd_entries;
  if (r.ssd_root.empty()) {
    if (restored == 0) return line + "no SSD tier (--kv-ssd-dir): nothing restored";
    return line + "restored " + Count(restored, "entry", "entries") + " (" + ByteSize(r.dram_bytes + r.ssd_bytes) + ")";
  }
  if (r.ssd_created) {
    line += "new store in " + r.ssd_root + " (this model's entries go to " + r.ssd_dir + ")";
  } else if (restored == 0) {
    line += "no entries of this model in " + r.ssd_dir;
  } else {
    line += "restored " + Count(r.ssd_entries, "entry", "entries") + " (" + ByteSize(r.ssd_bytes) + ") from SSD " +
            r.ssd_dir;
    if (r.dram_entries > 0)
      line += " and " + Count(r.dram_entries, "entry", "entries") + " (" + ByteSize(r.dram_bytes) + ") in DRAM";
  }
  if (r.removed_temp_files > 0)
    line += "; removed " + Count(r.removed_temp_files, "stale temporary file", "stale temporary files");
  if (r.removed_corrupt > 0) line += "; removed " + Count(r.removed_corrupt, "corrupt entry", "corrupt entries");
  if (r.removed_expired > 0) line += "; removed " + Count(r.removed_expired, "expired entry", "expired entries");
  if (r.evicted > 0) line += "; evicted " + Count(r.evicted, "entry", "entries") + " over --kv-ssd-bytes";
  if (r.other_model_entries > 0)
    line += "; kept " + Count(r.other_model_entries, "entry", "entries") + " of " +
            Count(r.other_models, "other model", "other models") + " (" + ByteSize(r.other_model_bytes) +
            ", not counted against --kv-ssd-bytes)";
  if (r.foreign > 0)
    line += "; ignored " + Count(r.foreign, "file", "files") + " not Attic's (e.g. '" + r.foreign_example +
            "'), left untouched";
  return line;
}

StatusOr<SessionInfo> KvStore::GetSession(const std::string& tenant, const std::string& session_id) {
  AwaitQueuedSaves(tenant, session_id, nullptr, /*wait=*/true);
  std::unique_lock<std::mutex> lock(mu_);
  auto s = sessions_.find(SessionKey(tenant, session_id));
  if (s == sessions_.end()) return NotFoundError("no stored session '" + session_id + "'");
  auto it = entries_.find(s->second);
  ATTIC_CHECK(it != entries_.end());
  if (Expired(it->second)) {
    const std::string key = s->second;
    lock.unlock();
    if (RemoveIf(key, [&](const EntryInfo& e) { return Expired(e); })) {
      std::lock_guard<std::mutex> relock(mu_);
      ++stats_.expired;
    }
    return NotFoundError("session '" + session_id + "' expired");
  }
  const EntryInfo& e = it->second;
  SessionInfo info;
  info.key = e.key;
  info.tenant = e.tenant;
  info.session_id = e.session_id;
  info.n_tokens = static_cast<int>(e.tokens.size());
  info.bytes = e.bytes;
  info.tier = e.tier;
  info.expires_at_ms = e.expires_at_ms;
  return info;
}

StatusOr<std::vector<int32_t>> KvStore::SessionTokens(const std::string& tenant, const std::string& session_id) {
  AwaitQueuedSaves(tenant, session_id, nullptr, /*wait=*/true);
  std::lock_guard<std::mutex> lock(mu_);
  auto s = sessions_.find(SessionKey(tenant, session_id));
  if (s == sessions_.end()) return NotFoundError("no stored session '" + session_id + "'");
  const EntryInfo& e = entries_.at(s->second);
  if (Expired(e)) return NotFoundError("session '" + session_id + "' expired");
  return e.tokens;
}

Status KvStore::EraseSession(const std::string& tenant, const std::string& session_id) {
  AwaitQueuedSaves(tenant, session_id, nullptr, /*wait=*/true);
  std::lock_guard<std::mutex> placing(place_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  auto s = sessions_.find(SessionKey(tenant, session_id));
  if (s == sessions_.end()) return NotFoundError("no stored session '" + session_id + "'");
  Unindex(std::string(s->second));
  EraseDoomed(lock);
  return OkStatus();
}

std::vector<SessionInfo> KvStore::ListSessions(const std::string& tenant) {
  AwaitQueuedSaves(tenant, "", nullptr, /*wait=*/true);
  std::vector<SessionInfo> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string prefix = SessionKey(tenant, "");
    for (const auto& [session_key, key] : sessions_) {
      if (session_key.compare(0, prefix.size(), prefix) != 0) continue;
      const EntryInfo& e = entries_.at(key);
      if (Expired(e)) continue;  // freed by ExpireNow or when met
      out.push_back(SessionInfo{e.key, e.tenant, e.session_id, static_cast<int>(e.tokens.size()), e.bytes, e.tier,
                                e.expires_at_ms});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const SessionInfo& a, const SessionInfo& b) { return a.session_id < b.session_id; });
  return out;
}

int KvStore::ExpireNow() {
  {
    // The step loop calls this every second: it waits for a placement in progress (a
    // demotion's write) only when there is something to free.
    std::lock_guard<std::mutex> lock(mu_);
    if (std::none_of(entries_.begin(), entries_.end(), [&](const auto& e) { return Expired(e.second); })) return 0;
  }
  std::lock_guard<std::mutex> placing(place_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<std::string> dead;
  for (const auto& [k, e] : entries_)
    if (Expired(e)) dead.push_back(k);
  for (const std::string& k : dead) Unindex(k);
  stats_.expired += dead.size();
  EraseDoomed(lock);
  return static_cast<int>(dead.size());
}

StoreStats KvStore::Stats() const {
  StoreStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
    s.entries = entries_.size();
  }
  s.corrupt_attachments = corrupt_attachments_.load();
  // Asked of the tiers without the store's lock (a remote tier's answer is I/O).
  for (int level = 0; level < n_tiers(); ++level) {
    s.tiers[level].bytes = tiers_[level]->bytes();
    s.tiers[level].capacity = tiers_[level]->capacity();
  }
  s.dram_bytes = s.tiers[0].bytes;
  s.dram_capacity = s.tiers[0].capacity;
  s.hits_dram = s.tiers[0].hits;
  s.evictions_dram = s.tiers[0].evictions;
  if (n_tiers() > 1) {
    s.ssd_bytes = s.tiers[1].bytes;
    s.ssd_capacity = s.tiers[1].capacity;
    s.hits_ssd = s.tiers[1].hits;
    s.evictions_ssd = s.tiers[1].evictions;
  }
  const ReadBufferStats rb = ReadBuffer();
  s.staged = rb.staged;
  s.staged_used = rb.staged_used;
  s.fetch_seconds = rb.fetch_seconds;
  s.t_load_per_token = rb.t_load_per_token;
  s.t_prefill_per_token = rb.t_prefill_per_token;
  s.turn_bytes = turn_bytes_.load();
  s.turns_over_budget = turns_over_budget_.load();
  std::lock_guard<std::mutex> wlock(wmu_);  // the write-buffer side (never nested in mu_)
  s.async_saves = async_saves_;
  s.save_waits = save_waits_;
  s.save_wait_ms = save_wait_ms_;
  s.lookup_waits = lookup_waits_;
  s.lookup_wait_ms = lookup_wait_ms_;
  s.pending_saves = pending_.size() + (writing_ != nullptr ? 1 : 0);
  return s;
}

}  // namespace attic::store
