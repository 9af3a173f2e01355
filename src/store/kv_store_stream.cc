// Streamed reads (KvStore::OpenForTurn of an entry on a tier whose TierTraits say
// streams_layers: the remote tier). Reading a 2k-token SmolLM2-135M entry (~94 MB) from
// a Redis Cluster whole takes longer than the turn's forward pass; read layer by layer
// (layer_read.h: one range per layer, each verified against its checksum as it arrives),
// layer l enters the compute buffer and computes while layers l+1.. are still in flight
// (paper 001's layer-wise pre-loading, with the network as the slow tier; LMCache reads
// its remote backends per chunk for the same reason).
//
// The header is read and checked before the turn starts (a bad or vanished entry is a
// plain miss then). The layers are received on the streamer thread straight into one
// buffer of the entry's size (Tier::ReadInto: from the socket, no reply buffer), so that the finished read is a complete serialized entry: the turn
// shares rows from it, and it is promoted to DRAM like a fetched entry. The attachments
// (the entry's tail: a PQ index) are read first, since a sparse turn reads them at
// admission. A read that fails after the turn started fails the source (KvStream): the
// rows it did not deliver are never entered, and the scheduler recomputes the request
// (KvSeq::lost: Scheduler::StartOver); the entry is kept, dropped or counted as ReadFailed
// says, as for any read.
#include <cstring>

#include "attic/core/log.h"
#include "attic/core/thread_name.h"
#include "attic/store/kv_store.h"
#include "attic/store/layer_read.h"

namespace attic::store {

struct KvStore::StreamRead {
  std::string key;
  int level = 0;
  uint64_t version = 0;
  EntryHeader header;
  std::shared_ptr<Bytes> bytes;  // written here, read by the source's users as published
  std::shared_ptr<KvStream> stream;
};

std::optional<StatusOr<std::shared_ptr<const KvSource>>> KvStore::OpenStreamed(const std::string& key) {
  if (!options_.stream_layers) return std::nullopt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || !traits_[TierIndex(it->second.tier)].streams_layers) return std::nullopt;
  }
  StatusOr<ReadStart> start = BeginRead(key);
  if (!start.ok()) return StatusOr<std::shared_ptr<const KvSource>>(start.status());
  if (start->in_transit)  // being promoted: its bytes are read already
    return KvSource::Stored(std::move(start->in_transit->bytes), std::move(start->in_transit->header), key);
  if (!traits_[start->level].streams_layers) return std::nullopt;  // moved up meanwhile
  Tier& tier = *tiers_[start->level];
  auto failed = [&](const Status& why) -> std::optional<StatusOr<std::shared_ptr<const KvSource>>> {
    bool moved = false;
    Status st = ReadFailedOrMoved(key, start->level, start->version, why, &moved);
    if (moved) return std::nullopt;  // Fetch reads it where it is now
    return StatusOr<std::shared_ptr<const KvSource>>(st);
  };
  ByteRange raw;
  StatusOr<EntryHeader> h = ReadEntryHeader(tier, key, options_.fingerprint, &raw);
  if (h.ok() && h->meta.key().ToString() != key) h = DataLossError("misnamed KV entry");
  if (!h.ok()) return failed(h.status());
  auto s = std::make_shared<StreamRead>();
  s->key = key;
  s->level = start->level;
  s->version = start->version;
  s->bytes = std::shared_ptr<Bytes>(Bytes::Allocate(h->total_bytes));
  std::memcpy(s->bytes->data(), raw.data, h->data_offset);
  s->header = *h;
  s->stream = std::make_shared<KvStream>();
  auto source = KvSource::Streamed(s->bytes, std::move(*h), key, s->stream);
  {
    std::lock_guard<std::mutex> lock(smu_);
    if (!streamer_.joinable()) streamer_ = StartNamedThread("attic-kv-stream", [this] { StreamerLoop(); });
    stream_reads_.push_back(std::move(s));
  }
  scv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.streamed_loads;
  }
  return StatusOr<std::shared_ptr<const KvSource>>(std::move(source));
}

void KvStore::StreamerLoop() {
  std::unique_lock<std::mutex> lock(smu_);
  for (;;) {
    scv_.wait(lock, [&] { return stop_streamer_.load() || !stream_reads_.empty(); });
    if (stream_reads_.empty()) return;  // stopping, and nothing is queued
    std::shared_ptr<StreamRead> s = std::move(stream_reads_.front());
    stream_reads_.pop_front();
    lock.unlock();
    RunStreamRead(*s);
    lock.lock();
  }
}

void KvStore::RunStreamRead(StreamRead& s) {
  const EntryHeader& h = s.header;
  Tier& tier = *tiers_[s.level];
  // Counted (and the entry dropped) before the reader hears of it: whoever the failure
  // wakes (a request that then starts over and answers) finds it in Stats() already.
  auto fail = [&](const Status& why) {
    if (why.code() != StatusCode::kCancelled) ReadFailed(s.key, s.level, s.version, why).IgnoreError();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.stream_failures;
    }
    s.stream->Fail(why);
  };
  // The tail first: the attachments, each verified (a bad one is counted and logged, and
  // its reader goes without it, as for a fetched entry).
  if (stop_streamer_.load()) {
    fail(CancelledError("the KV store is closing"));
    return;
  }
  const uint64_t tail = EntryLayerOffset(h, h.meta.n_layers);
  if (tail < h.total_bytes) {
    if (Status st = tier.ReadInto(s.key, tail, h.total_bytes - tail, s.bytes->data() + tail); !st.ok()) {
      fail(st.code() == StatusCode::kOutOfRange ? DataLossError("truncated KV entry " + s.key) : st);
      return;
    }
    CheckAttachments(s.key, s.bytes->view(), h);
  }
  s.stream->PublishAttachments();
  for (int l = 0; l < h.meta.n_layers; ++l) {
    if (stop_streamer_.load()) {
      fail(CancelledError("the KV store is closing"));
      return;
    }
    // Received in place, then verified against the layer's checksum.
    if (Status st = ReadEntryLayerInto(tier, s.key, h, l, s.bytes->data() + EntryLayerOffset(h, l)); !st.ok()) {
      fail(st);
      return;
    }
    s.stream->PublishLayers(l + 1);
  }
  Fetched f{s.bytes, h};
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_loaded += f.bytes->size();
  }
  PromoteRead(s.key, s.level, s.version, f);
}

}  // namespace attic::store
