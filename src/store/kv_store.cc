#include "attic/store/kv_store.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "attic/core/hash.h"
#include "attic/core/log.h"
#include "attic/core/progress.h"
#include "attic/core/thread_name.h"
#include "attic/store/prefix_match.h"

namespace attic::store {

namespace {

std::string SessionKey(const std::string& tenant, const std::string& session_id) {
  return tenant + std::string(1, '\0') + session_id;
}

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

StatusOr<std::unique_ptr<KvStore>> KvStore::Open(const StoreOptions& options, const Clock* clock) {
  if (options.fingerprint.empty()) return InvalidArgumentError("KV store needs the model fingerprint");
  std::unique_ptr<Tier> ssd;
  if (!options.ssd_dir.empty()) {
    ATTIC_ASSIGN_OR_RETURN(ssd, SsdTier::Open(options.ssd_dir, options.fingerprint, options.ssd_bytes));
  }
  return Open(options, std::make_unique<DramTier>(options.dram_bytes), std::move(ssd), clock);
}

StatusOr<std::unique_ptr<KvStore>> KvStore::Open(const StoreOptions& options, std::unique_ptr<Tier> dram,
                                                 std::unique_ptr<Tier> ssd, const Clock* clock) {
  if (options.fingerprint.empty()) return InvalidArgumentError("KV store needs the model fingerprint");
  if (options.prefix_block <= 0) return InvalidArgumentError("prefix_block must be positive");
  if (dram == nullptr) return InvalidArgumentError("KV store needs a DRAM tier");
  std::unique_ptr<KvStore> store(
      new KvStore(options, std::move(dram), std::move(ssd), clock != nullptr ? clock : SystemClock::Default()));
  ATTIC_RETURN_IF_ERROR(store->Rebuild());
  return store;
}

KvStore::KvStore(const StoreOptions& options, std::unique_ptr<Tier> dram, std::unique_ptr<Tier> ssd,
                 const Clock* clock)
    : options_(options), clock_(clock), dram_(std::move(dram)), ssd_(std::move(ssd)), policy_(MakePolicy(options.policy)) {
  if (options_.reserve_dram) {
    ProgressReporter progress("reserving KV store DRAM", /*min_total=*/256 << 20);
    reserved_ = Bytes::Reserve(options_.dram_bytes + options_.write_buffer_bytes, progress.Callback());
    progress.Finish();
  }
  if (options_.write_buffer_bytes > 0) writer_ = StartNamedThread("attic-writer", [this] { WriterLoop(); });
  if (ssd_ != nullptr && options_.policy == PolicyKind::kSchedulerAware)
    prefetcher_ = StartNamedThread("attic-prefetch", [this] { PrefetchLoop(); });
}

KvStore::~KvStore() {
  loader_.reset();  // its thread may be fetching for the read buffer: joined first
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

namespace {
uint64_t EntryKvBytes(const KvEntry& e) {
  uint64_t n = 0;
  for (const auto& x : e.k) n += x.size() * sizeof(float);
  for (const auto& x : e.v) n += x.size() * sizeof(float);
  return n;
}
}  // namespace

std::shared_ptr<const KvEntry> KvStore::SaveAsync(KvEntry entry, const std::string& replaces, int64_t ttl_ms) {
  Stamp(&entry, ttl_ms);  // the TTL runs from the end of the turn
  auto shared = std::make_shared<const KvEntry>(std::move(entry));
  if (!writer_.joinable()) {
    Status st = Place(*shared, replaces);
    if (!st.ok()) std::fprintf(stderr, "attic: KV store: save failed: %s\n", st.ToString().c_str());
    return shared;
  }
  PendingSave p;
  p.bytes = EntryKvBytes(*shared);
  p.entry = shared;
  p.replaces = replaces;
  std::unique_lock<std::mutex> lock(wmu_);
  if (pending_bytes_ + p.bytes > options_.write_buffer_bytes && !pending_.empty()) {
    ++save_waits_;
    const auto t0 = std::chrono::steady_clock::now();
    wcv_.wait(lock, [&] { return pending_.empty() || pending_bytes_ + p.bytes <= options_.write_buffer_bytes; });
    save_wait_ms_ += MsSince(t0);
  }
  pending_bytes_ += p.bytes;
  ++pending_tenants_[p.entry->tenant];
  if (!p.entry->session_id.empty()) ++pending_tenants_[SessionKey(p.entry->tenant, p.entry->session_id)];
  pending_.push_back(std::move(p));
  wcv_.notify_all();
  return shared;
}

// REQUIRES: wmu_ held.
void KvStore::SetWriterUrgentLocked(bool urgent) {
  if (urgent == writer_urgent_ || writer_tid_ == 0 || options_.writer_nice == 0) return;
  // Raising a thread's priority back may be refused (no CAP_SYS_NICE, RLIMIT_NICE): the
  // save then just keeps its background priority.
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(writer_tid_), urgent ? 0 : options_.writer_nice) == 0)
    writer_urgent_ = urgent;
}

void KvStore::WriterLoop() {
  std::unique_lock<std::mutex> lock(wmu_);
  writer_tid_ = static_cast<int>(syscall(SYS_gettid));
  if (options_.writer_nice != 0)  // best effort: a refused lower priority only costs overlap
    setpriority(PRIO_PROCESS, static_cast<id_t>(writer_tid_), options_.writer_nice);
  for (;;) {
    if (pending_.empty()) SetWriterUrgentLocked(false);  // nobody waits on a save now
    wcv_.wait(lock, [&] { return stop_writer_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, and everything is written
    PendingSave p = std::move(pending_.front());
    pending_.pop_front();
    writing_ = p.entry;
    lock.unlock();
    const std::string tenant = p.entry->tenant;
    const std::string session =
        p.entry->session_id.empty() ? std::string() : SessionKey(p.entry->tenant, p.entry->session_id);
    if (options_.before_async_save) options_.before_async_save();
    Status st = Place(*p.entry, p.replaces);
    if (!st.ok()) std::fprintf(stderr, "attic: KV store: save failed: %s\n", st.ToString().c_str());
    lock.lock();
    writing_.reset();
    pending_bytes_ -= p.bytes;
    if (--pending_tenants_[tenant] == 0) pending_tenants_.erase(tenant);
    if (!session.empty() && --pending_tenants_[session] == 0) pending_tenants_.erase(session);
    ++async_saves_;
    wcv_.notify_all();
  }
}

// With a session id only that session's queued saves matter (its entry is what the
// caller reads; a concurrent save of another session only adds a prefix candidate), so
// one conversation's lookup does not wait for every other conversation's save. Without
// one, only the tenant's queued saves that share a longer prefix with the request than
// the stored entries do.
bool KvStore::AwaitedLocked(const std::string& tenant, const std::string& session_id,
                            const std::vector<int32_t>* tokens, int stored) const {
  if (!session_id.empty()) return pending_tenants_.count(SessionKey(tenant, session_id)) != 0;
  if (tokens == nullptr) return pending_tenants_.count(tenant) != 0;
  auto extends = [&](const std::shared_ptr<const KvEntry>& e) {
    return e != nullptr && e->tenant == tenant && CommonPrefix(e->tokens, *tokens) > stored;
  };
  if (extends(writing_)) return true;
  return std::any_of(pending_.begin(), pending_.end(), [&](const PendingSave& p) { return extends(p.entry); });
}

int KvStore::StoredPrefix(const std::string& tenant, const std::vector<int32_t>& tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  return FindEntryLocked(tenant, "", tokens, &n) != nullptr ? n : 0;
}

bool KvStore::AwaitQueuedSaves(const std::string& tenant, const std::string& session_id,
                               const std::vector<int32_t>* tokens, bool wait) {
  {
    // Nothing queued for the session (or tenant): no prefix search.
    std::lock_guard<std::mutex> lock(wmu_);
    if (pending_tenants_.count(session_id.empty() ? tenant : SessionKey(tenant, session_id)) == 0) return false;
  }
  const int stored = session_id.empty() && tokens != nullptr ? StoredPrefix(tenant, *tokens) : 0;
  std::unique_lock<std::mutex> lock(wmu_);
  if (!AwaitedLocked(tenant, session_id, tokens, stored)) return false;
  SetWriterUrgentLocked(true);  // somebody waits for it: no longer background work
  if (!wait) return true;
  ++lookup_waits_;
  const auto t0 = std::chrono::steady_clock::now();
  wcv_.wait(lock, [&] { return !AwaitedLocked(tenant, session_id, tokens, stored); });
  lookup_wait_ms_ += MsSince(t0);
  return true;
}

bool KvStore::SavePending(const std::string& tenant, const std::string& session_id,
                          const std::vector<int32_t>& tokens) {
  return AwaitQueuedSaves(tenant, session_id, &tokens, false);
}

std::shared_ptr<const KvEntry> KvStore::ReadQueuedSave(const std::string& tenant, const std::string& session_id,
                                                       const std::vector<int32_t>& tokens, int* n_common) const {
  if (session_id.empty()) return nullptr;
  std::lock_guard<std::mutex> lock(wmu_);
  if (pending_tenants_.count(SessionKey(tenant, session_id)) == 0) return nullptr;
  auto mine = [&](const std::shared_ptr<const KvEntry>& e) {
    return e != nullptr && e->tenant == tenant && e->session_id == session_id;
  };
  std::shared_ptr<const KvEntry> newest = writing_;  // queued saves are newer than it
  for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
    if (mine(it->entry)) {
      newest = it->entry;
      break;
    }
  }
  if (!mine(newest)) return nullptr;
  const int n = CommonPrefix(newest->tokens, tokens);
  if (n == 0) return nullptr;
  *n_common = n;
  return newest;
}

void KvStore::RecordWriteBufferHit() {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.lookups;
  ++stats_.hits_dram;
  ++stats_.write_buffer_hits;
}

void KvStore::Flush() {
  std::unique_lock<std::mutex> lock(wmu_);
  wcv_.wait(lock, [&] { return pending_.empty() && writing_ == nullptr; });
}

Status KvStore::Rebuild() {
  std::lock_guard<std::mutex> lock(mu_);
  StoreOpenReport& report = open_report_;
  if (const auto* ssd = dynamic_cast<const SsdTier*>(ssd_.get())) {
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
  }
  for (Tier* tier : {dram_.get(), ssd_.get()}) {
    if (tier == nullptr) continue;
    std::vector<std::string> keys = tier->Keys();
    std::sort(keys.begin(), keys.end());
    for (const std::string& key : keys) {
      // Verified in place: only the header is kept.
      StatusOr<Fetched> read = ReadChecked(*tier, key, true);
      if (!read.ok() || entries_.count(key) != 0) {
        // Corrupt, truncated, misnamed (e.g. another model's bytes under this model's
        // name) or duplicated: never served. (The SSD tier lists only this model's
        // entry files: nothing else is ever read or removed.)
        Log(LogLevel::kWarn, "KV store: removing corrupt entry %s from the %s tier (%s)", key.c_str(),
            TierName(tier->level()), read.ok() ? "duplicated" : read.status().ToString().c_str());
        tier->Erase(key).IgnoreError();
        ++stats_.corrupt;
        ++report.removed_corrupt;
        continue;
      }
      KvEntry& entry = read->header.meta;
      EntryInfo info;
      info.key = key;
      info.tenant = entry.tenant;
      info.session_id = entry.session_id;
      info.tokens = std::move(entry.tokens);
      info.bytes = read->bytes->size();
      info.tier = tier->level();
      info.expires_at_ms = entry.expires_at_ms;
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
  if (ssd_ != nullptr && ssd_->bytes() > ssd_->capacity()) {
    const uint64_t before = stats_.evictions_ssd;
    ATTIC_RETURN_IF_ERROR(MakeRoomLocked(TierLevel::kSsd, 0, ""));
    report.evicted = stats_.evictions_ssd - before;
  }
  for (const auto& [k, e] : entries_) {
    (e.tier == TierLevel::kDram ? report.dram_entries : report.ssd_entries) += 1;
    (e.tier == TierLevel::kDram ? report.dram_bytes : report.ssd_bytes) += e.bytes;
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

bool KvStore::Expired(const EntryInfo& e) const { return e.expires_at_ms != 0 && e.expires_at_ms <= clock_->NowMs(); }

std::vector<uint64_t> KvStore::PrefixHashes(const std::string& tenant, const std::vector<int32_t>& tokens) const {
  const size_t b = static_cast<size_t>(options_.prefix_block);
  std::vector<uint64_t> out;
  uint64_t h = Hash64(tenant, 0x7465);
  for (size_t end = b; end <= tokens.size(); end += b) {
    h = Hash64(tokens.data() + end - b, b * sizeof(int32_t), h);
    out.push_back(h);
  }
  return out;
}

void KvStore::IndexLocked(EntryInfo info) {
  if (!info.session_id.empty()) sessions_[SessionKey(info.tenant, info.session_id)] = info.key;
  for (uint64_t h : PrefixHashes(info.tenant, info.tokens)) prefixes_[h].insert(info.key);
  std::string key = info.key;
  entries_[key] = std::move(info);
}

void KvStore::RemoveLocked(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  const EntryInfo& e = it->second;
  if (!e.session_id.empty()) {
    auto s = sessions_.find(SessionKey(e.tenant, e.session_id));
    if (s != sessions_.end() && s->second == key) sessions_.erase(s);
  }
  for (uint64_t h : PrefixHashes(e.tenant, e.tokens)) {
    auto p = prefixes_.find(h);
    if (p == prefixes_.end()) continue;
    p->second.erase(key);
    if (p->second.empty()) prefixes_.erase(p);
  }
  TierFor(e.tier)->Erase(key).IgnoreError();
  if (e.ssd_copy && e.tier != TierLevel::kSsd) ssd_->Erase(key).IgnoreError();
  entries_.erase(it);
}

std::optional<StoreMatch> KvStore::FindLocked(const std::string& tenant, const std::string& session_id,
                                              const std::vector<int32_t>& tokens) {
  int n = 0;
  const EntryInfo* best = FindEntryLocked(tenant, session_id, tokens, &n);
  if (best == nullptr) return std::nullopt;
  StoreMatch m;
  m.key = best->key;
  m.n_tokens = n;
  m.entry_tokens = static_cast<int>(best->tokens.size());
  m.tier = best->tier;
  return m;
}

EntryInfo* KvStore::FindEntryLocked(const std::string& tenant, const std::string& session_id,
                                    const std::vector<int32_t>& tokens, int* n_tokens) {
  BestPrefixMatch<EntryInfo*> best;
  auto consider = [&](const std::string& key) {
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.tenant != tenant || Expired(it->second)) return;
    EntryInfo& e = it->second;
    best.Offer(&e, {CommonPrefix(e.tokens, tokens), !session_id.empty() && e.session_id == session_id, e.access_seq});
  };
  if (!session_id.empty()) {
    auto s = sessions_.find(SessionKey(tenant, session_id));
    if (s != sessions_.end()) consider(s->second);
  }
  std::vector<uint64_t> hashes = PrefixHashes(tenant, tokens);
  // The chain hash of a longer prefix implies all shorter ones: the deepest level
  // present holds the longest block-aligned matches.
  const std::unordered_set<std::string>* deepest = nullptr;
  for (uint64_t h : hashes) {
    auto p = prefixes_.find(h);
    if (p == prefixes_.end()) break;
    deepest = &p->second;
  }
  if (deepest != nullptr)
    for (const std::string& key : *deepest) consider(key);
  if (!best.found()) return nullptr;
  *n_tokens = best.common();
  return best.item();
}

std::optional<StoreMatch> KvStore::Lookup(const std::string& tenant, const std::string& session_id,
                                          const std::vector<int32_t>& tokens) {
  AwaitQueuedSaves(tenant, session_id, &tokens, /*wait=*/true);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.lookups;
  auto m = FindLocked(tenant, session_id, tokens);
  if (!m) {
    ++stats_.misses;
  } else if (m->tier == TierLevel::kDram) {
    ++stats_.hits_dram;
    EntryInfo& e = entries_.at(m->key);
    if (e.prefetched) {  // the job it was prefetched for (or a later one) reads it from DRAM
      e.prefetched = false;
      ++stats_.prefetches_useful;
    }
  } else {
    ++stats_.hits_ssd;
  }
  return m;
}

StatusOr<KvEntry> KvStore::Load(const std::string& key) {
  ATTIC_ASSIGN_OR_RETURN(Fetched f, Fetch(key));
  return MaterializeEntry(*f.bytes, std::move(f.header));
}

bool KvStore::PromoteLocked(const std::string& key, SharedBytes bytes) {
  EntryInfo& info = entries_.at(key);
  const uint64_t size = bytes->size();
  // The SSD file stays (inclusive tiers), as a droppable copy: when DRAM victims demoted
  // to make room need SSD space, it goes first, so they take its place instead of pushing
  // another entry out of the SSD tier.
  info.ssd_copy = true;
  bool lost = false;
  if (MakeRoomLocked(TierLevel::kDram, size, key, &info, &lost).ok() && !lost && dram_->PutShared(key, bytes).ok()) {
    info.tier = TierLevel::kDram;  // ssd_copy: whether its file survived the room-making
    stats_.bytes_ssd_to_dram += size;
    return true;
  }
  const bool file_kept = info.ssd_copy;
  info.ssd_copy = false;
  if (file_kept) return false;  // stays on SSD
  lost = false;
  if (MakeRoomLocked(TierLevel::kSsd, size, key, &info, &lost).ok() && !lost && ssd_->PutShared(key, bytes).ok())
    return false;  // stays on SSD
  RemoveLocked(key);
  ++stats_.evictions_ssd;
  return false;
}

void KvStore::Stamp(KvEntry* entry, int64_t ttl_ms) const {
  if (entry->fingerprint.empty()) entry->fingerprint = options_.fingerprint;
  const int64_t ttl = ttl_ms < 0 ? options_.default_ttl_ms : ttl_ms;
  entry->expires_at_ms = ttl == 0 ? 0 : clock_->NowMs() + ttl;
}

Status KvStore::Save(KvEntry entry, const std::string& replaces, int64_t ttl_ms) {
  Stamp(&entry, ttl_ms);
  return Place(entry, replaces);
}

Status KvStore::Place(const KvEntry& entry, const std::string& replaces) {
  if (entry.fingerprint != options_.fingerprint) return InvalidArgumentError("KV entry of another model");
  ATTIC_ASSIGN_OR_RETURN(std::unique_ptr<Bytes> serialized, SerializeEntryBytes(entry));
  SharedBytes bytes(std::move(serialized));
  const std::string key = entry.key().ToString();

  std::lock_guard<std::mutex> lock(mu_);
  uint64_t inserted = 0;
  const uint64_t size = bytes->size();
  auto drop = [&](const std::string& k) {
    auto it = entries_.find(k);
    if (it == entries_.end()) return;
    inserted = inserted == 0 ? it->second.inserted_seq : std::min(inserted, it->second.inserted_seq);
    RemoveLocked(k);
  };
  if (!entry.session_id.empty()) {
    auto s = sessions_.find(SessionKey(entry.tenant, entry.session_id));
    if (s != sessions_.end()) drop(std::string(s->second));
  }
  if (!replaces.empty()) drop(replaces);
  drop(key);

  EntryInfo info;
  info.key = key;
  info.tenant = entry.tenant;
  info.session_id = entry.session_id;
  info.tokens = entry.tokens;  // the entry may be shared (a queued save's readers)
  info.bytes = size;
  info.expires_at_ms = entry.expires_at_ms;
  info.access_seq = ++seq_;
  // A session keeps its place in FIFO order across turns.
  info.inserted_seq = inserted != 0 ? inserted : info.access_seq;
  // The first queued job of the session whose prompt extends the new entry will read it
  // (the hint named the old entry). Not the job that produced it: its prompt is shorter.
  if (!info.session_id.empty())
    for (size_t i = 0; i < queue_.size(); ++i) {
      const QueuedJob& j = queue_[i];
      if (j.session_id != info.session_id || j.tenant != info.tenant) continue;
      if (CommonPrefix(*j.tokens, info.tokens) == static_cast<int>(info.tokens.size()))
        info.queue_position = static_cast<int>(i);
      break;
    }

  // DRAM first; an entry that does not fit there (or, under a policy that ranks
  // newcomers, would be DRAM's own victim) goes to SSD; one that would be the SSD's
  // victim too is not kept.
  Status st = ResourceExhaustedError("KV entry of " + std::to_string(size) + " bytes fits no tier");
  bool lost = false, placed = false;
  if (size <= dram_->capacity()) {
    st = MakeRoomLocked(TierLevel::kDram, size, key, &info, &lost);
    if (st.ok() && !lost) {
      st = dram_->PutShared(key, bytes);
      placed = st.ok();
      info.tier = TierLevel::kDram;
    }
  }
  if (!placed && ssd_ != nullptr && size <= ssd_->capacity()) {
    lost = false;
    st = MakeRoomLocked(TierLevel::kSsd, size, key, &info, &lost);
    if (st.ok() && !lost) {
      st = ssd_->PutShared(key, bytes);
      placed = st.ok();
      info.tier = TierLevel::kSsd;
    }
  }
  if (!placed) {
    if (!lost) return st;
    ++stats_.saves_not_kept;  // every stored entry is wanted sooner (scheduler-aware)
    return OkStatus();
  }
  IndexLocked(std::move(info));
  ++stats_.saves;
  stats_.bytes_saved += size;
  return OkStatus();
}

Status KvStore::MakeRoomLocked(TierLevel level, uint64_t need, const std::string& pinned,
                               const EntryInfo* newcomer, bool* newcomer_lost) {
  Tier* tier = TierFor(level);
  if (tier == nullptr || need > tier->capacity()) return ResourceExhaustedError("entry larger than the tier");
  const bool rank_newcomer = newcomer != nullptr && newcomer_lost != nullptr && policy_->RanksNewcomer();
  if (newcomer_lost != nullptr) *newcomer_lost = false;
  if (level == TierLevel::kSsd) {  // SSD copies of promoted entries go before any entry
    for (auto& [k, e] : entries_) {
      if (tier->bytes() + need <= tier->capacity()) break;
      if (!e.ssd_copy) continue;
      ssd_->Erase(k).IgnoreError();
      e.ssd_copy = false;
    }
  }
  while (tier->bytes() + need > tier->capacity()) {
    std::vector<const EntryInfo*> candidates;
    for (const auto& [k, e] : entries_)
      if (e.tier == level && k != pinned && &e != newcomer) candidates.push_back(&e);
    if (candidates.empty()) return ResourceExhaustedError(std::string(TierName(level)) + " tier cannot make room");
    if (rank_newcomer) candidates.push_back(newcomer);
    const EntryInfo* victim = policy_->PickVictim(level, candidates, hint_);
    ATTIC_CHECK(victim != nullptr);
    if (rank_newcomer && victim == newcomer) {
      *newcomer_lost = true;
      return OkStatus();
    }
    std::string vkey = victim->key;
    EntryInfo& v = entries_.at(vkey);
    if (level == TierLevel::kDram) {
      ++stats_.evictions_dram;
      v.prefetched = false;
      bool demoted = false;
      if (v.ssd_copy) {  // its bytes are still on SSD: nothing to write
        dram_->Erase(vkey).IgnoreError();
        v.tier = TierLevel::kSsd;
        v.ssd_copy = false;
        demoted = true;
      } else if (ssd_ != nullptr && v.bytes <= ssd_->capacity()) {
        // The demoted entry is itself a newcomer on SSD: under the scheduler-aware
        // policy it is dropped rather than displace an SSD entry needed sooner.
        auto bytes = dram_->GetShared(vkey);
        bool lost = false;
        if (bytes.ok() && MakeRoomLocked(TierLevel::kSsd, (*bytes)->size(), pinned, &v, &lost).ok() && !lost &&
            ssd_->PutShared(vkey, *bytes).ok()) {
          dram_->Erase(vkey).IgnoreError();
          v.tier = TierLevel::kSsd;
          stats_.bytes_dram_to_ssd += (*bytes)->size();
          demoted = true;
        }
      }
      if (!demoted) RemoveLocked(vkey);
    } else {
      ++stats_.evictions_ssd;
      RemoveLocked(vkey);
    }
  }
  return OkStatus();
}

void KvStore::RecordReuse(int n_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.reused_tokens += static_cast<uint64_t>(std::max(0, n_tokens));
}

StatusOr<SessionInfo> KvStore::GetSession(const std::string& tenant, const std::string& session_id) {
  AwaitQueuedSaves(tenant, session_id, nullptr, /*wait=*/true);
  std::lock_guard<std::mutex> lock(mu_);
  auto s = sessions_.find(SessionKey(tenant, session_id));
  if (s == sessions_.end()) return NotFoundError("no stored session '" + session_id + "'");
  auto it = entries_.find(s->second);
  ATTIC_CHECK(it != entries_.end());
  if (Expired(it->second)) {
    RemoveLocked(std::string(s->second));
    ++stats_.expired;
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
  std::lock_guard<std::mutex> lock(mu_);
  auto s = sessions_.find(SessionKey(tenant, session_id));
  if (s == sessions_.end()) return NotFoundError("no stored session '" + session_id + "'");
  RemoveLocked(std::string(s->second));
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

bool KvStore::Contains(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.count(key) != 0;
}

std::optional<TierLevel> KvStore::TierOf(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second.tier;
}

uint64_t KvStore::MeanEntryBytesLocked() const {
  if (entries_.empty()) return 0;
  uint64_t total = 0;
  for (const auto& [k, e] : entries_) total += e.bytes;
  return std::max<uint64_t>(1, total / entries_.size());
}

void KvStore::SetLookAhead(std::vector<QueuedJob> jobs) {
  // The read buffer fetches the next jobs' entries ahead of their admission.
  StageReads(jobs);
  std::lock_guard<std::mutex> lock(mu_);
  queue_ = std::move(jobs);
  for (auto& [k, e] : entries_) e.queue_position = -1;
  // Eviction window: (C_mem + C_disk) / S_kv jobs (paper 3.3.2). Jobs behind it are
  // resolved too: the policy evicts the entry of the last queued job first (Fig. 9).
  uint64_t mean = MeanEntryBytesLocked();
  uint64_t cap = dram_->capacity() + (ssd_ != nullptr ? ssd_->capacity() : 0);
  size_t window = mean == 0 ? queue_.size() : std::min<uint64_t>(queue_.size(), cap / mean);
  hint_.window = static_cast<int>(window);
  for (size_t i = 0; i < queue_.size(); ++i) {
    const QueuedJob& j = queue_[i];
    int n = 0;
    EntryInfo* e = FindEntryLocked(j.tenant, j.session_id, *j.tokens, &n);
    if (e != nullptr && e->queue_position < 0) e->queue_position = static_cast<int>(i);  // soonest job wins
  }
}

int KvStore::Prefetch() {
  if (ssd_ == nullptr || policy_->kind() != PolicyKind::kSchedulerAware) return 0;
  int promoted = 0;
  for (int round = 0; round < 1024; ++round) {
    // Under the lock: the first job in the prefetch window whose entry is on SSD and
    // fits DRAM by evicting only entries not wanted before that job.
    std::string key;
    uint64_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      uint64_t mean = MeanEntryBytesLocked();
      if (mean == 0) break;
      size_t window = std::min<uint64_t>(queue_.size(), dram_->capacity() / mean);  // C_mem / S_kv
      for (size_t i = 0; i < window && key.empty(); ++i) {
        auto m = FindLocked(queue_[i].tenant, queue_[i].session_id, *queue_[i].tokens);
        if (!m || m->tier != TierLevel::kSsd) continue;
        const EntryInfo& info = entries_.at(m->key);
        if (info.bytes > dram_->capacity()) continue;
        uint64_t free = dram_->capacity() - dram_->bytes();
        for (const auto& [k, e] : entries_)
          if (e.tier == TierLevel::kDram && (e.queue_position < 0 || e.queue_position > static_cast<int>(i)))
            free += e.bytes;
        if (free < info.bytes) break;
        key = m->key;
        size = info.bytes;
      }
      if (!key.empty()) prefetching_ = key;  // a Fetch of it waits for this read
    }
    if (key.empty()) break;
    // The read and its checksums happen outside the lock: lookups and saves go on
    // meanwhile. (A DRAM-tier fetch checks only the header, so what enters DRAM from SSD
    // is verified here.)
    StatusOr<Fetched> read = ReadChecked(*ssd_, key, true);
    std::lock_guard<std::mutex> lock(mu_);
    prefetching_.clear();
    prefetch_done_.notify_all();
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.tier != TierLevel::kSsd) break;
    if (!read.ok() || read->bytes->size() != size) {
      const Status why = read.ok() ? DataLossError("size changed") : read.status();
      if (why.code() == StatusCode::kNotFound || why.code() == StatusCode::kUnavailable) break;
      DropUnreadableLocked(key, why);
      continue;
    }
    if (!PromoteLocked(key, std::move(read->bytes))) break;
    entries_.at(key).prefetched = true;
    ++stats_.prefetches;
    ++promoted;
  }
  return promoted;
}

void KvStore::RequestPrefetch() {
  if (!prefetcher_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(pmu_);
    prefetch_requested_ = true;
  }
  pcv_.notify_one();
}

void KvStore::PrefetchLoop() {
  std::unique_lock<std::mutex> lock(pmu_);
  for (;;) {
    pcv_.wait(lock, [&] { return stop_prefetcher_ || prefetch_requested_; });
    if (stop_prefetcher_) return;
    prefetch_requested_ = false;
    lock.unlock();
    Prefetch();
    lock.lock();
  }
}

int KvStore::ExpireNow() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> dead;
  for (const auto& [k, e] : entries_)
    if (Expired(e)) dead.push_back(k);
  for (const std::string& k : dead) RemoveLocked(k);
  stats_.expired += dead.size();
  return static_cast<int>(dead.size());
}

StoreStats KvStore::Stats() const {
  StoreStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
    s.entries = entries_.size();
    s.dram_bytes = dram_->bytes();
    s.dram_capacity = dram_->capacity();
    if (ssd_ != nullptr) {
      s.ssd_bytes = ssd_->bytes();
      s.ssd_capacity = ssd_->capacity();
    }
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
