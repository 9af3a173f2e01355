#include "attic/core/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace attic {

Status ErrnoStatus(const std::string& what, const std::string& path, int err) {
  std::string msg = what + " '" + path + "': " + std::strerror(err);
  if (err == ENOENT) return NotFoundError(msg);
  if (err == ENOSPC) return ResourceExhaustedError(msg);
  return UnavailableError(msg);
}

StatusOr<OpenedFile> OpenForReading(const std::string& path, int extra_flags) {
  OpenedFile f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | extra_flags);
  if (f.fd < 0) return ErrnoStatus("cannot open", path, errno);
  struct stat st;
  if (::fstat(f.fd, &st) != 0) {
    int err = errno;
    ::close(f.fd);
    return ErrnoStatus("cannot stat", path, err);
  }
  f.size = static_cast<uint64_t>(st.st_size);
  f.is_directory = S_ISDIR(st.st_mode);
  return f;
}

StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  ATTIC_ASSIGN_OR_RETURN(OpenedFile opened, OpenForReading(path));
  const int fd = opened.fd;
  if (opened.is_directory) {
    ::close(fd);
    return InvalidArgumentError("'" + path + "' is a directory, expected a file");
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(opened.size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus("cannot mmap", path, err);
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

StatusOr<std::string> ReadFileToString(const std::string& path) {
  ATTIC_ASSIGN_OR_RETURN(auto f, MappedFile::Open(path));
  return std::string(reinterpret_cast<const char*>(f->data()), f->size());
}

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", tmp, errno);
  size_t off = 0;
  while (off < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + off, contents.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoStatus("cannot write", tmp, err);
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus("cannot flush", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus("cannot rename to", path, err);
  }
  return OkStatus();
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

Status MakeDirectories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return UnavailableError("cannot create directory '" + path + "': " + ec.message());
  return OkStatus();
}

Status PrepareOutputFile(const std::string& path) {
  if (path.empty()) return InvalidArgumentError("empty output path");
  if (IsDirectory(path)) return InvalidArgumentError("cannot write '" + path + "': it is a directory");
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  ATTIC_RETURN_IF_ERROR(MakeDirectories(dir));
  if (FileExists(path)) {
    if (::access(path.c_str(), W_OK) != 0) return ErrnoStatus("cannot write", path, errno);
  } else if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return ErrnoStatus("cannot write '" + path + "' in", dir, errno);
  }
  return OkStatus();
}

}  // namespace attic
