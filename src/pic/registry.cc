#include "attic/pic/registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>

#include "attic/core/file.h"
#include "attic/core/hash.h"
#include "attic/core/log.h"
#include "pic/registry_format.h"

namespace attic::pic {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kFormatVersion = 1;  // of both record kinds
constexpr char kCachePrefix[] = "ctx-";
constexpr size_t kCacheIdHex = 24;  // 12 of the creation stamp, 12 random
constexpr size_t kCacheIdSize = 4 + kCacheIdHex;
constexpr char kImplicitPrefix[] = "implicit-";
constexpr size_t kImplicitHex = 32;
constexpr char kJson[] = ".json";
constexpr char kTmp[] = ".tmp";  // WriteFileAtomic's temporary: "<name>.tmp"
constexpr int64_t kMaxStamp = (int64_t{1} << 48) - 1;

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool IsCacheId(std::string_view id) {
  return id.size() == kCacheIdSize && StartsWith(id, kCachePrefix) && IsLowerHex(id.substr(4));
}

// The record name stem ("ctx-<hex>", "implicit-<hex>") of a file name "<stem>.json", or "".
std::string RecordStem(std::string_view name) {
  if (!EndsWith(name, kJson)) return "";
  std::string_view stem = name.substr(0, name.size() - std::strlen(kJson));
  const size_t ip = std::strlen(kImplicitPrefix);
  if (IsCacheId(stem)) return std::string(stem);
  if (stem.size() == ip + kImplicitHex && StartsWith(stem, kImplicitPrefix) && IsLowerHex(stem.substr(ip)))
    return std::string(stem);
  return "";
}

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string ChunkId(const std::string& cache_id, size_t index) { return cache_id + "-c" + std::to_string(index); }

// The implicit record's file name stem: a 128-bit hash of its key (fields length-prefixed).
std::string ImplicitStem(const ChunkKey& key) {
  Hasher h;
  for (const std::string* s : {&key.tenant, &key.model, &key.store_session}) {
    h.UpdatePod(static_cast<uint64_t>(s->size()));
    h.Update(*s);
  }
  return kImplicitPrefix + h.Hex();
}

void FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// json::dump throws on strings that are not UTF-8.
StatusOr<std::string> Dump(const json& j) {
  try {
    return j.dump();
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string("a string is not valid UTF-8: ") + e.what());
  }
}

json TokensJson(const std::vector<int32_t>& tokens) { return json(tokens); }

json CacheJson(const ContextCache& c) {
  json chunks = json::array();
  for (const CachedChunk& ch : c.chunks) chunks.push_back(json{{"tokens", TokensJson(ch.tokens)}});
  return json{{"version", kFormatVersion},
              {"id", c.id},
              {"tenant", c.tenant},
              {"model", c.model},
              {"display_name", c.display_name},
              {"bos", c.bos},
              {"created_at_ms", c.created_at_ms},
              {"expires_at_ms", c.expires_at_ms},
              {"chunks", chunks}};
}

json ImplicitJson(const ChunkKey& key, const std::vector<int32_t>& tokens, bool bos, int64_t expires_at_ms) {
  return json{{"version", kFormatVersion}, {"tenant", key.tenant}, {"model", key.model},
              {"bos", bos}, {"expires_at_ms", expires_at_ms}, {"tokens", TokensJson(tokens)}};
}

// --- parsing a record: DataLoss for anything but our format, Unimplemented for a newer version.

Status Corrupt(const std::string& why) { return DataLossError(why); }

Status CheckVersion(const json& j) {
  if (!j.is_object()) return Corrupt("not a JSON object");
  auto v = j.find("version");
  if (v == j.end() || !v->is_number_integer()) return Corrupt("no integer 'version'");
  const int64_t version = v->get<int64_t>();
  if (version > kFormatVersion)
    return UnimplementedError("format version " + std::to_string(version) + " is newer than this build's " +
                              std::to_string(kFormatVersion));
  if (version < 1) return Corrupt("bad 'version' " + std::to_string(version));
  return OkStatus();
}

