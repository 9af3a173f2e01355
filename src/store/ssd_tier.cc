#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "attic/core/file.h"
#include "attic/store/tier.h"

namespace attic::store {

namespace {

constexpr char kSuffix[] = ".kv";
constexpr char kTmpSuffix[] = ".tmp";
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

int WriteRange(int fd, const char* buf, size_t off, size_t n) {
  return ChunkedIo(off, off + n, off + n, [&](size_t pos, size_t len) {
    return ::pwrite(fd, buf + pos, len, static_cast<off_t>(pos));
  });
}

// Reads the file's bytes [off, off + n) into buf + off. Offsets are kChunk-aligned and
// the file's tail is requested rounded up to Bytes::kAlign (the buffer's capacity covers
// it; the read stops at the end of the file), as O_DIRECT needs.
int ReadRange(int fd, char* buf, size_t off, size_t n) {
  const size_t stop = (off + n + Bytes::kAlign - 1) / Bytes::kAlign * Bytes::kAlign;
  return ChunkedIo(off, off + n, stop, [&](size_t pos, size_t len) {
    return ::pread(fd, buf + pos, len, static_cast<off_t>(pos));
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

void FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

StatusOr<std::unique_ptr<SsdTier>> SsdTier::Open(const std::string& dir, uint64_t capacity) {
  ATTIC_RETURN_IF_ERROR(MakeDirectories(dir));
  std::unique_ptr<SsdTier> tier(new SsdTier(dir, capacity));
  std::error_code ec;
  for (const auto& de : std::filesystem::directory_iterator(dir, ec)) {
    if (!de.is_regular_file(ec)) continue;
    std::string name = de.path().filename().string();
    if (EndsWith(name, kTmpSuffix)) {  // an interrupted write: never visible, now gone
      std::filesystem::remove(de.path(), ec);
      ++tier->removed_temp_;
      continue;
    }
    if (!EndsWith(name, kSuffix)) continue;
    uint64_t size = de.file_size(ec);
    if (ec) continue;
    std::string key = name.substr(0, name.size() - std::strlen(kSuffix));
    tier->sizes_[key] = size;
    tier->bytes_ += size;
  }
  if (ec) return UnavailableError("cannot list KV directory '" + dir + "': " + ec.message());
  return tier;
}

std::string SsdTier::PathOf(const std::string& key) const { return JoinPath(dir_, key + kSuffix); }

Status SsdTier::Put(const std::string& key, std::string_view bytes) {
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
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return finish(ErrnoStatus("cannot create", tmp, errno));
  int err = SplitRanges(bytes.size(), [&](size_t off, size_t n) { return WriteRange(fd, bytes.data(), off, n); });
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (err == 0) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // written back: drop the cached pages
  ::close(fd);
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return finish(ErrnoStatus("cannot write", path, err));
  }
  FsyncDir(dir_);
  return finish(OkStatus());
}

StatusOr<std::string> SsdTier::Get(const std::string& key) {
  ATTIC_ASSIGN_OR_RETURN(SharedBytes bytes, GetShared(key));
  return std::string(bytes->view());
}

StatusOr<SharedBytes> SsdTier::GetShared(const std::string& key) {
  const std::string path = PathOf(key);
  // O_DIRECT straight into the aligned buffer where the file system allows it; else
  // (tmpfs, or a refused read) through the page cache.
  for (const bool direct : {true, false}) {
    StatusOr<OpenedFile> f = OpenForReading(path, direct ? O_DIRECT : 0);
    if (!f.ok()) {
      if (direct && f.status().code() != StatusCode::kNotFound) continue;  // O_DIRECT refused
      return f.status();
    }
    const size_t size = static_cast<size_t>(f->size);
    std::unique_ptr<Bytes> out = Bytes::Allocate(size);
    if (!direct) ::posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    const int err = SplitRanges(size, [&](size_t off, size_t n) { return ReadRange(f->fd, out->data(), off, n); });
    if (!direct) ::posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(f->fd);
    if (direct && err == EINVAL) continue;
    if (err != 0) return DataLossError("cannot read '" + path + "': " + std::strerror(err));
    return SharedBytes(std::move(out));
  }
  return UnavailableError("cannot read '" + path + "'");  // not reached
}

Status SsdTier::Erase(const std::string& key) {
  std::string path = PathOf(key);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus("cannot remove", path, errno);
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
