// ClusterClient: the small Redis Cluster client the remote KV tier speaks through
// (docs/store.md "Remote tier"). It routes each call by its key's slot (key_slot.h) to
// the master that serves the slot, from a slot map read with CLUSTER SLOTS; follows
// -MOVED (the map is read again) and -ASK (ASKING, then the command, at the node named)
// redirects; retries -TRYAGAIN / -CLUSTERDOWN / -LOADING and lost connections with a
// short back-off; and reconnects to whichever nodes the map names.
//
// Bounded: every call has a budget (ClusterOptions::retry_budget, at most max_attempts
// tries, each reply within command_timeout and never past the budget): it then fails
// with Unavailable (nodes down, the cluster failing over) or DeadlineExceeded (replies
// too slow). It never blocks longer than the budget plus one connect_timeout. After a
// call has failed for want of any reachable node, calls fail at once for
// `down_backoff` (so a stopped cluster costs each request nothing), then try again.
//
// A call is one pipeline of commands on keys of one slot (the same hash tag): sent to
// that slot's node in one round trip and answered in order (MULTI ... EXEC inside it
// makes them atomic). Error replies other than redirects and the retried ones come back
// as replies for the caller to judge (OOM: see ReplyStatus).
//
// Thread-safety: all methods may be called from any thread; connections are pooled per
// node and each is used by one call at a time, so calls run concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "attic/core/status.h"
#include "attic/store/clock.h"
#include "store/redis/connection.h"

namespace attic::store::redis {

struct ClusterOptions {
  // Seed nodes, "host:port": any of them answers CLUSTER SLOTS (at least one).
  std::vector<std::string> seeds;
  std::chrono::milliseconds connect_timeout{300};
  // One reply (of a whole pipeline) may take this long.
  std::chrono::milliseconds command_timeout{1000};
  // Everything one call may take: redirects, reconnects, back-offs and retries.
  std::chrono::milliseconds retry_budget{1500};
  int max_attempts = 6;
  // After a call found no node reachable, calls fail at once for this long.
  std::chrono::milliseconds down_backoff{500};
  // What down_backoff is measured on (null: the system clock; tests pass a VirtualClock).
  // Not owned; must outlive the client.
  const store::Clock* clock = nullptr;
  // Idle connections kept per node.
  int pool_per_node = 4;
};

// Parses "redis://host:port[,host:port...]" (the scheme may be left out) into seeds.
// InvalidArgument, naming the bad part, otherwise.
StatusOr<std::vector<std::string>> ParseRedisUrl(std::string_view url);

// What a call did (for metrics and tests).
struct ClusterStats {
  uint64_t calls = 0;
  uint64_t failed_calls = 0;     // calls that returned an error status
  uint64_t moved = 0, asked = 0;  // redirects followed
  uint64_t retries = 0;          // attempts after the first (redirects excluded)
  uint64_t connects = 0;         // connections opened
  uint64_t slot_map_reads = 0;   // CLUSTER SLOTS read
};

class ClusterClient {
 public:
  // No connection is made here: the first call reads the slot map (a cluster that is
  // down at start is a failing call, not a failed start). InvalidArgument for bad seeds.
  static StatusOr<std::unique_ptr<ClusterClient>> Create(ClusterOptions options);

  // Runs `commands` (all on keys of `key`'s slot, `key` among them or sharing its hash
  // tag) at the node serving that slot, in one pipeline; returns one reply each.
  // With `sink`: the last command's array reply places its bulk strings where the sink
  // says (Connection::Pipeline); a redirect or retry calls it again for the new reply.
  StatusOr<std::vector<Reply>> Pipeline(std::string_view key, const std::vector<Command>& commands,
                                        const BulkSink* sink = nullptr);
  StatusOr<Reply> Run(std::string_view key, const Command& command);
  // A keyless command (CLUSTER INFO, PING) at the first node of the map that answers.
  StatusOr<Reply> RunAnywhere(const Command& command);

  // The master serving `slot` by the current map ("" when unknown; tests).
  std::string NodeOfSlot(int slot);
  ClusterStats stats() const;
  const ClusterOptions& options() const { return options_; }

 private:
  using Clock = std::chrono::steady_clock;
  explicit ClusterClient(ClusterOptions options);
  // Reads CLUSTER SLOTS from a known node (the map's, then the seeds). Unavailable when
  // none answers.
  Status RefreshSlots(Clock::time_point deadline);
  StatusOr<std::unique_ptr<Connection>> Acquire(const std::string& address, Clock::time_point deadline);
  void Release(std::unique_ptr<Connection> conn);
  // `commands` in one pipeline at `address` (no routing), each reply within the
  // command timeout and never past `deadline`. On a failed connect or send the
  // address's pooled connections are dropped; otherwise the connection goes back to
  // the pool. Error replies are replies.
  StatusOr<std::vector<Reply>> PipelineAt(const std::string& address, const std::vector<Command>& commands,
                                          Clock::time_point deadline, const BulkSink* sink = nullptr);
  // Drops the pooled connections of `address` (after an error on one of them).
  void DropPool(const std::string& address);
  std::vector<std::string> KnownNodes();

  const ClusterOptions options_;
  std::mutex mu_;  // guards the map, the pool and down_until_ms_
  std::vector<std::string> slot_node_;  // [kClusterSlots] "host:port", "" = unknown
  bool have_map_ = false;
  std::unordered_map<std::string, std::vector<std::unique_ptr<Connection>>> pool_;
  const store::Clock* const clock_;  // options_.clock or the system clock
  int64_t down_until_ms_ = 0;  // on clock_
  struct Counters {
    std::atomic<uint64_t> calls{0}, failed_calls{0}, moved{0}, asked{0}, retries{0}, connects{0}, slot_map_reads{0};
  };
  mutable Counters counters_;
};

// An error reply as a Status: OOM (the cluster is full under a noeviction policy) is
// ResourceExhausted, anything else Internal; OK for any other reply.
Status ReplyStatus(const redisReply& r);

}  // namespace attic::store::redis