Status GetString(const json& j, const char* field, std::string* out) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_string()) return Corrupt(std::string("no string '") + field + "'");
  *out = it->get<std::string>();
  return OkStatus();
}

Status GetInt(const json& j, const char* field, int64_t* out) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_number_integer() ||
      (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}))
    return Corrupt(std::string("no integer '") + field + "'");
  *out = it->get<int64_t>();
  return OkStatus();
}

Status GetBool(const json& j, const char* field, bool* out) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_boolean()) return Corrupt(std::string("no boolean '") + field + "'");
  *out = it->get<bool>();
  return OkStatus();
}

// A non-empty array of int32 token ids.
Status GetTokens(const json& j, const char* field, std::vector<int32_t>* out) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_array() || it->empty()) return Corrupt(std::string("no tokens '") + field + "'");
  out->clear();
  out->reserve(it->size());
  for (const json& t : *it) {
    if (!t.is_number_integer()) return Corrupt("a token id is not an integer");
    const bool in_range = t.is_number_unsigned()
                              ? t.get<uint64_t>() <= uint64_t{std::numeric_limits<int32_t>::max()}
                              : t.get<int64_t>() >= std::numeric_limits<int32_t>::min() &&
                                    t.get<int64_t>() <= std::numeric_limits<int32_t>::max();
    if (!in_range) return Corrupt("a token id is out of range");
    out->push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return OkStatus();
}

StatusOr<ContextCache> ParseCache(const std::string& text, const std::string& id_of_name) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Corrupt("not JSON");
  ATTIC_RETURN_IF_ERROR(CheckVersion(j));
  ContextCache c;
  ATTIC_RETURN_IF_ERROR(GetString(j, "id", &c.id));
  if (c.id != id_of_name) return Corrupt("its id '" + c.id.substr(0, 40) + "' is not its file's");
  ATTIC_RETURN_IF_ERROR(GetString(j, "tenant", &c.tenant));
  ATTIC_RETURN_IF_ERROR(GetString(j, "model", &c.model));
  ATTIC_RETURN_IF_ERROR(GetString(j, "display_name", &c.display_name));
  ATTIC_RETURN_IF_ERROR(GetBool(j, "bos", &c.bos));
  ATTIC_RETURN_IF_ERROR(GetInt(j, "created_at_ms", &c.created_at_ms));
  ATTIC_RETURN_IF_ERROR(GetInt(j, "expires_at_ms", &c.expires_at_ms));
  if (c.expires_at_ms <= c.created_at_ms) return Corrupt("it expires before it was created");
  auto chunks = j.find("chunks");
  if (chunks == j.end() || !chunks->is_array() || chunks->empty()) return Corrupt("no chunks");
  for (const json& cj : *chunks) {
    if (!cj.is_object()) return Corrupt("a chunk is not an object");
    CachedChunk ch;
    ATTIC_RETURN_IF_ERROR(GetTokens(cj, "tokens", &ch.tokens));
    ch.id = ChunkId(c.id, c.chunks.size());
    ch.store_session = ChunkStoreSession(ch.tokens, c.bos);
    c.chunks.push_back(std::move(ch));
  }
  return c;
}

struct ParsedImplicit {
  ChunkKey key;
  std::vector<int32_t> tokens;
  bool bos = true;
  int64_t expires_at_ms = 0;
};

StatusOr<ParsedImplicit> ParseImplicit(const std::string& text, const std::string& stem_of_name) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Corrupt("not JSON");
  ATTIC_RETURN_IF_ERROR(CheckVersion(j));
  ParsedImplicit r;
  ATTIC_RETURN_IF_ERROR(GetString(j, "tenant", &r.key.tenant));
  ATTIC_RETURN_IF_ERROR(GetString(j, "model", &r.key.model));
  ATTIC_RETURN_IF_ERROR(GetBool(j, "bos", &r.bos));
  ATTIC_RETURN_IF_ERROR(GetInt(j, "expires_at_ms", &r.expires_at_ms));
  ATTIC_RETURN_IF_ERROR(GetTokens(j, "tokens", &r.tokens));
  r.key.store_session = ChunkStoreSession(r.tokens, r.bos);
  if (ImplicitStem(r.key) != stem_of_name) return Corrupt("its chunk is not its file's");
  return r;
}

