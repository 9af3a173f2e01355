// RedisTier: the shared remote tier on a Redis 7 Cluster (DESIGN.md "Beyond one
// machine"; docs/store.md "Remote tier"). Several Attic instances on one cluster see
// each other's entries: a session saved by one is found and read by another.
//
// Layout in Redis (every name under options.prefix, default "attic"):
//   <prefix>:kv:{<entry key>}          a hash per entry: field "m" the manifest
//                                      ("ATTICR1 <total bytes> <start of part 1> ..."), fields
//                                      "0".."n-1" the parts: an entry's header, then one
//                                      part per layer (K then V), then the tail
//                                      (attachments: a PQ index); other values in 1 MiB parts
//   <prefix>:session:{<session key>}   the key of the newest entry of a (tenant, model,
//                                      dtype, session) saved by any instance
// The hash tag is the whole EntryKey::ToString() (self-describing: tenant, model,
// dtype, token hash, session), so one entry's fields live in one slot and are written
// in one MULTI/EXEC (a reader never sees half of a replacement) and evicted together by
// maxmemory (never one layer without the others). Both keys expire (PEXPIREAT) when the
// entry's header says it does.
//
// Reads: GetShared reads the manifest, then the parts in batches of about 8 MB (HMGET);
// GetRange reads only
// the parts its range covers (HMGET of those fields and the manifest, checked against
// the manifest it planned with): a layer of an entry (layer_read.h) is exactly one
// part. Bad bytes are DataLoss (a part of the wrong size, a missing part, a malformed
// manifest; the store also checks every layer's xxh3 on what it reads); an absent hash
// is NotFound; a cluster that does not answer within the client's budget is
// Unavailable / DeadlineExceeded (a miss: the store keeps serving).
//
// Capacity is this instance's share (--kv-remote-bytes), advisory: Put refuses a value
// larger than it, and when this instance's own writes exceed it, the oldest of them are
// deleted (FIFO). The cluster's maxmemory policy governs the rest: entries vanish
// without Erase (traits.evicts_itself) and other instances add and delete them
// (traits.shared). bytes() is what this instance wrote and has not seen go (an estimate).
//
// Thread-safety: internally synchronized; calls run concurrently (ClusterClient pools
// connections).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "attic/store/clock.h"
#include "attic/store/entry.h"
#include "attic/store/tier.h"

struct redisReply;  // hiredis

namespace attic::store {

namespace redis {
class ClusterClient;
}

struct RedisTierOptions {
  // "redis://host:port[,host:port...]": seed nodes of the cluster (--kv-remote).
  std::string url;
  // This instance's share of the cluster, bytes (--kv-remote-bytes); advisory (above).
  uint64_t capacity = 8ull << 30;
  // Namespace of every key (several deployments may share a cluster).
  std::string prefix = "attic";
  std::chrono::milliseconds connect_timeout{300};
  std::chrono::milliseconds command_timeout{1000};
  // Everything one call may take (retries, redirects, reconnects): a read that the
  // cluster does not answer within it is a miss.
  std::chrono::milliseconds retry_budget{1500};
  // What the client's fail-fast window after a down cluster is measured on (null: the
  // system clock; tests pass a store::VirtualClock). Not owned; must outlive the tier.
  const Clock* clock = nullptr;
};

// What the tier did (for metrics and logs).
struct RedisTierStats {
  uint64_t puts = 0, gets = 0, range_gets = 0;
  uint64_t errors = 0;          // calls that failed (network, timeouts, error replies)
  uint64_t bytes_written = 0, bytes_read = 0;
  uint64_t self_evictions = 0;  // own entries deleted to stay within the capacity
};

class RedisTier final : public Tier {
 public:
  // Parses the URL and prepares the client; connects lazily (a cluster that is down at
  // start-up only makes reads miss). InvalidArgument for a bad URL or prefix.
  static StatusOr<std::unique_ptr<RedisTier>> Open(RedisTierOptions options);
  ~RedisTier() override;

  std::string name() const override { return "remote"; }
  TierTraits traits() const override;
  Status Put(const std::string& key, std::string_view bytes) override;
  StatusOr<std::string> Get(const std::string& key) override;
  StatusOr<SharedBytes> GetShared(const std::string& key) override;
  StatusOr<ByteRange> GetRange(const std::string& key, uint64_t offset, uint64_t length) override;
  // The parts the range covers, received in place (a part wholly inside the range goes
  // straight from the socket into `dst`: no reply buffer, no copy).
  Status ReadInto(const std::string& key, uint64_t offset, uint64_t length, char* dst) override;
  Status Erase(const std::string& key) override;
  // Ask the cluster (false when it does not answer).
  bool Contains(const std::string& key) const override;
  int64_t SizeOf(const std::string& key) const override;
  // The keys this instance wrote and has not erased (the tier is not enumerable).
  std::vector<std::string> Keys() const override;
  uint64_t bytes() const override;
  uint64_t capacity() const override { return options_.capacity; }
  StatusOr<std::string> FindSession(const EntryKey& session) override;

