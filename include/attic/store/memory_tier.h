// MemoryTier: an in-memory tier with the traits, latency and faults of whatever tier it
// stands in for -- a shared remote tier that evicts by itself, a slow one, a failing one.
// The store's handling of such a tier (DESIGN.md "Beyond one machine": a Redis Cluster
// below SSD) is tested with it before the real one exists, and policy simulations use it
// as a capacity-bounded stand-in.
//
// Unlike DramTier, it copies: Put stores a copy, every read returns a new buffer (as
// bytes that crossed a network would be). With traits.evicts_itself, a Put that does not
// fit evicts the oldest values first (as Redis under maxmemory with an LRU-ish policy);
// otherwise it fails with ResourceExhausted like every store-managed tier.
//
// Thread-safety: internally synchronized; the fault-injection calls too.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "attic/store/tier.h"

namespace attic::store {

struct MemoryTierOptions {
  std::string name = "memory";
  uint64_t capacity = 0;
  // The traits it reports. local_memory must stay false (it copies, and its latency is
  // meant to be paid outside the store's lock).
  TierTraits traits;
  // Added to every call that moves bytes (Put, Get, GetShared, GetRange).
  std::chrono::microseconds latency{0};
};

class MemoryTier final : public Tier {
 public:
  explicit MemoryTier(MemoryTierOptions options);
  std::string name() const override { return options_.name; }
  TierTraits traits() const override { return options_.traits; }
  Status Put(const std::string& key, std::string_view bytes) override;
  StatusOr<std::string> Get(const std::string& key) override;
  StatusOr<SharedBytes> GetShared(const std::string& key) override;
  StatusOr<ByteRange> GetRange(const std::string& key, uint64_t offset, uint64_t length) override;
  Status Erase(const std::string& key) override;
  bool Contains(const std::string& key) const override;
  int64_t SizeOf(const std::string& key) const override;
  std::vector<std::string> Keys() const override;
  uint64_t bytes() const override;
  uint64_t capacity() const override { return options_.capacity; }

  // --- Fault injection ---
  // The next `n` reads (Get, GetShared, GetRange) fail with `status` (e.g. Unavailable,
  // DeadlineExceeded: a timeout), without touching the value.
  void FailNextReads(int n, Status status);
  // The next `n` Puts fail with `status`; the previous value stays.
  void FailNextPuts(int n, Status status);
  // Flips one bit of the stored value at `offset` (a value damaged in the tier).
  void Corrupt(const std::string& key, uint64_t offset);
  // Drops `key` as the tier itself would (maxmemory, a TTL, another instance's delete).
  void Vanish(const std::string& key);
  // Calls that moved bytes so far.
  uint64_t reads() const;
  uint64_t puts() const;

 private:
  void Sleep() const;
  // REQUIRES: mu_ held.
  Status TakeReadFault();
  void EraseLocked(const std::string& key);

  const MemoryTierOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::string> values_;
  std::deque<std::string> order_;  // insertion order (self-eviction: oldest first)
  uint64_t bytes_ = 0;
  int fail_reads_ = 0, fail_puts_ = 0;
  Status read_fault_, put_fault_;
  uint64_t reads_ = 0, puts_ = 0;
};

}  // namespace attic::store