Status NotFound(const std::string& id) { return NotFoundError("context cache '" + id + "' not found"); }

}  // namespace

namespace internal {

std::string MakeCacheId(int64_t stamp_ms, uint64_t random) {
  return kCachePrefix + Hex16(static_cast<uint64_t>(std::clamp<int64_t>(stamp_ms, 0, kMaxStamp))).substr(4) +
         Hex16(random & ((uint64_t{1} << 48) - 1)).substr(4);
}

bool IsCacheIdText(std::string_view id) { return IsCacheId(id); }

void AssignChunkIds(ContextCache* cache) {
  for (size_t i = 0; i < cache->chunks.size(); ++i) {
    cache->chunks[i].id = ChunkId(cache->id, i);
    cache->chunks[i].store_session = ChunkStoreSession(cache->chunks[i].tokens, cache->bos);
  }
}

StatusOr<std::string> CacheRecordText(const ContextCache& cache) { return Dump(CacheJson(cache)); }

StatusOr<ContextCache> ParseCacheRecord(const std::string& text, const std::string& id) { return ParseCache(text, id); }

Status CacheNotFound(const std::string& id) { return NotFound(id); }

}  // namespace internal

int ContextCache::n_tokens() const {
  size_t n = 0;
  for (const CachedChunk& c : chunks) n += c.tokens.size();
  return static_cast<int>(n);
}

std::string ChunkStoreSession(const std::vector<int32_t>& tokens, bool bos) {
  std::string bytes;
  bytes.reserve(1 + 4 * tokens.size());
  bytes.push_back(bos ? 1 : 0);
  for (int32_t t : tokens) {
    const auto u = static_cast<uint32_t>(t);
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>((u >> (8 * b)) & 0xff));
  }
  return kChunkStoreSessionPrefix + Hex16(Hash64(bytes));
}

bool IsChunkStoreSession(std::string_view session_id) { return StartsWith(session_id, kChunkStoreSessionPrefix); }

LocalContextCacheRegistry::LocalContextCacheRegistry(std::string dir, const store::Clock* clock, RegistryOptions options)
    : dir_(std::move(dir)),
      clock_(clock != nullptr ? clock : store::SystemClock::Default()),
      options_(options),
      rng_(std::random_device{}()) {}

LocalContextCacheRegistry::~LocalContextCacheRegistry() = default;

StatusOr<std::unique_ptr<LocalContextCacheRegistry>> ContextCacheRegistry::Open(const std::string& dir,
                                                                               const store::Clock* clock,
                                                                               RegistryOptions options) {
  std::unique_ptr<LocalContextCacheRegistry> r(new LocalContextCacheRegistry(dir, clock, options));
  if (!dir.empty()) {
    ATTIC_RETURN_IF_ERROR(MakeDirectories(dir));
    ATTIC_RETURN_IF_ERROR(r->Load());
  }
  return r;
}

