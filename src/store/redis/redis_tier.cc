// RedisTier (attic/store/redis_tier.h): entries as Redis hashes of parts, one part per
// layer, on the cluster client.
#include "attic/store/redis_tier.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <cstring>
#include <sstream>

#include "attic/core/log.h"
#include "store/redis/cluster_client.h"

namespace attic::store {

namespace {
using redis::Command;
using redis::Reply;
using redis::ReplyText;

constexpr char kManifestMagic[] = "ATTICR1";
constexpr uint64_t kChunk = 1 << 20;     // parts of values that are not entries
constexpr size_t kMaxManifests = 4096;   // cached read plans
constexpr size_t kMaxParts = 1 << 20;    // a manifest naming more is not ours

std::string PartField(size_t i) { return std::to_string(i); }

bool ParseU64(std::string_view s, uint64_t* out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

}  // namespace

StatusOr<std::unique_ptr<RedisTier>> RedisTier::Open(RedisTierOptions options) {
  if (options.prefix.empty() || options.prefix.find_first_of("{} \r\n") != std::string::npos)
    return InvalidArgumentError("remote tier: the key prefix must be non-empty, without braces or spaces");
  if (options.capacity == 0) return InvalidArgumentError("remote tier: capacity must be positive");
  ATTIC_ASSIGN_OR_RETURN(std::vector<std::string> seeds, redis::ParseRedisUrl(options.url));
  redis::ClusterOptions co;
  co.seeds = std::move(seeds);
  co.connect_timeout = options.connect_timeout;
  co.command_timeout = options.command_timeout;
  co.retry_budget = options.retry_budget;
  co.clock = options.clock;
  ATTIC_ASSIGN_OR_RETURN(std::unique_ptr<redis::ClusterClient> client, redis::ClusterClient::Create(std::move(co)));
  return std::unique_ptr<RedisTier>(new RedisTier(std::move(options), std::move(client)));
}

RedisTier::RedisTier(RedisTierOptions options, std::unique_ptr<redis::ClusterClient> client)
    : options_(std::move(options)), client_(std::move(client)) {}

RedisTier::~RedisTier() = default;

TierTraits RedisTier::traits() const {
  TierTraits t;
  t.shared = true;
  t.enumerable = false;
  t.evicts_itself = true;
  t.local_memory = false;
  t.streams_layers = true;
  return t;
}

std::string RedisTier::HashKey(const std::string& key) const { return options_.prefix + ":kv:{" + key + "}"; }

std::string RedisTier::SessionPointerKey(const EntryKey& session) const {
  EntryKey k = session;
  k.token_hash = 0;  // one pointer per session, whatever its tokens
  return options_.prefix + ":session:{" + k.ToString() + "}";
}

RedisTierStats RedisTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Status RedisTier::Failed(const Status& status) const {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.errors;
  return status;
}

// Parts of `bytes`: an entry is cut at its layers (header, layer 0, ..., tail); anything
// else into kChunk pieces. *expires_at_ms / *entry_key: the entry's (0 / empty session
// when it is not one).
RedisTier::Manifest RedisTier::Plan(std::string_view bytes, int64_t* expires_at_ms, EntryKey* entry_key) {
  Manifest m;
  m.total = bytes.size();
  m.starts.push_back(0);
  *expires_at_ms = 0;
  StatusOr<EntryHeader> h = ParseEntryHeader(bytes);
  if (h.ok() && h->total_bytes == bytes.size() && h->data_offset > 0 && h->data_offset <= bytes.size()) {
    *expires_at_ms = h->meta.expires_at_ms;
    *entry_key = h->meta.key();
    for (int l = 0; l < h->meta.n_layers; ++l) {
      const uint64_t at = EntryLayerOffset(*h, l);
      if (at > m.starts.back() && at < m.total) m.starts.push_back(at);
    }
    const uint64_t tail = EntryLayerOffset(*h, h->meta.n_layers - 1) + h->layer_bytes;
    if (tail > m.starts.back() && tail < m.total) m.starts.push_back(tail);
  } else {
    for (uint64_t at = kChunk; at < m.total; at += kChunk) m.starts.push_back(at);
  }
  std::ostringstream text;
  text << kManifestMagic << ' ' << m.total;
  for (size_t i = 1; i < m.starts.size(); ++i) text << ' ' << m.starts[i];
  m.text = text.str();
  return m;
}

StatusOr<RedisTier::Manifest> RedisTier::ParseManifest(std::string_view text) {
  Manifest m;
  m.text = std::string(text);
  std::vector<std::string_view> words;
  for (size_t at = 0; at <= text.size();) {
    size_t sp = text.find(' ', at);
    if (sp == std::string_view::npos) sp = text.size();
    words.push_back(text.substr(at, sp - at));
    at = sp + 1;
  }
  if (words.size() < 2 || words[0] != kManifestMagic || words.size() > kMaxParts + 1 || !ParseU64(words[1], &m.total))
    return DataLossError("remote tier: malformed manifest");
  m.starts.push_back(0);
  for (size_t i = 2; i < words.size(); ++i) {
    uint64_t s = 0;
    if (!ParseU64(words[i], &s) || s <= m.starts.back() || s >= m.total)
      return DataLossError("remote tier: malformed manifest");
    m.starts.push_back(s);
  }
  return m;
}

Status RedisTier::Put(const std::string& key, std::string_view bytes) {
  if (bytes.size() > options_.capacity)
    return ResourceExhaustedError("remote tier: a value of " + std::to_string(bytes.size()) +
                                  " bytes exceeds its capacity of " + std::to_string(options_.capacity));
  int64_t expires_at_ms = 0;
  EntryKey entry_key;
  const Manifest m = Plan(bytes, &expires_at_ms, &entry_key);
  const std::string hk = HashKey(key);
  std::vector<std::string> fields;  // keeps the field names alive for the command views
  fields.reserve(m.starts.size());
  for (size_t i = 0; i < m.starts.size(); ++i) fields.push_back(PartField(i));
  Command hset = {"HSET", hk, "m", m.text};
  for (size_t i = 0; i < m.starts.size(); ++i) {
    hset.push_back(fields[i]);
    hset.push_back(bytes.substr(m.starts[i], m.end(i) - m.starts[i]));
  }
  const std::string at = std::to_string(expires_at_ms);
  std::vector<Command> cmds = {{"MULTI"}, {"DEL", hk}, hset};
  if (expires_at_ms > 0) cmds.push_back({"PEXPIREAT", hk, at});
  cmds.push_back({"EXEC"});
  auto replies = client_->Pipeline(hk, cmds);
  if (!replies.ok()) return Failed(replies.status());
  for (const Reply& r : *replies)
    if (Status st = redis::ReplyStatus(*r); !st.ok()) return Failed(st);
  const redisReply& exec = *replies->back();
  if (exec.type != REDIS_REPLY_ARRAY) return Failed(InternalError("remote tier: the write was not applied"));
  // The session's pointer: this entry is the newest of its session (best effort: a
  // failure only means other instances do not find it by session).
  if (!entry_key.session_id.empty() && entry_key.ToString() == key) {
    const std::string pk = SessionPointerKey(entry_key);
    Command set = {"SET", pk, key};
    if (expires_at_ms > 0) {
      set.push_back("PXAT");
      set.push_back(at);
    }
    auto r = client_->Run(pk, set);
    if (!r.ok()) Failed(r.status()).IgnoreError();
  }
  std::vector<std::string> over;  // own oldest writes beyond the capacity
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.puts;
    stats_.bytes_written += bytes.size();
    ForgetLocked(key);  // a replaced value of this key
    sizes_[key] = bytes.size();
    order_.push_back(key);
    bytes_ += bytes.size();
    while (bytes_ > options_.capacity && !order_.empty()) {
      const std::string old = order_.front();
      order_.pop_front();
      bytes_ -= sizes_[old];
      sizes_.erase(old);
      over.push_back(old);
      ++stats_.self_evictions;
    }
  }
  for (const std::string& old : over) {
    const std::string ok = HashKey(old);
    auto r = client_->Run(ok, {"DEL", ok});
    if (!r.ok()) Failed(r.status()).IgnoreError();
  }
  return OkStatus();
}

StatusOr<SharedBytes> RedisTier::ReadAll(const std::string& key) {
  // The parts in batches of about kBatchBytes (one HMGET each, the manifest with them),
  // received in place into the entry's buffer; each batch's parts are checked against
  // the plan the read started with (a replacement meanwhile: read again).
  constexpr uint64_t kBatchBytes = 8 << 20;
  const std::string hk = HashKey(key);
  std::unique_ptr<Bytes> out;
  ATTIC_RETURN_IF_ERROR(WithReadPlan(key, hk, &RedisTierStats::gets, [&](const Manifest& m, bool* replaced) {
    // The manifest's total is the cluster's word: a value larger than this instance
    // ever writes (its capacity) is not allocated for.
    if (m.total > options_.capacity)
      return Failed(DataLossError("remote tier: " + hk + " claims " + std::to_string(m.total) +
                                  " bytes, more than the tier's capacity"));
    out = Bytes::Allocate(m.total);
    for (size_t first = 0; first < m.starts.size() && !*replaced;) {
      size_t last = first;
      while (last + 1 < m.starts.size() && m.end(last + 1) - m.starts[first] <= kBatchBytes) ++last;
      const uint64_t lo = m.starts[first], hi = m.end(last);
      ATTIC_RETURN_IF_ERROR(ReadSpan(key, hk, m, lo, hi - lo, out->data() + lo, replaced));
      first = last + 1;
    }
    return OkStatus();
  }));
  return SharedBytes(std::move(out));
}

void RedisTier::Manifest::Cover(uint64_t offset, uint64_t length, size_t* first, size_t* last) const {
  *first = std::upper_bound(starts.begin(), starts.end(), offset) - starts.begin() - 1;
  *last = *first;
  while (*last + 1 < starts.size() && starts[*last + 1] < offset + length) ++*last;
}

Status RedisTier::ReadSpan(const std::string& key, const std::string& hk, const Manifest& m, uint64_t offset,
                           uint64_t length, char* dst, bool* replaced) {
  *replaced = false;
  size_t first = 0, last = 0;
  m.Cover(offset, length, &first, &last);
  // Field 0 is the manifest (kept in the reply); part i is element 1 + i - first.
  const std::function<char*(size_t, size_t)> sink = [&](size_t element, size_t len) -> char* {
    if (element == 0) return nullptr;
    const size_t i = first + element - 1;
    if (i > last || len != m.end(i) - m.starts[i]) return nullptr;  // a bad size: CheckReply says so
    if (m.starts[i] < offset || m.end(i) > offset + length) return nullptr;  // an edge part: copied below
    return dst + (m.starts[i] - offset);
  };
  ATTIC_ASSIGN_OR_RETURN(const Reply r, ReadParts(hk, first, last, &sink));
  ATTIC_RETURN_IF_ERROR(CheckReply(key, hk, m, first, last, *r, replaced));
  if (*replaced) return OkStatus();
  for (size_t i = first; i <= last; ++i) {
    const redisReply* part = r->element[1 + i - first];
    const uint64_t lo = std::max(offset, m.starts[i]), hi = std::min(offset + length, m.end(i));
    char* to = dst + (lo - offset);
    const char* from = part->str + (lo - m.starts[i]);
    if (to != from) std::memcpy(to, from, hi - lo);  // not received in place
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes_read += length;
  return OkStatus();
}

Status RedisTier::WithReadPlan(const std::string& key, const std::string& hk, uint64_t RedisTierStats::*counted,
                               const std::function<Status(const Manifest&, bool*)>& attempt) {
  std::optional<Manifest> plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = manifests_.find(key); it != manifests_.end()) plan = it->second;
  }
  for (int i = 0; i < 3; ++i) {
    if (!plan) {
      auto m = ReadManifest(hk);
      if (!m.ok())
        return m.status().code() == StatusCode::kNotFound ? NotFoundError("no entry " + key + " in the remote tier")
                                                          : m.status();
      plan = std::move(*m);
    }
    bool replaced = false;
    ATTIC_RETURN_IF_ERROR(attempt(*plan, &replaced));
    if (!replaced) {
      std::lock_guard<std::mutex> lock(mu_);
      ++(stats_.*counted);
      RememberLocked(key, *plan);
      return OkStatus();
    }
    plan.reset();  // replaced since the plan was made: plan again
  }
  return Failed(UnavailableError("remote tier: " + hk + " keeps being replaced"));
}

