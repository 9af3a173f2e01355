#include "store/redis/connection.h"

#include "store/redis/resp_reader.h"

#include <hiredis/read.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace attic::store::redis {

namespace {
timeval ToTimeval(std::chrono::milliseconds ms) {
  if (ms.count() < 1) ms = std::chrono::milliseconds(1);  // 0 would mean "no timeout"
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

void FreeReply(const redisReply* r) { freeReplyObject(const_cast<redisReply*>(r)); }

// hiredis's own reply functions (its defaultFunctions, not exported), taken from the
// first reader seen; the bounded ones delegate to them.
const redisReplyObjectFunctions* g_hiredis_functions = nullptr;

void* BoundedCreateArray(const redisReadTask* task, int elements) {
  if (elements < 0 || elements > kMaxReplyElements) return nullptr;  // hiredis: "Out of memory"
  return g_hiredis_functions->createArray(task, elements);
}

redisReplyObjectFunctions* BoundedFunctions(const redisReplyObjectFunctions* hiredis) {
  static redisReplyObjectFunctions bounded = [hiredis] {
    g_hiredis_functions = hiredis;
    redisReplyObjectFunctions f = *hiredis;
    f.createArray = BoundedCreateArray;
    return f;
  }();
  return &bounded;
}

}  // namespace

void LimitReplyElements(redisReader* reader) {
  if (reader->fn == nullptr) return;  // a reader that builds no replies
  redisReplyObjectFunctions* bounded = BoundedFunctions(reader->fn);
  if (reader->fn == g_hiredis_functions) reader->fn = bounded;
}

std::string_view ReplyText(const redisReply& r) {
  if (r.type == REDIS_REPLY_STRING || r.type == REDIS_REPLY_STATUS || r.type == REDIS_REPLY_ERROR)
    return std::string_view(r.str, r.len);
  return {};
}

bool IsErrorReply(const redisReply& r, std::string_view word) {
  if (r.type != REDIS_REPLY_ERROR) return false;
  const std::string_view text = ReplyText(r);
  return text.size() >= word.size() && text.substr(0, word.size()) == word &&
         (text.size() == word.size() || text[word.size()] == ' ');
}

Status ParseAddress(std::string_view address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size())
    return InvalidArgumentError("'" + std::string(address) + "' is not host:port");
  std::string_view h = address.substr(0, colon);
  if (h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  const std::string_view p = address.substr(colon + 1);
  int value = 0;
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), value);
  if (ec != std::errc() || end != p.data() + p.size() || value < 1 || value > 65535)
    return InvalidArgumentError("'" + std::string(address) + "': port must be 1..65535");
  *host = std::string(h);
  *port = value;
  return OkStatus();
}

StatusOr<std::unique_ptr<Connection>> Connection::Open(const std::string& host, int port,
                                                       std::chrono::milliseconds connect_timeout,
                                                       std::chrono::milliseconds io_timeout) {
  const std::string address = host + ":" + std::to_string(port);
  redisContext* c = redisConnectWithTimeout(host.c_str(), port, ToTimeval(connect_timeout));
  if (c == nullptr) return UnavailableError("redis " + address + ": cannot allocate a connection");
  if (c->err != 0) {
    const bool timed_out = c->err == REDIS_ERR_IO && (errno == ETIMEDOUT || errno == EINPROGRESS || errno == EAGAIN);
    std::string why = c->errstr;
    redisFree(c);
    const std::string msg = "redis " + address + ": cannot connect: " + why;
    return timed_out ? Status(StatusCode::kDeadlineExceeded, msg) : UnavailableError(msg);
  }
  LimitReplyElements(c->reader);
  std::unique_ptr<Connection> conn(new Connection(c, address));
  ATTIC_RETURN_IF_ERROR(conn->SetTimeout(io_timeout));
  return conn;
}

Connection::~Connection() { redisFree(c_); }