// Runs in Open, before the registry is shared: the *Locked calls need no lock here.
Status LocalContextCacheRegistry::Load() {
  std::vector<std::string> names;
  std::string foreign_example;
  std::error_code ec;
  fs::directory_iterator it(dir_, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code sec;
    const bool regular = it->symlink_status(sec).type() == fs::file_type::regular;  // a link is not ours
    const bool tmp = EndsWith(name, kTmp) && !RecordStem(name.substr(0, name.size() - std::strlen(kTmp))).empty();
    if (regular && (tmp || !RecordStem(name).empty())) {
      names.push_back(name);
    } else {
      ++open_report_.foreign;
      if (foreign_example.empty()) foreign_example = name;
    }
  }
  if (ec) return UnavailableError("cannot list context cache directory '" + dir_ + "': " + ec.message());
  if (open_report_.foreign > 0)
    Log(LogLevel::kWarn, "context caches: %d files in '%s' are not Attic's (e.g. '%s'): left untouched",
        open_report_.foreign, dir_.c_str(), foreign_example.c_str());

  const int64_t now = clock_->NowMs();
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string path = JoinPath(dir_, name);
    if (EndsWith(name, kTmp)) {  // a write a crash interrupted
      ::unlink(path.c_str());
      ++open_report_.stale_tmp;
      continue;
    }
    const std::string stem = RecordStem(name);
    const bool is_cache = IsCacheId(stem);
    StatusOr<std::string> text = ReadFileToString(path);
    Status st = text.status();
    std::vector<ChunkKey> keys;  // of the record
    int64_t expires_at_ms = 0;
    std::optional<ContextCache> cache;
    std::optional<ParsedImplicit> implicit;
    if (st.ok() && is_cache) {
      StatusOr<ContextCache> c = ParseCache(*text, stem);
      st = c.status();
      if (st.ok()) {
        cache = std::move(c).value();
        expires_at_ms = cache->expires_at_ms;
        for (const CachedChunk& ch : cache->chunks) keys.push_back({cache->tenant, cache->model, ch.store_session});
      }
    } else if (st.ok()) {
      StatusOr<ParsedImplicit> p = ParseImplicit(*text, stem);
      st = p.status();
      if (st.ok()) {
        implicit = std::move(p).value();
        expires_at_ms = implicit->expires_at_ms;
        keys.push_back(implicit->key);
      }
    }
    if (st.code() == StatusCode::kUnimplemented) {
      Log(LogLevel::kWarn, "context caches: leaving '%s' untouched: %s", path.c_str(), st.message().c_str());
      ++open_report_.newer;
      continue;
    }
    if (!st.ok()) {
      Log(LogLevel::kWarn, "context caches: removing corrupt record '%s': %s", path.c_str(), st.message().c_str());
      ::unlink(path.c_str());
      ++open_report_.corrupt;
      continue;
    }
    if (cache) {  // new ids sort after every id this registry has given (the stamp is its first 12 hex)
      last_stamp_ms_ = std::max(last_stamp_ms_, static_cast<int64_t>(std::stoull(stem.substr(4, 12), nullptr, 16)));
    }
    if (now >= expires_at_ms) {
      ::unlink(path.c_str());
      ++open_report_.expired;
      for (ChunkKey& k : keys) unreferenced_.insert(std::move(k));  // ExpireNow keeps those still referenced
      continue;
    }
    if (cache) {
      InsertCacheLocked(std::move(*cache));
      ++open_report_.caches;
    } else {
      RefLocked(implicit->key);
      ++implicit_per_tenant_[implicit->key.tenant];
      implicit_[implicit->key] = Implicit{std::move(implicit->tokens), implicit->bos, implicit->expires_at_ms};
      ++open_report_.implicit;
    }
  }
  if (open_report_.stale_tmp + open_report_.corrupt + open_report_.expired > 0) FsyncDir(dir_);
  return OkStatus();
}

Status LocalContextCacheRegistry::WriteRecord(const std::string& name, const std::string& text) {
  if (dir_.empty()) return OkStatus();
  ATTIC_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(dir_, name), text));
  FsyncDir(dir_);
  return OkStatus();
}

Status LocalContextCacheRegistry::RemoveRecord(const std::string& name) {
  if (dir_.empty()) return OkStatus();
  const std::string path = JoinPath(dir_, name);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus("cannot remove", path, errno);
  FsyncDir(dir_);
  return OkStatus();
}

std::string LocalContextCacheRegistry::NewId(int64_t now_ms) {
  last_stamp_ms_ = std::min(kMaxStamp, std::max(now_ms, last_stamp_ms_ + 1));
  return internal::MakeCacheId(last_stamp_ms_, rng_());
}

const ContextCache* LocalContextCacheRegistry::FindLiveLocked(const std::string& tenant, const std::string& id,
                                                         int64_t now_ms) const {
  auto it = caches_.find(id);
  if (it == caches_.end() || it->second.tenant != tenant || now_ms >= it->second.expires_at_ms) return nullptr;
  return &it->second;
}