Status RedisTier::ReadInto(const std::string& key, uint64_t offset, uint64_t length, char* dst) {
  const std::string hk = HashKey(key);
  return WithReadPlan(key, hk, &RedisTierStats::range_gets, [&](const Manifest& m, bool* replaced) {
    ATTIC_RETURN_IF_ERROR(CheckRange(m.total, offset, length));
    return ReadSpan(key, hk, m, offset, length, dst, replaced);
  });
}

StatusOr<Reply> RedisTier::ReadParts(const std::string& hk, size_t first, size_t last,
                                     const std::function<char*(size_t, size_t)>* sink) const {
  Command hmget = {"HMGET", hk, "m"};
  std::vector<std::string> fields;  // keeps the field names alive for the command views
  fields.reserve(last - first + 1);
  for (size_t i = first; i <= last; ++i) hmget.push_back(fields.emplace_back(PartField(i)));
  auto replies = client_->Pipeline(hk, {hmget}, sink);
  if (!replies.ok()) return Failed(replies.status());
  const Reply& reply = replies->front();
  const redisReply& r = *reply;
  if (Status st = redis::ReplyStatus(r); !st.ok()) return Failed(st);
  if (r.type != REDIS_REPLY_ARRAY || r.elements != fields.size() + 1)
    return Failed(DataLossError("remote tier: unexpected reply for " + hk));
  return reply;
}