Status Connection::SetTimeout(std::chrono::milliseconds timeout) {
  if (redisSetTimeout(c_, ToTimeval(timeout)) != REDIS_OK) return Fail("cannot set the timeout");
  return OkStatus();
}

Status Connection::Fail(const char* what) {
  broken_ = true;
  // hiredis reports a receive timeout as an I/O error with errno EAGAIN/EWOULDBLOCK.
  const std::string_view err = c_->errstr;
  const bool timed_out = c_->err == REDIS_ERR_IO &&
                         (errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT ||
                          err.find("temporarily unavailable") != std::string_view::npos || err.find("timed out") != std::string_view::npos);
  const std::string msg = "redis " + address_ + ": " + what + ": " + (c_->err != 0 ? c_->errstr : "connection lost");
  return timed_out ? Status(StatusCode::kDeadlineExceeded, msg + " (timed out)") : UnavailableError(msg);
}

StatusOr<std::vector<Reply>> Connection::Pipeline(const std::vector<Command>& commands, const BulkSink* sink) {
  if (broken_) return UnavailableError("redis " + address_ + ": connection broken");
  std::vector<const char*> argv;
  std::vector<size_t> argl;
  for (const Command& cmd : commands) {
    argv.clear();
    argl.clear();
    for (std::string_view a : cmd) {
      argv.push_back(a.data());
      argl.push_back(a.size());
    }
    if (redisAppendCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), argl.data()) != REDIS_OK)
      return Fail("cannot send");
  }
  std::vector<Reply> replies;
  replies.reserve(commands.size());
  const size_t by_hiredis = sink != nullptr && !commands.empty() ? commands.size() - 1 : commands.size();
  for (size_t i = 0; i < by_hiredis; ++i) {
    void* r = nullptr;
    if (redisGetReply(c_, &r) != REDIS_OK || r == nullptr) {
      if (r != nullptr) freeReplyObject(r);
      return Fail("no reply");
    }
    replies.emplace_back(static_cast<const redisReply*>(r), FreeReply);
  }
  if (by_hiredis < commands.size()) {
    if (by_hiredis == 0) {  // nothing read yet: the commands are still in hiredis's output buffer
      int done = 0;
      do {
        if (redisBufferWrite(c_, &done) != REDIS_OK) return Fail("cannot send");
      } while (!done);
    }
    ATTIC_ASSIGN_OR_RETURN(Reply last, ReadSunkReply(*sink));
    replies.push_back(std::move(last));
  }
  return replies;
}

StatusOr<Reply> Connection::ReadSunkReply(const BulkSink& sink) {
  // The bytes hiredis's reader has buffered already come first; then the socket
  // (blocking, with the connection's receive timeout).
  RespSource source;
  redisReader* reader = c_->reader;
  if (reader->buf != nullptr && reader->pos < reader->len)
    source.buffered.assign(reader->buf + reader->pos, reader->buf + reader->len);
  reader->pos = reader->len;  // taken: hiredis's reader has nothing left to parse
  const int fd = c_->fd;
  source.recv = [fd](char* dst, size_t n) -> StatusOr<size_t> {
    const ssize_t got = ::recv(fd, dst, n, 0);
    if (got > 0) return static_cast<size_t>(got);
    if (got == 0) return UnavailableError("connection closed by the server");
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status(StatusCode::kDeadlineExceeded, "no reply (timed out)");
    return UnavailableError(std::string("receive failed: ") + std::strerror(errno));
  };
  StatusOr<Reply> reply = redis::ReadSunkReply(source, sink);
  if (!reply.ok()) {
    broken_ = true;
    return Status(reply.status().code(), "redis " + address_ + ": " + reply.status().message());
  }
  return reply;
}

StatusOr<Reply> Connection::Run(const Command& command) {
  ATTIC_ASSIGN_OR_RETURN(std::vector<Reply> r, Pipeline({command}));
  return std::move(r[0]);
}

}  // namespace attic::store::redis