  // The Redis key of `key`'s hash, and of a session's pointer (tests, operators).
  std::string HashKey(const std::string& key) const;
  std::string SessionPointerKey(const EntryKey& session) const;
  RedisTierStats stats() const;
  redis::ClusterClient& client() { return *client_; }

  // How a value is stored: a hash of its parts, cut at an entry's layers (Plan), and
  // a manifest naming where each part starts. The manifest is read from the network:
  // ParseManifest checks it (public for the fuzz harness and the tests).
  struct Manifest {
    uint64_t total = 0;
    std::vector<uint64_t> starts;  // part i = [starts[i], starts[i + 1] or total)
    std::string text;              // as stored
    uint64_t end(size_t i) const { return i + 1 < starts.size() ? starts[i + 1] : total; }
    // The parts [*first, *last] that bytes [offset, offset + length) lie in.
    void Cover(uint64_t offset, uint64_t length, size_t* first, size_t* last) const;
  };
  // Parts of `bytes`: an entry is cut at its layers (header, layer 0, ..., tail); anything
  // else into fixed-size pieces. *expires_at_ms / *entry_key: the entry's (0 / an empty
  // session when it is not one).
  static Manifest Plan(std::string_view bytes, int64_t* expires_at_ms, EntryKey* entry_key);
  // DataLoss unless `text` is a manifest of strictly increasing starts below its total.
  static StatusOr<Manifest> ParseManifest(std::string_view text);

 private:
  explicit RedisTier(RedisTierOptions options, std::unique_ptr<redis::ClusterClient> client);
  StatusOr<Manifest> ReadManifest(const std::string& hash_key);
  // The whole value, assembled into one buffer (WithReadPlan: no manifest read when the
  // plan is remembered).
  StatusOr<SharedBytes> ReadAll(const std::string& key);
  // HMGET of the hash `hk`'s manifest and parts [first, last]: an array reply of the
  // manifest (NIL when the hash is gone), then the parts. A failed call, an error reply
  // or a reply of another shape is an error (counted).
  // With `sink`: the parts go where it places them (redis::BulkSink).
  StatusOr<std::shared_ptr<const redisReply>> ReadParts(const std::string& hk, size_t first, size_t last,
                                                        const std::function<char*(size_t, size_t)>* sink = nullptr) const;
  // Runs `attempt` with `key`'s read plan (the one remembered, else the stored manifest);
  // when it reports the value replaced (*replaced), plans again, at most three times. A
  // read that succeeds is counted in stats_.*counted and its plan remembered.
  Status WithReadPlan(const std::string& key, const std::string& hk, uint64_t RedisTierStats::*counted,
                      const std::function<Status(const Manifest&, bool*)>& attempt);
  // Bytes [offset, offset + length) of the value whose manifest is `m` into dst, in one
  // HMGET: the parts wholly inside are received in place, the edge parts copied.
  // *replaced (nothing read) when the stored manifest is no longer `m`.
  Status ReadSpan(const std::string& key, const std::string& hk, const Manifest& m, uint64_t offset, uint64_t length,
                  char* dst, bool* replaced);
  // Checks `r` (ReadParts of parts [first, last]) against the plan `m`: NotFound (the plan
  // forgotten) when the hash is gone; *replaced when its manifest is no longer `m`;
  // DataLoss (counted) unless each part has the size `m` gives it.
  Status CheckReply(const std::string& key, const std::string& hk, const Manifest& m, size_t first, size_t last,
                    const redisReply& r, bool* replaced);
  // Keeps `m` as `key`'s read plan (bounded: cleared when full). REQUIRES: mu_ held.
  void RememberLocked(const std::string& key, const Manifest& m);
  // Drops `key` from the local accounting (its size, write order and read plan).
  // REQUIRES: mu_ held.
  void ForgetLocked(const std::string& key);
  Status Failed(const Status& status) const;

  const RedisTierOptions options_;
  std::unique_ptr<redis::ClusterClient> client_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, uint64_t> sizes_;  // own writes
  std::deque<std::string> order_;                     // own writes, oldest first
  uint64_t bytes_ = 0;
  std::unordered_map<std::string, Manifest> manifests_;  // planned reads (bounded)
  mutable RedisTierStats stats_;
};

}  // namespace attic::store
