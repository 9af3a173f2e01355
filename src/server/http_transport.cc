#include "server/http_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace attic::server {

namespace {

thread_local int tls_socket = -1;
thread_local bool tls_close = false;
thread_local std::chrono::steady_clock::time_point tls_start;

// poll() for `events`, retrying on EINTR. >0 ready, 0 timeout, <0 error.
int WaitFd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  while (true) {
    int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r > 0 && (p.revents & (POLLERR | POLLNVAL))) return -1;
    return r;
  }
}

// A socket whose peer has closed reads as EOF (or errors) without blocking.
bool SocketAlive(int fd) {
  char c;
  ssize_t r = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r > 0) return true;
  if (r == 0) return false;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

int Millis(time_t sec, time_t usec) { return static_cast<int>(sec * 1000 + usec / 1000); }

void Endpoint(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  int r = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
               : ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (r != 0) return;
  char buf[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

// One connection's byte stream, buffered for reads (httplib reads headers a byte at a
// time) and kept across keep-alive requests so pipelined bytes are never lost.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, int read_timeout_ms, int write_timeout_ms)
      : fd_(fd), read_ms_(read_timeout_ms), write_ms_(write_timeout_ms) {}

  bool has_buffered() const { return off_ < len_; }

  bool is_readable() const override { return has_buffered() || WaitFd(fd_, POLLIN, read_ms_) > 0; }
  bool is_writable() const override { return WaitFd(fd_, POLLOUT, write_ms_) > 0 && SocketAlive(fd_); }

  ssize_t read(char* ptr, size_t size) override {
    if (!has_buffered()) {
      if (WaitFd(fd_, POLLIN, read_ms_) <= 0) return -1;
      if (size >= sizeof(buf_)) return Recv(ptr, size);
      ssize_t n = Recv(buf_, sizeof(buf_));
      if (n <= 0) return n;
      off_ = 0;
      len_ = static_cast<size_t>(n);
    }
    size_t n = std::min(size, len_ - off_);
    std::memcpy(ptr, buf_ + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (WaitFd(fd_, POLLOUT, write_ms_) <= 0) return -1;
    while (true) {
      ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { Endpoint(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { Endpoint(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  ssize_t Recv(char* ptr, size_t size) {
    while (true) {
      ssize_t n = ::recv(fd_, ptr, size, 0);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }

  int fd_;
  int read_ms_, write_ms_;
  char buf_[4096];
  size_t off_ = 0, len_ = 0;
};

}  // namespace

bool HttpTransport::ClientConnected() { return tls_socket < 0 || SocketAlive(tls_socket); }

void HttpTransport::CloseAfterResponse() { tls_close = true; }

std::chrono::steady_clock::time_point HttpTransport::RequestStart() { return tls_start; }

void HttpTransport::SetListenBacklog(int backlog) {
  socket_t s = svr_sock_;
  if (s != INVALID_SOCKET) ::listen(s, backlog);  // Linux: re-listening updates the backlog
}

bool HttpTransport::process_and_close_socket(socket_t sock) {
  tls_socket = sock;
  int one = 1;  // SSE sends one small write per token: never let Nagle hold them back
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ConnectionStream strm(sock, Millis(read_timeout_sec_, read_timeout_usec_),
                        Millis(write_timeout_sec_, write_timeout_usec_));
  bool ret = false;
  for (size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
    if (!strm.has_buffered()) {
      // Keep-alive: wait for the next request in short slices, so that stopping the
      // server does not wait out an idle client.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
      int ready = 0;
      while (ready == 0 && svr_sock_ != INVALID_SOCKET && std::chrono::steady_clock::now() < deadline) {
        ready = WaitFd(sock, POLLIN, 100);
      }
      if (ready <= 0) break;
    }
    bool connection_closed = false;
    tls_close = false;
    tls_start = std::chrono::steady_clock::now();
    ret = process_request(strm, left == 1, connection_closed, nullptr);
    if (!ret || connection_closed || tls_close) break;
  }
  tls_socket = -1;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace attic::server
