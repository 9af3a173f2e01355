// Tier: a byte store of serialized KV entries addressed by self-describing keys
// (EntryKey::ToString()). The interface assumes nothing about where bytes live, so a
// remote tier (Redis protocol) fits beside DRAM and a local directory (DESIGN.md
// "Beyond one machine").
//
// The KvStore keeps its tiers in an ordered list, fastest first (DRAM, SSD, later a
// shared remote one): a save enters the top tier that takes it, a victim moves one
// tier down, a read entry moves back to the top. What the store may assume about a tier
// is in its TierTraits. A tier that does not evict by itself never does: Put fails with
// ResourceExhausted when the bytes would exceed capacity(), and the store makes room
// first, so bytes() <= capacity() always holds.
//
// Errors (what the store does with them): NotFound = the value is not there (vanished:
// the entry is dropped from the index); DataLoss / FailedPrecondition = the bytes are
// there but bad (the entry is dropped and counted as corrupt); anything else --
// Unavailable, DeadlineExceeded, ... -- is transient: that read is a miss and the entry
// stays.
//
// Thread-safety: implementations are internally synchronized; all methods may be called
// from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "attic/core/file_env.h"
#include "attic/core/status.h"
#include "attic/store/bytes.h"
#include "attic/store/entry.h"

namespace attic::store {

// A tier's position in the store's tier list, 0 = the top (nearest compute). kDram and
// kSsd name the two tiers of the default store (--kv-dram-bytes, --kv-ssd-dir); a third
// is TierAt(2).
enum class TierLevel : int { kDram = 0, kSsd = 1 };
constexpr int TierIndex(TierLevel level) { return static_cast<int>(level); }
constexpr TierLevel TierAt(int index) { return static_cast<TierLevel>(index); }
// The default store's names of its levels ("dram", "ssd"; metrics and JSON use them),
// "tier<N>" beyond them. KvStore::tier_name() gives a store's own tiers' names.
std::string TierName(TierLevel level);

// What the store may assume about a tier.
struct TierTraits {
  // Other server instances read and write it: an entry may appear or disappear at any
  // time; the store's index of it is a cache (an entry found missing is dropped quietly).
  bool shared = false;
  // Keys() lists every entry: the store's index is rebuilt from it at open. A tier that
  // cannot (a large remote keyspace) is not enumerated.
  bool enumerable = true;
  // Entries may vanish without Erase (maxmemory, TTLs) and Put makes its own room: the
  // store makes none (capacity() is advisory) and drops an entry found missing quietly.
  bool evicts_itself = false;
  // Values live in this process's memory: calls are memory operations (the store makes
  // them under its lock), and bytes read never crossed a process or persistence
  // boundary (the store checks their header, not every layer's checksum). Otherwise
  // every call is I/O: the store makes it without holding its lock.
  bool local_memory = false;
  // Reading a value layer by layer (GetRange of one layer, layer_read.h) moves bytes as
  // fast as reading it whole, and a read takes long next to a forward step (a network
  // store): the store streams a turn's entry from it, so that layer l enters the
  // compute buffer and computes while later layers are still in flight
  // (KvStore::OpenForTurn). Local tiers read whole: one read is cheaper than many.
  bool streams_layers = false;
};

// Bytes [offset, offset + size) of a stored value, kept alive by `owner` (the value
// itself in a DRAM tier, or the buffer a read filled).
struct ByteRange {
  std::shared_ptr<const void> owner;
  const char* data = nullptr;
  size_t size = 0;
  std::string_view view() const { return {data, size}; }
};

// What a failed read means to the store (the error contract above).
enum class ReadError {
  kTransient,  // try again later: a miss now, the entry stays
  kVanished,   // NotFound: the value is not there
  kCorrupt,    // DataLoss, FailedPrecondition: the bytes are bad
};
ReadError ClassifyReadError(const Status& status);

class Tier {
 public:
  virtual ~Tier() = default;
  // The tier's name in logs, metrics and JSON ("dram", "ssd", ...).
  virtual std::string name() const = 0;
  virtual TierTraits traits() const { return {}; }
  // Stores `bytes` under `key`, replacing any previous value. ResourceExhausted when it
  // does not fit; on any error the previous value (if any) is unchanged.
  virtual Status Put(const std::string& key, std::string_view bytes) = 0;
  // NotFound when absent; DataLoss/Unavailable on I/O errors.
  virtual StatusOr<std::string> Get(const std::string& key) = 0;
  // Same, as shared immutable bytes: the DRAM tier hands out its own copy without
  // copying (layer-wise loading reads straight from it); others read into a new buffer.
  virtual StatusOr<SharedBytes> GetShared(const std::string& key);
  // Bytes [offset, offset + length) of the value, e.g. one layer of an entry (entry.h's
  // layout; layer_read.h), without reading the rest where the tier can: the DRAM tier
  // returns a view of its value, the SSD tier reads that range. NotFound when absent,
  // OutOfRange when the range passes the value's end. Default: GetShared, sliced.
  virtual StatusOr<ByteRange> GetRange(const std::string& key, uint64_t offset, uint64_t length);
  // The same bytes received into `dst` (at least `length` bytes), where a tier can place
  // them there without an intermediate buffer (the remote tier receives a layer straight
  // from its socket). Errors as GetRange. Default: GetRange, copied.
  virtual Status ReadInto(const std::string& key, uint64_t offset, uint64_t length, char* dst);
  // Put of bytes the caller already holds shared (the DRAM tier keeps them, no copy).
  virtual Status PutShared(const std::string& key, SharedBytes bytes) { return Put(key, *bytes); }
  // Removes `key`; OK when absent.
  virtual Status Erase(const std::string& key) = 0;
  virtual bool Contains(const std::string& key) const = 0;
  // Size of the stored value, or -1 when absent.
  virtual int64_t SizeOf(const std::string& key) const = 0;
  // Every key (enumerable tiers; others may return a partial list).
  virtual std::vector<std::string> Keys() const = 0;
  // A shared tier's newest entry of the session `session` names (its tenant, model
  // fingerprint, dtype and session id; the token hash is ignored), saved by any
  // instance: that entry's key, for a store that has not indexed it (another instance
  // wrote it). NotFound when there is none; the default for tiers that keep no such
  // pointer (every local one: the store indexes what it wrote itself).
  virtual StatusOr<std::string> FindSession(const EntryKey& session) {
    return NotFoundError("the " + name() + " tier keeps no session pointers");
  }
  // Bytes stored and the capacity. Both answer from memory, without I/O (the store asks
  // them under its lock); a tier that evicts by itself may answer an estimate.
  virtual uint64_t bytes() const = 0;
  virtual uint64_t capacity() const = 0;
};

// The range [offset, offset + length) of a value of `size` bytes: OutOfRange when it
// passes the end.
Status CheckRange(uint64_t size, uint64_t offset, uint64_t length);

// Host-DRAM tier: values in this process's memory (traits: local_memory). `level` other
// than kDram names an in-memory stand-in for another tier (the policy simulator's
// "ssd").
class DramTier final : public Tier {
 public:
  explicit DramTier(uint64_t capacity, TierLevel level = TierLevel::kDram) : capacity_(capacity), level_(level) {}
  std::string name() const override { return TierName(level_); }
  TierTraits traits() const override;
  Status Put(const std::string& key, std::string_view bytes) override;
  StatusOr<std::string> Get(const std::string& key) override;
  StatusOr<SharedBytes> GetShared(const std::string& key) override;
  StatusOr<ByteRange> GetRange(const std::string& key, uint64_t offset, uint64_t length) override;
  Status PutShared(const std::string& key, SharedBytes bytes) override;
  Status Erase(const std::string& key) override;
  bool Contains(const std::string& key) const override;
  int64_t SizeOf(const std::string& key) const override;
  std::vector<std::string> Keys() const override;
  uint64_t bytes() const override;
  uint64_t capacity() const override { return capacity_; }

