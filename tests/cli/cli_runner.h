// Running the real `attic` binary from tests: to completion (RunAttic), or as a child
// process the test talks to through pipes and signals (Child).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace attic::testing {

// The binary under test: $ATTIC_BINARY (e.g. an older build, to see a test fail before
// its fix), else the one this build made.
inline const char* AtticBinary() {
  const char* env = std::getenv("ATTIC_BINARY");
  return env != nullptr && *env != '\0' ? env : ATTIC_BINARY;
}

struct Result {
  int exit_code = -1;
  bool signaled = false;
  std::string out;  // stdout + stderr
};

// Runs `attic ARGS 2>&1` through /bin/sh (ARGS may hold redirections), killed after 60 s.
inline Result RunAttic(const std::string& args) {
  std::string cmd = std::string("timeout 60 ") + AtticBinary() + " " + args + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  if (WIFEXITED(st)) r.exit_code = WEXITSTATUS(st);
  r.signaled = WIFSIGNALED(st) || r.exit_code >= 124;
  return r;
}

// `attic ARGS` as a child with its stdin, stdout and stderr on pipes.
class Child {
 public:
  explicit Child(const std::vector<std::string>& args) {
    int in[2], out[2], err[2];
    if (pipe(in) != 0 || pipe(out) != 0 || pipe(err) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) close(fd);
      std::vector<char*> argv{const_cast<char*>(AtticBinary())};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(AtticBinary(), argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    in_ = in[1];
    out_ = out[0];
    err_ = err[0];
    fcntl(out_, F_SETFL, O_NONBLOCK);
    fcntl(err_, F_SETFL, O_NONBLOCK);
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    for (int fd : {in_, out_, err_})
      if (fd >= 0) close(fd);
  }
  void Write(const std::string& text) {
    if (in_ >= 0) (void)!write(in_, text.data(), text.size());
  }
  void CloseStdin() {
    close(in_);
    in_ = -1;
  }
  void Signal(int sig) { kill(pid_, sig); }
  // Reads until stdout (or stderr) has grown to hold `needle` after position `from`;
  // false after `timeout_s`.
  bool WaitFor(bool on_stderr, const std::string& needle, size_t from, double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    const std::string& buf = on_stderr ? err_text_ : out_text_;
    while (buf.find(needle, from) == std::string::npos) {
      if (std::chrono::steady_clock::now() > end) return false;
      Pump(50);
    }
    return true;
  }
  // Waits for the exit; the exit code, or -1 after `timeout_s` or on a signal.
  int Wait(double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      Pump(20);
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        reaped_ = true;
        Pump(0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
    }
    return -1;
  }
  bool Alive() { return !reaped_ && waitpid(pid_, nullptr, WNOHANG) == 0; }
  const std::string& out() const { return out_text_; }
  const std::string& err() const { return err_text_; }

 private:
  void Pump(int timeout_ms) {
    pollfd fds[2] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
    poll(fds, 2, timeout_ms);
    char buf[4096];
    for (auto [fd, text] : {std::pair{out_, &out_text_}, std::pair{err_, &err_text_}}) {
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) text->append(buf, static_cast<size_t>(n));
    }
  }
  pid_t pid_ = -1;
  bool reaped_ = false;
  int in_ = -1, out_ = -1, err_ = -1;
  std::string out_text_, err_text_;
};

}  // namespace attic::testing
