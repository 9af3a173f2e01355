#include "bench/sessions/nginx_front.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "bench/sessions/server_process.h"

namespace attic::bench::sessions {

namespace {

// A loopback port nothing listens on now (0 if none could be had).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t n = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// Runs `args` (args[0] a path) with NGINX_AFFINITY_DIR=`state_dir`, output appended to
// `log_path`; returns its exit status (-1 if it could not run).
int RunScript(std::vector<std::string> args, const std::string& state_dir, const std::string& log_path) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    setenv("NGINX_AFFINITY_DIR", state_dir.c_str(), 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
}

}  // namespace

Status NginxFront::Start(const std::string& script, const std::vector<std::string>& upstream_urls,
                         const std::string& routing, const std::string& state_dir, const std::string& log_path) {
  Stop();
  std::string ups;
  for (const auto& u : upstream_urls) {
    const size_t scheme = u.find("://");
    ups += (ups.empty() ? "" : ",") + (scheme == std::string::npos ? u : u.substr(scheme + 3));
  }
  script_ = script;
  state_dir_ = state_dir;
  log_path_ = log_path;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int port = FreePort();
    if (port == 0) continue;
    port_ = port;  // set first: an interrupt during the start stops what it started
    cleanup_id_ = AddSignalCleanup([script, state_dir, log_path, port] {
      RunScript({script, "stop", std::to_string(port)}, state_dir, log_path);
    });
    if (RunScript({script, "start", std::to_string(port), ups, "--routing", routing}, state_dir, log_path) == 0) {
      url_ = "http://127.0.0.1:" + std::to_string(port);
      return OkStatus();
    }
    Stop();  // the script stopped anything it started; this drops the signal cleanup
  }
  return UnavailableError("nginx did not start (" + script + "):\n" + Tail(log_path));
}

void NginxFront::Stop() {
  if (port_ == 0) return;
  RunScript({script_, "stop", std::to_string(port_)}, state_dir_, log_path_);
  RemoveSignalCleanup(cleanup_id_);
  cleanup_id_ = -1;
  port_ = 0;
  url_.clear();
}

}  // namespace attic::bench::sessions