 private:
  const uint64_t capacity_;
  const TierLevel level_;
  mutable std::mutex mu_;
  // Values are immutable once stored; a reader holding one keeps it alive after Erase
  // (its bytes then no longer count toward the tier).
  std::unordered_map<std::string, SharedBytes> values_;
  uint64_t bytes_ = 0;
};

// What SsdTier::Open found in the store directory.
struct SsdScan {
  std::string root;                   // the store directory (--kv-ssd-dir)
  std::string dir;                    // this model's subdirectory of it
  bool created = false;               // the directory was new or empty: the marker was written
  uint64_t removed_temp_files = 0;    // this model's interrupted writes, removed
  uint64_t other_model_entries = 0;   // entries of other models: kept, never opened
  uint64_t other_model_bytes = 0;
  uint64_t other_models = 0;          // models with entries there
  uint64_t foreign = 0;               // files and directories not Attic's: never touched
  std::string foreign_example;        // one of them, relative to `root` ('/' after a directory)
};

// SSD tier: a directory of Attic's own (docs/store.md "SSD directory"):
//
//   <root>/ATTIC_KV_STORE         marker: "attic-kv-store <format version>"
//   <root>/<model>/<key>.kv        one file per entry of the model whose FingerprintTag is <model>
//   <root>/<model>/<key>.kv.tmp    a write in progress
//
// Open refuses a directory that is neither new, empty, nor marked (it is somebody
// else's), and a marker of a newer format. It reads and writes only this model's
// subdirectory, and there only names of the entry pattern (ParseEntryKeyName with this
// model's tag, + ".kv" / ".kv.tmp"): other models' subdirectories are counted, not
// opened, and nothing else -- any other file or directory, anywhere -- is ever read,
// written or removed (Open warns once about them). Keys of Put/Get/Erase must be entry
// keys of this model (InvalidArgument / NotFound otherwise). Capacity is this model's:
// other models' entries do not count against it.
//
// A write goes to the temporary file, is fsync'ed and renamed over the final name (and
// the directory fsync'ed), so an interrupted write is never visible under the key. Large
// values are written and read with pwrite/pread in 1 MiB aligned chunks, split across
// threads. Written and read files are dropped from the OS page cache (posix_fadvise
// DONTNEED): host memory for KV is the DRAM tier's, within its capacity, and reads
// measure the device.
class SsdTier final : public Tier {
 public:
  static constexpr char kMarkerName[] = "ATTIC_KV_STORE";
  // The store directory's subdirectory of Attic's context-cache registry (src/pic): not
  // the tier's, never opened by it, never counted as foreign.
  static constexpr char kContextCacheDirName[] = "context-caches";
  static constexpr int kFormatVersion = 1;