Status RedisTier::CheckReply(const std::string& key, const std::string& hk, const Manifest& m, size_t first,
                             size_t last, const redisReply& r, bool* replaced) {
  *replaced = false;
  const redisReply* head = r.element[0];
  if (head->type == REDIS_REPLY_NIL) {
    std::lock_guard<std::mutex> lock(mu_);
    manifests_.erase(key);
    return NotFoundError("no entry " + key + " in the remote tier");
  }
  if (ReplyText(*head) != m.text) {  // replaced since the plan was made
    *replaced = true;
    return OkStatus();
  }
  for (size_t i = first; i <= last; ++i) {
    const redisReply* part = r.element[1 + i - first];
    if (part->type != REDIS_REPLY_STRING || part->len != m.end(i) - m.starts[i])
      return Failed(DataLossError("remote tier: " + hk + " part " + std::to_string(i) + " is missing or cut"));
  }
  return OkStatus();
}

void RedisTier::RememberLocked(const std::string& key, const Manifest& m) {
  if (manifests_.size() >= kMaxManifests) manifests_.clear();
  manifests_[key] = m;
}

StatusOr<std::string> RedisTier::Get(const std::string& key) {
  ATTIC_ASSIGN_OR_RETURN(SharedBytes b, ReadAll(key));
  return std::string(b->view());
}

