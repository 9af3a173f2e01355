#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "attic/core/file.h"
#include "attic/core/file_env.h"
#include "attic/core/log.h"
#include "attic/store/entry.h"
#include "attic/store/tier.h"

namespace attic::store {

namespace {

constexpr char kSuffix[] = ".kv";               // an entry: <key>.kv
constexpr char kTmpSuffix[] = ".tmp";           // its write in progress: <key>.kv.tmp
constexpr char kTmpEntrySuffix[] = ".kv.tmp";
constexpr size_t kChunk = 1 << 20;             // aligned I/O unit
constexpr size_t kParallelThreshold = 8 << 20;  // split larger transfers across threads
constexpr int kIoThreads = 4;

// Calls io(pos, len) (a pread or pwrite at pos, returning its result) over [off, end) in
// kChunk pieces, the last request reaching up to `stop` >= end. Returns errno or 0; no
// progress (end of file) is EIO.
template <typename Io>
int ChunkedIo(size_t off, size_t end, size_t stop, Io io) {
  for (size_t pos = off; pos < end;) {
    const ssize_t r = io(pos, std::min(kChunk, stop - pos));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return EIO;
    pos += static_cast<size_t>(r);
  }
  return 0;
}

int WriteRange(FileEnv* env, int fd, const char* buf, size_t off, size_t n) {
  return ChunkedIo(off, off + n, off + n, [&](size_t pos, size_t len) {
    return env->Pwrite(fd, buf + pos, len, static_cast<off_t>(pos));
  });
}

// Reads the file's bytes [off, off + n) into buf + off. Offsets are kChunk-aligned and
// the file's tail is requested rounded up to Bytes::kAlign (the buffer's capacity covers
// it; the read stops at the end of the file), as O_DIRECT needs.
int ReadRange(FileEnv* env, int fd, char* buf, size_t off, size_t n) {
  const size_t stop = (off + n + Bytes::kAlign - 1) / Bytes::kAlign * Bytes::kAlign;
  return ChunkedIo(off, off + n, stop, [&](size_t pos, size_t len) {
    return env->Pread(fd, buf + pos, len, static_cast<off_t>(pos));
  });
}

// Runs fn(off, len) over [0, n) split across up to kIoThreads threads in chunk-aligned
// ranges (one range below kParallelThreshold). Returns the first nonzero errno, or 0.
template <typename Fn>
int SplitRanges(size_t n, Fn fn) {
  if (n < kParallelThreshold) return fn(size_t{0}, n);
  size_t chunks = (n + kChunk - 1) / kChunk;
  size_t per = (chunks + kIoThreads - 1) / kIoThreads * kChunk;
  std::vector<int> errs(kIoThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kIoThreads; ++t) {
    size_t off = t * per;
    if (off >= n) break;
    size_t len = std::min(per, n - off);
    threads.emplace_back([&, t, off, len] { errs[t] = fn(off, len); });
  }
  for (auto& th : threads) th.join();
  for (int e : errs)
    if (e != 0) return e;
  return 0;
}

bool EndsWith(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// OpenForReading through `env`.
StatusOr<OpenedFile> OpenThrough(FileEnv* env, const std::string& path, int extra_flags) {
  OpenedFile f;
  f.fd = env->Open(path, O_RDONLY | O_CLOEXEC | extra_flags);
  if (f.fd < 0) return ErrnoStatus("cannot open", path, errno);
  struct stat st;
  if (::fstat(f.fd, &st) != 0) {
    const int err = errno;
    env->Close(f.fd);
    return ErrnoStatus("cannot stat", path, err);
  }
  f.size = static_cast<uint64_t>(st.st_size);
  return f;
}

void FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

namespace fs = std::filesystem;

constexpr char kMarkerTmp[] = "ATTIC_KV_STORE.tmp";  // the marker while it is written
constexpr char kMarkerWord[] = "attic-kv-store";
constexpr char kLostFound[] = "lost+found";           // a fresh file system's: never Attic's, never foreign

bool IsTag(const std::string& name) {
  return name.size() == 16 &&
         std::all_of(name.begin(), name.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// The entry key of a file name with `suffix` (".kv", ".kv.tmp") when the rest is an entry
// key of the model `tag`; "" otherwise.
std::string EntryKeyOf(const std::string& name, const char* suffix, const std::string& tag) {
  if (!EndsWith(name, suffix)) return "";
  std::string key = name.substr(0, name.size() - std::strlen(suffix));
  std::string key_tag;
  return ParseEntryKeyName(key, &key_tag) && key_tag == tag ? key : "";
}

// Calls fn(entry) for each entry of `dir`. Unavailable when it cannot be listed.
template <typename Fn>
Status ForEachEntry(const std::string& dir, Fn fn) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) fn(*it);
  if (ec) return UnavailableError("cannot list KV store directory '" + dir + "': " + ec.message());
  return OkStatus();
}

bool IsRegularFile(const fs::directory_entry& de) {
  std::error_code ec;
  return de.symlink_status(ec).type() == fs::file_type::regular;  // a link is not Attic's
}

bool IsDirectory(const fs::directory_entry& de) {
  std::error_code ec;
  return de.is_directory(ec);
}

// The marker's format version; FailedPrecondition when the file is not a marker.
StatusOr<int> ReadMarker(const std::string& path) {
  std::error_code ec;
  if (fs::symlink_status(path, ec).type() != fs::file_type::regular || fs::file_size(path, ec) > 4096)
    return FailedPreconditionError("is not an Attic store marker");
  ATTIC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  const std::string line = text.substr(0, text.find('\n'));
  const std::string word = std::string(kMarkerWord) + " ";
  if (line.compare(0, word.size(), word) != 0 || line.size() == word.size() || line.size() > word.size() + 6 ||
      !std::all_of(line.begin() + word.size(), line.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return FailedPreconditionError("is not an Attic store marker (it starts '" + line.substr(0, 40) + "')");
  const int version = std::stoi(line.substr(word.size()));
  if (version < 1)
    return FailedPreconditionError("is not an Attic store marker (format " + std::to_string(version) + ")");
  return version;
}

Status WriteMarker(const std::string& root) {
  const std::string tmp = JoinPath(root, kMarkerTmp), path = JoinPath(root, SsdTier::kMarkerName);
  const std::string text = std::string(kMarkerWord) + " " + std::to_string(SsdTier::kFormatVersion) +
                           "\n"
                           "# The KV store of Attic (attic serve --kv-ssd-dir; docs/store.md). Each subdirectory\n"
                           "# holds one model's entries, <key>.kv; Attic reads, writes and removes nothing else\n"
                           "# here. Removing a model's subdirectory while no server of that model runs frees its\n"
                           "# space.\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", tmp, errno);
  int err = WriteRange(FileEnv::Default(), fd, text.data(), 0, text.size());
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  ::close(fd);
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  // (ENOENT: another server making the same directory a store renamed it first.)
  if (err == ENOENT && ReadMarker(path).ok()) err = 0;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return ErrnoStatus("cannot write", path, err);
  }
  FsyncDir(root);
  return OkStatus();
}

}  // namespace

std::string SsdTier::ModelDir(const std::string& root, const std::string& fingerprint) {
  return JoinPath(root, FingerprintTag(fingerprint));
}

bool SsdTier::Mine(const std::string& key) const {
  std::string tag;
  return ParseEntryKeyName(key, &tag) && tag == tag_;
}

StatusOr<std::unique_ptr<SsdTier>> SsdTier::Open(const std::string& root, const std::string& fingerprint,
                                                 uint64_t capacity, FileEnv* env) {
  auto refuse = [&](const std::string& why) {
    return FailedPreconditionError("directory '" + root + "' " + why + " (nothing in it was touched)");
  };
  std::error_code ec;
  const bool exists = fs::exists(root, ec);
  if (exists && !fs::is_directory(root, ec)) return refuse("is not a directory");
  const std::string marker = JoinPath(root, kMarkerName);
  std::unique_ptr<SsdTier> tier(new SsdTier(FingerprintTag(fingerprint), capacity, env));
  SsdScan& scan = tier->scan_;
  scan.root = root;
  scan.dir = JoinPath(root, tier->tag_);
  auto marked = [&] { return fs::symlink_status(marker, ec).type() != fs::file_type::not_found; };
  std::string example;  // a name in an unmarked directory that is not empty
  if (exists && !marked()) {
    ATTIC_RETURN_IF_ERROR(ForEachEntry(root, [&](const fs::directory_entry& de) {
      const std::string name = de.path().filename().string();
      if (example.empty() && name != kLostFound && name != kMarkerTmp) example = name;
    }));
  }
  if (exists && (marked() || !example.empty())) {  // (marked meanwhile: another server made it a store)
    if (!marked())
      return refuse("is not empty (it holds '" + example + "') and has no " + std::string(kMarkerName) +
                    " marker, so it is not an Attic KV store: give --kv-ssd-dir an empty or new directory, which "
                    "Attic then keeps to itself");
    StatusOr<int> version = ReadMarker(marker);
    if (!version.ok())
      return refuse("holds a file " + std::string(kMarkerName) + " that " + version.status().message());
    if (*version > kFormatVersion)
      return refuse("is a KV store of a newer Attic (store format " + std::to_string(*version) +
                    "; this Attic reads format " + std::to_string(kFormatVersion) +
                    "): serve it with that Attic, or give --kv-ssd-dir another directory");
  } else {
    // New, or empty: Attic's from now on.
    ATTIC_RETURN_IF_ERROR(MakeDirectories(root));
    ATTIC_RETURN_IF_ERROR(WriteMarker(root));
    scan.created = true;
  }
  if (fs::exists(scan.dir, ec) && !fs::is_directory(scan.dir, ec))
    return refuse("holds '" + tier->tag_ + "', which should be the directory of this model's entries and is not");
  if (!fs::exists(scan.dir, ec)) {
    ATTIC_RETURN_IF_ERROR(MakeDirectories(scan.dir));
    FsyncDir(root);
  }

  auto foreign = [&](const std::string& name, bool dir) {
    if (scan.foreign++ == 0) scan.foreign_example = name + (dir ? "/" : "");
  };
  // The store directory: the marker, model subdirectories, and whatever else is there.
  ATTIC_RETURN_IF_ERROR(ForEachEntry(root, [&](const fs::directory_entry& de) {
    const std::string name = de.path().filename().string();
    if (name == kMarkerName || name == kMarkerTmp || name == kLostFound || name == tier->tag_ ||
        name == kContextCacheDirName)
      return;
    if (!IsDirectory(de) || !IsTag(name)) return foreign(name, IsDirectory(de));
    // Another model's entries: counted, never opened, never removed.
    const uint64_t entries_before = scan.other_model_entries;
    Status st = ForEachEntry(de.path().string(), [&](const fs::directory_entry& f) {
      const std::string fname = f.path().filename().string();
      std::error_code fec;
      if (IsRegularFile(f) && !EntryKeyOf(fname, kSuffix, name).empty()) {
        ++scan.other_model_entries;
        scan.other_model_bytes += f.file_size(fec);
      } else if (!IsRegularFile(f) || EntryKeyOf(fname, kTmpEntrySuffix, name).empty()) {
        foreign(name + "/" + fname, IsDirectory(f));  // (a write in progress there is that model's)
      }
    });
    st.IgnoreError();  // unreadable: nothing counted, nothing touched
    if (scan.other_model_entries > entries_before) ++scan.other_models;
  }));
  // This model's directory: its entries and its interrupted writes; nothing else.
  ATTIC_RETURN_IF_ERROR(ForEachEntry(scan.dir, [&](const fs::directory_entry& de) {
    const std::string name = de.path().filename().string();
    std::error_code fec;
    if (!IsRegularFile(de)) return foreign(tier->tag_ + "/" + name, IsDirectory(de));
    if (!EntryKeyOf(name, kTmpEntrySuffix, tier->tag_).empty()) {  // an interrupted write: never visible, now gone
      if (fs::remove(de.path(), fec)) ++scan.removed_temp_files;
      return;
    }
    const std::string key = EntryKeyOf(name, kSuffix, tier->tag_);
    if (key.empty()) return foreign(tier->tag_ + "/" + name, false);
    const uint64_t size = de.file_size(fec);
    if (fec) return;
    tier->sizes_[key] = size;
    tier->bytes_ += size;
  }));
  if (scan.foreign > 0)
    Log(LogLevel::kWarn, "KV store: %llu file%s in '%s' %s not Attic's (e.g. '%s'): left untouched",
        static_cast<unsigned long long>(scan.foreign), scan.foreign == 1 ? "" : "s", root.c_str(),
        scan.foreign == 1 ? "is" : "are", scan.foreign_example.c_str());
  return tier;
}

std::string SsdTier::PathOf(const std::string& key) const { return JoinPath(scan_.dir, key + kSuffix); }

Status SsdTier::Put(const std::string& key, std::string_view bytes) {
  if (!Mine(key)) return InvalidArgumentError("'" + key + "' is not a KV entry key of this model");
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(key);
    uint64_t old = it == sizes_.end() ? 0 : it->second;
    if (bytes_ - old + pending_ + bytes.size() > capacity_)
      return ResourceExhaustedError("SSD tier full: " + std::to_string(bytes_) + " + " + std::to_string(bytes.size()) +
                                    " > " + std::to_string(capacity_));
    pending_ += bytes.size();
  }
  std::string path = PathOf(key);
  std::string tmp = path + kTmpSuffix;
  auto finish = [&](Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ -= bytes.size();
    if (st.ok()) {
      auto it = sizes_.find(key);
      if (it != sizes_.end()) bytes_ -= it->second;
      sizes_[key] = bytes.size();
      bytes_ += bytes.size();
    }
    return st;
  };
  int fd = env_->Open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return finish(ErrnoStatus("cannot create", tmp, errno));
  int err = SplitRanges(bytes.size(),
                        [&](size_t off, size_t n) { return WriteRange(env_, fd, bytes.data(), off, n); });
  if (err == 0 && env_->Fsync(fd) != 0) err = errno;
  if (err == 0) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // written back: drop the cached pages
  env_->Close(fd);
  if (err == 0 && env_->Rename(tmp, path) != 0) err = errno;
  if (err != 0) {
    env_->Unlink(tmp);
    return finish(ErrnoStatus("cannot write", path, err));
  }
  FsyncDir(scan_.dir);
  return finish(OkStatus());
}

StatusOr<std::string> SsdTier::Get(const std::string& key) {
  ATTIC_ASSIGN_OR_RETURN(SharedBytes bytes, GetShared(key));
  return std::string(bytes->view());
}

StatusOr<SharedBytes> SsdTier::GetShared(const std::string& key) {
  if (!Mine(key)) return NotFoundError("no KV entry '" + key + "' of this model");
  const std::string path = PathOf(key);
  // O_DIRECT straight into the aligned buffer where the file system allows it; else
  // (tmpfs, or a refused read) through the page cache.
  for (const bool direct : {true, false}) {
    StatusOr<OpenedFile> f = OpenThrough(env_, path, direct ? O_DIRECT : 0);
    if (!f.ok()) {
      if (direct && f.status().code() != StatusCode::kNotFound) continue;  // O_DIRECT refused
      return f.status();
    }
    const size_t size = static_cast<size_t>(f->size);
    std::unique_ptr<Bytes> out = Bytes::Allocate(size);
    if (!direct) ::posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    const int err =
        SplitRanges(size, [&](size_t off, size_t n) { return ReadRange(env_, f->fd, out->data(), off, n); });
    if (!direct) ::posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
    env_->Close(f->fd);
    if (direct && err == EINVAL) continue;
    if (err != 0) return DataLossError("cannot read '" + path + "': " + std::strerror(err));
    return SharedBytes(std::move(out));
  }
  return UnavailableError("cannot read '" + path + "'");  // not reached
}

StatusOr<ByteRange> SsdTier::GetRange(const std::string& key, uint64_t offset, uint64_t length) {
  if (!Mine(key)) return NotFoundError("no KV entry '" + key + "' of this model");
  const std::string path = PathOf(key);
  for (const bool direct : {true, false}) {
    StatusOr<OpenedFile> f = OpenThrough(env_, path, direct ? O_DIRECT : 0);
    if (!f.ok()) {
      if (direct && f.status().code() != StatusCode::kNotFound) continue;  // O_DIRECT refused
      return f.status();
    }
    Status in_range = CheckRange(static_cast<uint64_t>(f->size), offset, length);
    if (!in_range.ok() || length == 0) {
      env_->Close(f->fd);
      if (!in_range.ok()) return in_range;
      return ByteRange{};
    }
    // Direct reads start at a 4096-byte boundary: read from there, hand out the range.
    const uint64_t first = direct ? offset / Bytes::kAlign * Bytes::kAlign : offset;
    const size_t n = static_cast<size_t>(offset + length - first);
    std::unique_ptr<Bytes> out = Bytes::Allocate(n);
    char* buf = out->data();
    const int err = SplitRanges(n, [&](size_t off, size_t len) {
      // The file's bytes [first + off, first + off + len) into buf + off; the last
      // request rounded up to kAlign (the buffer's capacity covers it).
      const size_t stop = std::min<size_t>((off + len + Bytes::kAlign - 1) / Bytes::kAlign * Bytes::kAlign,
                                           out->capacity());
      return ChunkedIo(off, off + len, stop, [&](size_t pos, size_t want) {
        return env_->Pread(f->fd, buf + pos, want, static_cast<off_t>(first + pos));
      });
    });
    if (!direct) ::posix_fadvise(f->fd, static_cast<off_t>(first), static_cast<off_t>(n), POSIX_FADV_DONTNEED);
    env_->Close(f->fd);
    if (direct && err == EINVAL) continue;
    if (err != 0) return DataLossError("cannot read '" + path + "': " + std::strerror(err));
    const char* data = buf + (offset - first);
    return ByteRange{SharedBytes(std::move(out)), data, static_cast<size_t>(length)};
  }
  return UnavailableError("cannot read '" + path + "'");  // not reached
}

Status SsdTier::Erase(const std::string& key) {
  if (!Mine(key)) return InvalidArgumentError("'" + key + "' is not a KV entry key of this model");
  std::string path = PathOf(key);
  if (env_->Unlink(path) != 0 && errno != ENOENT) return ErrnoStatus("cannot remove", path, errno);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sizes_.find(key);
  if (it != sizes_.end()) {
    bytes_ -= it->second;
    sizes_.erase(it);
  }
  return OkStatus();
}

bool SsdTier::Contains(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sizes_.count(key) != 0;
}

int64_t SsdTier::SizeOf(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sizes_.find(key);
  return it == sizes_.end() ? -1 : static_cast<int64_t>(it->second);
}

std::vector<std::string> SsdTier::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> keys;
  for (const auto& [k, v] : sizes_) keys.push_back(k);
  return keys;
}

uint64_t SsdTier::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace attic::store
