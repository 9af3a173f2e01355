// File helpers: read-only memory maps (model weights are mapped, never copied when
// the compute dtype matches), whole-file reads and atomic writes.
//
// Thread-safety: a MappedFile is immutable after Open and may be shared freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "attic/core/status.h"

namespace attic {

class MappedFile {
 public:
  // Maps `path` read-only. NotFound if it does not exist; an empty file maps to size 0.
  static StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// "<what> '<path>': <strerror>" as a Status: NotFound for ENOENT, ResourceExhausted for
// ENOSPC, else Unavailable.
Status ErrnoStatus(const std::string& what, const std::string& path, int err);

// Opens `path` read-only (O_CLOEXEC | extra_flags) and stats it; the descriptor is the
// caller's to close. On failure nothing is left open (ErrnoStatus).
struct OpenedFile {
  int fd = -1;
  uint64_t size = 0;
  bool is_directory = false;
};
StatusOr<OpenedFile> OpenForReading(const std::string& path, int extra_flags = 0);

bool FileExists(const std::string& path);
bool IsDirectory(const std::string& path);
StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes to `path.tmp` then renames over `path`, so readers never see a partial file.
Status WriteFileAtomic(const std::string& path, std::string_view contents);
// Joins two path components with exactly one '/'.
std::string JoinPath(const std::string& a, const std::string& b);
Status MakeDirectories(const std::string& path);
// For an output a long job writes at its end (--json, --plot): creates the parent
// folders and checks, before the work starts, that `path` can be written (an existing
// file is left as it is until the write). Unavailable/NotFound naming the path if not.
Status PrepareOutputFile(const std::string& path);

}  // namespace attic
