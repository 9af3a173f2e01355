// KvStore's write buffer (paper 001 section 3.2, asynchronous saving): SaveAsync queues
// a turn's entry for the writer thread; lookups that depend on a queued save wait for it
// (or read it through, ReadQueuedSave) and make the writer urgent meanwhile.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "attic/store/kv_store.h"
#include "attic/store/prefix_match.h"
#include "store/kv_store_internal.h"

namespace attic::store {

using internal::SessionKey;
using internal::MsSince;

namespace {
// The bytes a queued save holds of its own (its rows in its dtype, its attachments).
uint64_t EntryKvBytes(const KvEntry& e) { return e.own_kv_bytes() + e.attachment_bytes(); }
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
  ++stats_.tiers[0].hits;  // the write buffer is DRAM: Stats() reports tier 0's hits as hits_dram
  ++stats_.write_buffer_hits;
}

void KvStore::Flush() {
  std::unique_lock<std::mutex> lock(wmu_);
  wcv_.wait(lock, [&] { return pending_.empty() && writing_ == nullptr; });
}

}  // namespace attic::store