int LocalContextCacheRegistry::LiveCachesLocked(const std::string& tenant, int64_t now_ms) const {
  auto it = tenant_caches_.find(tenant);
  if (it == tenant_caches_.end()) return 0;
  return static_cast<int>(std::count_if(it->second.begin(), it->second.end(), [&](const std::string& id) {
    return now_ms < caches_.at(id).expires_at_ms;
  }));
}

int LocalContextCacheRegistry::LiveImplicitLocked(const std::string& tenant, int64_t now_ms) const {
  int n = 0;
  for (auto it = implicit_.lower_bound(ChunkKey{tenant, "", ""}); it != implicit_.end() && it->first.tenant == tenant;
       ++it)
    n += now_ms < it->second.expires_at_ms ? 1 : 0;
  return n;
}

void LocalContextCacheRegistry::InsertCacheLocked(ContextCache cache) {
  for (const CachedChunk& ch : cache.chunks) RefLocked({cache.tenant, cache.model, ch.store_session});
  tenant_caches_[cache.tenant].insert(cache.id);
  std::string id = cache.id;
  caches_.emplace(std::move(id), std::move(cache));
}

void LocalContextCacheRegistry::EraseCacheLocked(const std::string& id) {
  auto it = caches_.find(id);
  ATTIC_CHECK(it != caches_.end());
  const ContextCache& c = it->second;
  for (const CachedChunk& ch : c.chunks) UnrefLocked({c.tenant, c.model, ch.store_session});
  auto t = tenant_caches_.find(c.tenant);
  t->second.erase(id);
  if (t->second.empty()) tenant_caches_.erase(t);
  caches_.erase(it);
}

void LocalContextCacheRegistry::RefLocked(const ChunkKey& key) { ++refs_[key]; }

void LocalContextCacheRegistry::UnrefLocked(const ChunkKey& key) {
  auto it = refs_.find(key);
  ATTIC_CHECK(it != refs_.end() && it->second > 0);
  if (--it->second == 0) {
    refs_.erase(it);
    unreferenced_.insert(key);
  }
}

StatusOr<ContextCache> LocalContextCacheRegistry::Create(ContextCache cache) {
  std::lock_guard<std::mutex> write(write_mu_);
  const int64_t now = clock_->NowMs();
  if (cache.chunks.empty()) return InvalidArgumentError("a context cache needs at least one chunk");
  for (size_t i = 0; i < cache.chunks.size(); ++i)
    if (cache.chunks[i].tokens.empty()) return InvalidArgumentError("chunk " + std::to_string(i) + " has no tokens");
  if (cache.expires_at_ms <= now) return InvalidArgumentError("the expiry time is not in the future");
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tenant_caches_.find(cache.tenant);
    if (it != tenant_caches_.end() && static_cast<int>(it->second.size()) >= options_.max_caches_per_tenant &&
        LiveCachesLocked(cache.tenant, now) >= options_.max_caches_per_tenant)
      return ResourceExhaustedError("too many context caches (at most " +
                                    std::to_string(options_.max_caches_per_tenant) +
                                    "): delete some or wait for them to expire");
  }
  const int64_t stamp_before = last_stamp_ms_;
  cache.id = NewId(now);
  cache.created_at_ms = now;
  internal::AssignChunkIds(&cache);
  StatusOr<std::string> text = internal::CacheRecordText(cache);
  Status st = text.ok() ? WriteRecord(cache.id + kJson, *text) : text.status();
  if (!st.ok()) {
    last_stamp_ms_ = stamp_before;
    return st;
  }
  std::lock_guard<std::mutex> lock(mu_);
  InsertCacheLocked(cache);
  return cache;
}

StatusOr<ContextCache> LocalContextCacheRegistry::Get(const std::string& tenant, const std::string& id) const {
  const int64_t now = clock_->NowMs();
  std::lock_guard<std::mutex> lock(mu_);
  const ContextCache* c = FindLiveLocked(tenant, id, now);
  if (c == nullptr) return NotFound(id);
  return *c;
}

