// The servers `attic bench sessions` starts: an `attic serve` child process (this same
// executable, /proc/self/exe) on a free port, its output in a log file, stopped with
// SIGTERM (then SIGKILL) when the benchmark is done with it, and never outliving the
// benchmark (PR_SET_PDEATHSIG). StopServersOnSignal makes Ctrl-C / SIGTERM stop the
// running children and remove the benchmark's temporary directory (SSD tier files)
// before the process exits.
// Thread-safety: a ServerProcess is used by one thread; CpuSeconds() may be called from
// any thread while it runs. The signal handling is process-wide.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "attic/core/status.h"

namespace attic::bench::sessions {

// Installs SIGINT / SIGTERM handling for the rest of the process: the handler only
// writes to a pipe; a thread then prints "attic: interrupted, stopping the servers",
// stops every running ServerProcess, removes `tmp_dir` (if not empty) and exits with
// 128 + the signal number. Call once, before starting servers.
void StopServersOnSignal(const std::string& tmp_dir);

// Something else to stop on such a signal (a daemon the benchmark started, e.g. its
// nginx): `fn` runs on the signal thread before the servers are stopped. Returns an id
// for RemoveSignalCleanup; call that before `fn`'s captures go away.
int AddSignalCleanup(std::function<void()> fn);
void RemoveSignalCleanup(int id);

class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { Stop(); }

  // Runs `<this executable> serve <args...>` with stdout and stderr to `log_path`, and
  // waits (up to 300 s) for its "listening on http://HOST:PORT" line. `label` names it
  // in errors. Unavailable if it exits during start-up, DeadlineExceeded if it does not
  // listen in time (both with the log's tail).
  Status Start(const std::string& label, std::vector<std::string> args, const std::string& log_path);

  // SIGTERM, then SIGKILL after 10 s. Does nothing when not running.
  void Stop();

  // User + system CPU seconds of the server so far (-1 if unknown or not running).
  double CpuSeconds() const;

  // The last 2,000 bytes of the log.
  std::string LogTail() const;

  // "http://HOST:PORT" once started.
  const std::string& url() const { return url_; }

  // The child's process id while it runs (-1 otherwise): its /proc entry is what a
  // benchmark samples for memory.
  pid_t pid() const { return pid_; }

 private:
  std::string label_, log_path_, url_;
  pid_t pid_ = -1;
  int slot_ = -1;  // in the signal handler's table of children
};

}  // namespace attic::bench::sessions