StatusOr<SharedBytes> RedisTier::GetShared(const std::string& key) { return ReadAll(key); }

StatusOr<RedisTier::Manifest> RedisTier::ReadManifest(const std::string& hk) {
  auto reply = client_->Run(hk, {"HGET", hk, "m"});
  if (!reply.ok()) return Failed(reply.status());
  if (Status st = redis::ReplyStatus(**reply); !st.ok()) return Failed(st);
  if ((*reply)->type == REDIS_REPLY_NIL) return NotFoundError(hk + " is not in the remote tier");
  return ParseManifest(ReplyText(**reply));
}

StatusOr<ByteRange> RedisTier::GetRange(const std::string& key, uint64_t offset, uint64_t length) {
  const std::string hk = HashKey(key);
  ByteRange out;
  ATTIC_RETURN_IF_ERROR(WithReadPlan(key, hk, &RedisTierStats::range_gets, [&](const Manifest& m, bool* replaced) -> Status {
    ATTIC_RETURN_IF_ERROR(CheckRange(m.total, offset, length));
    size_t first = 0, last = 0;  // the parts the range covers
    m.Cover(offset, length, &first, &last);
    if (first != last) {  // across parts: received in place into a buffer of its own
      std::shared_ptr<Bytes> b = Bytes::Allocate(length);
      ATTIC_RETURN_IF_ERROR(ReadSpan(key, hk, m, offset, length, b->data(), replaced));
      const char* data = b->data();
      out = ByteRange{std::shared_ptr<const void>(std::move(b)), data, static_cast<size_t>(length)};
      return OkStatus();
    }
    // Within one part: a view of the reply, no copy.
    ATTIC_ASSIGN_OR_RETURN(const Reply r, ReadParts(hk, first, last));
    ATTIC_RETURN_IF_ERROR(CheckReply(key, hk, m, first, last, *r, replaced));
    if (*replaced) return OkStatus();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.bytes_read += length;
    }
    const redisReply* part = r->element[1];
    out = ByteRange{std::shared_ptr<const void>(r, part), part->str + (offset - m.starts[first]),
                    static_cast<size_t>(length)};
    return OkStatus();
  }));
  return out;
}