StatusOr<std::vector<CachedChunk>> ContextCacheRegistry::Resolve(const std::string& tenant,
                                                               const std::string& id) const {
  // "<cache id>-c<index>", the index in canonical decimal.
  std::string cache_id = id;
  int64_t index = -1;
  if (id.size() > kCacheIdSize + 2 && id.compare(kCacheIdSize, 2, "-c") == 0) {
    const std::string digits = id.substr(kCacheIdSize + 2);
    if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        (digits.size() > 1 && digits[0] == '0'))
      return NotFound(id);
    cache_id = id.substr(0, kCacheIdSize);
    index = std::stoll(digits);
  }
  StatusOr<ContextCache> c = Get(tenant, cache_id);
  if (!c.ok()) return c.status().code() == StatusCode::kNotFound ? NotFound(id) : c.status();
  if (index < 0) return std::move(c->chunks);
  if (index >= static_cast<int64_t>(c->chunks.size())) return NotFound(id);
  return std::vector<CachedChunk>{std::move(c->chunks[static_cast<size_t>(index)])};
}

StatusOr<CachePage> LocalContextCacheRegistry::List(const std::string& tenant, const std::string& after_id,
                                                    int limit) const {
  limit = std::max(limit, 1);
  const int64_t now = clock_->NowMs();
  CachePage page;
  std::lock_guard<std::mutex> lock(mu_);
  auto t = tenant_caches_.find(tenant);
  if (t == tenant_caches_.end()) return page;
  const std::set<std::string>& ids = t->second;
  for (auto it = after_id.empty() ? ids.begin() : ids.upper_bound(after_id); it != ids.end(); ++it) {
    const ContextCache& c = caches_.at(*it);
    if (now >= c.expires_at_ms) continue;
    if (static_cast<int>(page.data.size()) == limit) {
      page.has_more = true;
      break;
    }
    page.data.push_back(c);
  }
  return page;
}

StatusOr<ContextCache> LocalContextCacheRegistry::SetExpiry(const std::string& tenant, const std::string& id,
                                                       int64_t expires_at_ms) {
  std::lock_guard<std::mutex> write(write_mu_);
  const int64_t now = clock_->NowMs();
  ContextCache updated;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const ContextCache* c = FindLiveLocked(tenant, id, now);
    if (c == nullptr) return NotFound(id);
    updated = *c;
  }
  if (expires_at_ms <= now) return InvalidArgumentError("the expiry time is not in the future");
  updated.expires_at_ms = expires_at_ms;
  StatusOr<std::string> text = Dump(CacheJson(updated));
  ATTIC_RETURN_IF_ERROR(text.ok() ? WriteRecord(id + kJson, *text) : text.status());
  std::lock_guard<std::mutex> lock(mu_);
  caches_.at(id).expires_at_ms = expires_at_ms;  // nothing else changed it: changes hold write_mu_
  return updated;
}

Status LocalContextCacheRegistry::Delete(const std::string& tenant, const std::string& id) {
  std::lock_guard<std::mutex> write(write_mu_);
  const int64_t now = clock_->NowMs();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (FindLiveLocked(tenant, id, now) == nullptr) return NotFound(id);
  }
  ATTIC_RETURN_IF_ERROR(RemoveRecord(id + kJson));
  std::lock_guard<std::mutex> lock(mu_);
  EraseCacheLocked(id);
  return OkStatus();
}

