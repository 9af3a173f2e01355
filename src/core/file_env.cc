#include "attic/core/file_env.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cerrno>
#include <cstdio>

namespace attic {

namespace {

class PosixFileEnv final : public FileEnv {
 public:
  int Open(const std::string& path, int flags, mode_t mode) override { return ::open(path.c_str(), flags, mode); }
  ssize_t Pwrite(int fd, const void* buf, size_t n, off_t offset) override { return ::pwrite(fd, buf, n, offset); }
  ssize_t Pread(int fd, void* buf, size_t n, off_t offset) override { return ::pread(fd, buf, n, offset); }
  int Fsync(int fd) override { return ::fsync(fd); }
  int Close(int fd) override { return ::close(fd); }
  int Rename(const std::string& from, const std::string& to) override {
    return ::rename(from.c_str(), to.c_str());
  }
  int Unlink(const std::string& path) override { return ::unlink(path.c_str()); }
};

}  // namespace

FileEnv* FileEnv::Default() {
  static PosixFileEnv env;
  return &env;
}

void FaultInjectingFileEnv::Arm(const FileFaults& faults) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_ = faults;
  writes_ = fsyncs_ = renames_ = reads_ = calls_ = 0;
  injected_ = 0;
}

void FaultInjectingFileEnv::MaybeDie(bool* die) {
  bool now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    now = ++calls_ == faults_.kill_at_call;
  }
  if (die != nullptr) {
    *die = now;  // the caller does half of its work first
    return;
  }
  if (now) ::kill(::getpid(), SIGKILL);
}

int FaultInjectingFileEnv::Open(const std::string& path, int flags, mode_t mode) {
  MaybeDie(nullptr);
  return base_->Open(path, flags, mode);
}

ssize_t FaultInjectingFileEnv::Pwrite(int fd, const void* buf, size_t n, off_t offset) {
  bool die = false;
  MaybeDie(&die);
  if (die) {
    base_->Pwrite(fd, buf, n / 2, offset);
    ::kill(::getpid(), SIGKILL);
  }
  int err = 0;
  bool shorten = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int call = ++writes_;
    if (faults_.fail_all_writes || call == faults_.fail_write_at) err = faults_.write_errno;
    shorten = call == faults_.short_write_at && n > 1;
  }
  if (err != 0) {
    ++injected_;
    errno = err;
    return -1;
  }
  if (shorten) {
    ++injected_;
    return base_->Pwrite(fd, buf, n / 2, offset);
  }
  return base_->Pwrite(fd, buf, n, offset);
}

ssize_t FaultInjectingFileEnv::Pread(int fd, void* buf, size_t n, off_t offset) {
  MaybeDie(nullptr);
  const ssize_t got = base_->Pread(fd, buf, n, offset);
  if (got <= 0) return got;
  bool flip = false;
  size_t at = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    flip = ++reads_ == faults_.flip_read_at;
    at = faults_.flip_byte % static_cast<size_t>(got);
  }
  if (flip) {
    ++injected_;
    static_cast<unsigned char*>(buf)[at] ^= 0x10;
  }
  return got;
}

int FaultInjectingFileEnv::Fsync(int fd) {
  MaybeDie(nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (++fsyncs_ != faults_.fail_fsync_at) return base_->Fsync(fd);
  }
  ++injected_;
  errno = EIO;
  return -1;
}

int FaultInjectingFileEnv::Close(int fd) {
  MaybeDie(nullptr);
  return base_->Close(fd);
}

int FaultInjectingFileEnv::Rename(const std::string& from, const std::string& to) {
  MaybeDie(nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (++renames_ != faults_.fail_rename_at) return base_->Rename(from, to);
  }
  ++injected_;
  errno = EIO;
  return -1;
}

int FaultInjectingFileEnv::Unlink(const std::string& path) {
  MaybeDie(nullptr);
  return base_->Unlink(path);
}

}  // namespace attic
