// The file operations of the SSD tier behind an interface (leveldb's Env idea), so
// that tests inject I/O faults through the same layer the product uses:
// FileEnv::Default() is POSIX; FaultInjectingFileEnv fails, shortens or corrupts chosen
// operations.
//
// The calls mirror the POSIX ones they stand for (same arguments, same results: -1 and
// errno on failure), so the code above them keeps its own error handling.
//
// Thread-safety: both implementations may be called from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace attic {

class FileEnv {
 public:
  virtual ~FileEnv() = default;
  virtual int Open(const std::string& path, int flags, mode_t mode = 0) = 0;
  virtual ssize_t Pwrite(int fd, const void* buf, size_t n, off_t offset) = 0;
  virtual ssize_t Pread(int fd, void* buf, size_t n, off_t offset) = 0;
  virtual int Fsync(int fd) = 0;
  virtual int Close(int fd) = 0;
  virtual int Rename(const std::string& from, const std::string& to) = 0;
  virtual int Unlink(const std::string& path) = 0;

  // The process-wide POSIX implementation.
  static FileEnv* Default();
};

// What FaultInjectingFileEnv does to the operations it sees. Counts are of calls made
// through it since the last Arm(); a count of 0 never fires.
struct FileFaults {
  int fail_write_at = 0;        // the n-th Pwrite fails with `write_errno`
  int write_errno = 5;          // EIO; ENOSPC (28) for a full disk
  bool fail_all_writes = false; // every Pwrite from the first fails (a full disk)
  int short_write_at = 0;       // the n-th Pwrite writes only half of what it was given (>= 1 byte)
  int fail_fsync_at = 0;        // the n-th Fsync fails with EIO
  int fail_rename_at = 0;       // the n-th Rename fails with EIO
  int flip_read_at = 0;         // the n-th Pread that returns bytes has one bit flipped...
  size_t flip_byte = 0;         // ...at this index of what it returned (modulo its length)
  // The n-th call of any kind kills the process (SIGKILL, as kill -9 would) before it
  // returns: a Pwrite first writes half of its bytes, so the kill lands mid-write; any
  // other call dies before doing anything.
  int kill_at_call = 0;
};

class FaultInjectingFileEnv final : public FileEnv {
 public:
  explicit FaultInjectingFileEnv(FileEnv* base = FileEnv::Default()) : base_(base) {}
  // Replaces the faults and restarts the counts.
  void Arm(const FileFaults& faults);
  int Open(const std::string& path, int flags, mode_t mode = 0) override;
  ssize_t Pwrite(int fd, const void* buf, size_t n, off_t offset) override;
  ssize_t Pread(int fd, void* buf, size_t n, off_t offset) override;
  int Fsync(int fd) override;
  int Close(int fd) override;
  int Rename(const std::string& from, const std::string& to) override;
  int Unlink(const std::string& path) override;

  // Faults injected since the last Arm() (all kinds).
  int injected() const { return injected_.load(); }

 private:
  FileEnv* base_;
  std::mutex mu_;
  FileFaults faults_;
  // Counts a call; dies here if it is the one FileFaults::kill_at_call names.
  void MaybeDie(bool* die);
  int writes_ = 0, fsyncs_ = 0, renames_ = 0, reads_ = 0, calls_ = 0;
  std::atomic<int> injected_{0};
};

}  // namespace attic