void RedisTier::ForgetLocked(const std::string& key) {
  manifests_.erase(key);
  auto it = sizes_.find(key);
  if (it == sizes_.end()) return;
  bytes_ -= it->second;
  sizes_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), key));
}

Status RedisTier::Erase(const std::string& key) {
  const std::string hk = HashKey(key);
  auto r = client_->Run(hk, {"DEL", hk});
  if (!r.ok()) return Failed(r.status());
  if (Status st = redis::ReplyStatus(**r); !st.ok()) return Failed(st);
  std::lock_guard<std::mutex> lock(mu_);
  ForgetLocked(key);
  return OkStatus();
}

bool RedisTier::Contains(const std::string& key) const {
  const std::string hk = HashKey(key);
  auto r = client_->Run(hk, {"EXISTS", hk});
  return r.ok() && (*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 1;
}

int64_t RedisTier::SizeOf(const std::string& key) const {
  const std::string hk = HashKey(key);
  auto r = client_->Run(hk, {"HGET", hk, "m"});
  if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) return -1;
  auto m = ParseManifest(ReplyText(**r));
  return m.ok() ? static_cast<int64_t>(m->total) : -1;
}

std::vector<std::string> RedisTier::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<std::string>(order_.begin(), order_.end());
}

uint64_t RedisTier::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

StatusOr<std::string> RedisTier::FindSession(const EntryKey& session) {
  if (session.session_id.empty()) return NotFoundError("no session id");
  const std::string pk = SessionPointerKey(session);
  auto r = client_->Run(pk, {"GET", pk});
  if (!r.ok()) return Failed(r.status());
  if (Status st = redis::ReplyStatus(**r); !st.ok()) return Failed(st);
  if ((*r)->type != REDIS_REPLY_STRING) return NotFoundError("no session pointer " + pk);
  std::string key(ReplyText(**r));
  // Only an entry of this very session, model and dtype answers (a pointer is data from
  // the network: never trust it to name something else).
  std::string tag;
  EntryKey want = session;
  want.token_hash = 0;
  const std::string want_key = want.ToString();
  const std::string prefix = want_key.substr(0, want_key.find('-', want_key.find('-', want_key.find('-') + 1) + 1) + 1);
  const std::string suffix = want_key.substr(want_key.rfind('-'));
  if (!ParseEntryKeyName(key, &tag) || key.compare(0, prefix.size(), prefix) != 0 ||
      key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0)
    return DataLossError("remote tier: session pointer " + pk + " names '" + key + "', not an entry of that session");
  return key;
}

}  // namespace attic::store
