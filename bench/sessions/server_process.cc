#include "bench/sessions/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace attic::bench::sessions {

namespace {

using Clock = std::chrono::steady_clock;

// What the signal thread stops: the pids of the running children (-1 = free slot).
constexpr int kMaxChildren = 4;
std::atomic<pid_t> g_children[kMaxChildren] = {-1, -1, -1, -1};
int g_pipe[2] = {-1, -1};
std::mutex g_mu;
std::string g_tmp_dir;  // guarded by g_mu
std::map<int, std::function<void()>> g_cleanups;  // guarded by g_mu
int g_next_cleanup = 0;                           // guarded by g_mu

int ClaimSlot(pid_t pid) {
  for (int i = 0; i < kMaxChildren; ++i) {
    pid_t free = -1;
    if (g_children[i].compare_exchange_strong(free, pid)) return i;
  }
  return -1;  // not stopped on a signal, but still by PR_SET_PDEATHSIG
}

void ReleaseSlot(int slot) {
  if (slot >= 0) g_children[slot].store(-1);
}

}  // namespace

void StopServersOnSignal(const std::string& tmp_dir) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_tmp_dir = tmp_dir;
  }
  if (pipe(g_pipe) != 0) return;
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    unsigned char b = static_cast<unsigned char>(sig);
    ssize_t ignored = write(g_pipe[1], &b, 1);
    (void)ignored;
  };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::thread([] {
    unsigned char sig = 0;
    while (read(g_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    std::fprintf(stderr, "attic: interrupted, stopping the servers\n");
    std::map<int, std::function<void()>> cleanups;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      cleanups = g_cleanups;
    }
    for (auto& [id, fn] : cleanups) fn();
    for (auto& c : g_children) {
      pid_t pid = c.load();
      if (pid > 0) kill(pid, SIGTERM);
    }
    for (auto& c : g_children) {
      pid_t pid = c.load();
      if (pid > 0) waitpid(pid, nullptr, 0);
    }
    std::lock_guard<std::mutex> lock(g_mu);
    std::error_code ec;
    if (!g_tmp_dir.empty()) std::filesystem::remove_all(g_tmp_dir, ec);
    std::_Exit(128 + sig);
  }).detach();
}

int AddSignalCleanup(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cleanups[g_next_cleanup] = std::move(fn);
  return g_next_cleanup++;
}

void RemoveSignalCleanup(int id) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cleanups.erase(id);
}

Status ServerProcess::Start(const std::string& label, std::vector<std::string> args, const std::string& log_path) {
  label_ = label;
  log_path_ = log_path;
  std::vector<char*> argv;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  args.insert(args.begin(), {self, "serve"});
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) return InternalError("fork failed");
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the benchmark
    if (getppid() != parent) _exit(1);
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  slot_ = ClaimSlot(pid_);
  // Wait for "listening on http://HOST:PORT" in the log.
  const auto deadline = Clock::now() + std::chrono::seconds(300);
  while (Clock::now() < deadline) {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      ReleaseSlot(slot_);
      slot_ = -1;
      pid_ = -1;
      return UnavailableError(label + " server exited during start-up:\n" + LogTail());
    }
    std::ifstream in(log_path);
    std::string line;
    while (std::getline(in, line)) {
      size_t at = line.find("listening on http://");
      if (at == std::string::npos) continue;
      url_ = line.substr(at + 13);
      while (!url_.empty() && (url_.back() == '\r' || url_.back() == ' ')) url_.pop_back();
      return OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status(StatusCode::kDeadlineExceeded, label + " server did not start within 300 s:\n" + LogTail());
}

void ServerProcess::Stop() {
  if (pid_ <= 0) return;
  ReleaseSlot(slot_);
  slot_ = -1;
  kill(pid_, SIGTERM);
  int st = 0;
  for (int i = 0; i < 200; ++i) {  // 10 s
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &st, 0);
  pid_ = -1;
}

double ServerProcess::CpuSeconds() const {
  if (pid_ <= 0) return -1;
  std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t p = s.rfind(')');
  if (p == std::string::npos) return -1;
  std::istringstream fields(s.substr(p + 1));
  std::string tok;
  std::vector<std::string> v;
  while (fields >> tok) v.push_back(tok);
  if (v.size() < 13) return -1;  // v[0] is field 3 (state); utime = field 14, stime = 15
  return (std::stod(v[11]) + std::stod(v[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string ServerProcess::LogTail() const {
  std::ifstream in(log_path_);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
}

}  // namespace attic::bench::sessions