Status LocalContextCacheRegistry::TouchImplicit(const std::string& tenant, const std::string& model,
                                           const std::vector<int32_t>& tokens, bool bos, int64_t expires_at_ms) {
  std::lock_guard<std::mutex> write(write_mu_);
  const int64_t now = clock_->NowMs();
  if (tokens.empty()) return InvalidArgumentError("an implicitly cached chunk has no tokens");
  if (expires_at_ms <= now) return InvalidArgumentError("the expiry time is not in the future");
  const ChunkKey key{tenant, model, ChunkStoreSession(tokens, bos)};
  bool exists = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = implicit_.find(key);
    exists = it != implicit_.end();
    if (exists && it->second.expires_at_ms >= expires_at_ms) return OkStatus();  // (an expired one is < now)
    if (!exists && implicit_per_tenant_[tenant] >= options_.max_implicit_per_tenant &&
        LiveImplicitLocked(tenant, now) >= options_.max_implicit_per_tenant)
      return ResourceExhaustedError("too many implicitly cached chunks (at most " +
                                    std::to_string(options_.max_implicit_per_tenant) + ")");
  }
  StatusOr<std::string> text = Dump(ImplicitJson(key, tokens, bos, expires_at_ms));
  ATTIC_RETURN_IF_ERROR(text.ok() ? WriteRecord(ImplicitStem(key) + kJson, *text) : text.status());
  std::lock_guard<std::mutex> lock(mu_);
  if (exists) {  // (an expired record still holds its reference until ExpireNow drops it)
    implicit_.at(key).expires_at_ms = expires_at_ms;
  } else {
    RefLocked(key);
    ++implicit_per_tenant_[tenant];
    implicit_.emplace(key, Implicit{tokens, bos, expires_at_ms});
  }
  return OkStatus();
}

bool LocalContextCacheRegistry::ReferencesImplicit(const ChunkKey& key) const {
  return HasImplicit(key.tenant, key.model, key.store_session);
}

bool LocalContextCacheRegistry::HasImplicit(const std::string& tenant, const std::string& model,
                                       const std::string& store_session) const {
  const int64_t now = clock_->NowMs();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = implicit_.find(ChunkKey{tenant, model, store_session});
  return it != implicit_.end() && now < it->second.expires_at_ms;
}

std::vector<ChunkKey> LocalContextCacheRegistry::ExpireNow() {
  std::lock_guard<std::mutex> write(write_mu_);
  const int64_t now = clock_->NowMs();
  std::vector<std::string> cache_ids;
  std::vector<ChunkKey> implicit_keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, c] : caches_)
      if (now >= c.expires_at_ms) cache_ids.push_back(id);
    for (const auto& [key, r] : implicit_)
      if (now >= r.expires_at_ms) implicit_keys.push_back(key);
  }
  // A file that cannot be removed now is an expired record, which the next Open drops.
  for (const std::string& id : cache_ids) {
    Status st = RemoveRecord(id + kJson);
    if (!st.ok()) Log(LogLevel::kWarn, "context caches: %s", st.ToString().c_str());
  }
  for (const ChunkKey& key : implicit_keys) {
    Status st = RemoveRecord(ImplicitStem(key) + kJson);
    if (!st.ok()) Log(LogLevel::kWarn, "context caches: %s", st.ToString().c_str());
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : cache_ids) EraseCacheLocked(id);
  for (const ChunkKey& key : implicit_keys) {
    UnrefLocked(key);
    if (--implicit_per_tenant_[key.tenant] == 0) implicit_per_tenant_.erase(key.tenant);
    implicit_.erase(key);
  }
  std::vector<ChunkKey> out;
  for (const ChunkKey& key : unreferenced_)
    if (refs_.find(key) == refs_.end()) out.push_back(key);
  unreferenced_.clear();
  return out;
}

std::vector<LiveChunk> LocalContextCacheRegistry::LiveChunks() const {
  const int64_t now = clock_->NowMs();
  std::map<ChunkKey, LiveChunk> live;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, c] : caches_) {
    if (now >= c.expires_at_ms) continue;
    for (const CachedChunk& ch : c.chunks) {
      ChunkKey key{c.tenant, c.model, ch.store_session};
      if (live.count(key) == 0) live.emplace(key, LiveChunk{key, ch.tokens, c.bos});
    }
  }
  for (const auto& [key, r] : implicit_)
    if (now < r.expires_at_ms && live.count(key) == 0) live.emplace(key, LiveChunk{key, r.tokens, r.bos});
  std::vector<LiveChunk> out;
  out.reserve(live.size());
  for (auto& [key, chunk] : live) out.push_back(std::move(chunk));
  return out;
}

}  // namespace attic::pic