  // Opens (creating or adopting an empty directory) the store at `root` for the model
  // `fingerprint`: removes this model's leftover temporary files and indexes its entry
  // files by size (contents are verified by the KvStore, which erases bad ones). Its
  // existing files count toward capacity; if they exceed it the KvStore evicts.
  // FailedPrecondition, with nothing touched, for a directory that is not Attic's or of
  // a newer format.
  // `env`: the file layer its entries are written and read through (tests inject faults
  // there); not owned, outlives the tier.
  static StatusOr<std::unique_ptr<SsdTier>> Open(const std::string& root, const std::string& fingerprint,
                                                 uint64_t capacity, FileEnv* env = FileEnv::Default());
  // `root`'s subdirectory of the model `fingerprint`.
  static std::string ModelDir(const std::string& root, const std::string& fingerprint);

  std::string name() const override { return "ssd"; }
  // Not shared (one server per model directory), enumerable (rebuilt at open), evicts
  // nothing by itself, and every call is file I/O.
  TierTraits traits() const override { return {}; }
  Status Put(const std::string& key, std::string_view bytes) override;
  StatusOr<std::string> Get(const std::string& key) override;
  // Reads with O_DIRECT into an aligned buffer (no page-cache copy) where the file
  // system supports it, else through the page cache.
  StatusOr<SharedBytes> GetShared(const std::string& key) override;
  // A pread of the range (with O_DIRECT: of the 4096-byte aligned range around it).
  StatusOr<ByteRange> GetRange(const std::string& key, uint64_t offset, uint64_t length) override;
  Status Erase(const std::string& key) override;
  bool Contains(const std::string& key) const override;
  int64_t SizeOf(const std::string& key) const override;
  std::vector<std::string> Keys() const override;
  uint64_t bytes() const override;
  uint64_t capacity() const override { return capacity_; }

  // This model's subdirectory.
  const std::string& dir() const { return scan_.dir; }
  std::string PathOf(const std::string& key) const;
  // What Open found.
  const SsdScan& scan() const { return scan_; }
  // Number of leftover temporary files removed by Open.
  int removed_temp_files() const { return static_cast<int>(scan_.removed_temp_files); }

 private:
  SsdTier(std::string tag, uint64_t capacity, FileEnv* env) : tag_(std::move(tag)), capacity_(capacity), env_(env) {}
  // Whether `key` is an entry key of this model (the only names this tier touches).
  bool Mine(const std::string& key) const;
  const std::string tag_;  // FingerprintTag of the model
  const uint64_t capacity_;
  FileEnv* const env_;
  SsdScan scan_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, uint64_t> sizes_;
  uint64_t bytes_ = 0;
  uint64_t pending_ = 0;  // bytes of writes in flight (reserved against capacity)
};

}  // namespace attic::store
