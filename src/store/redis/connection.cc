#include "store/redis/connection.h"

#include <hiredis/read.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>

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

// A reply read by Connection::ReadSunkReply: hiredis's struct, built here; strings are
// owned here or (sunk bulk strings) by the caller.
struct BuiltReply {
  redisReply top{};
  std::vector<redisReply> elements;
  std::vector<redisReply*> pointers;
  std::deque<std::string> strings;  // stable addresses
};

// The bytes of one reply: what hiredis's reader had buffered already, then the socket
// (blocking, with the connection's receive timeout). Payloads the caller places are
// received straight into its buffer.
class RespInput {
 public:
  explicit RespInput(redisContext* c) : c_(c) {
    redisReader* r = c->reader;
    if (r->buf != nullptr && r->pos < r->len) buf_.assign(r->buf + r->pos, r->buf + r->len);
    r->pos = r->len;  // taken: hiredis's reader has nothing left to parse
  }
  // The next line, without its CRLF.
  StatusOr<std::string> Line() {
    for (;;) {
      const size_t at = buf_.find("\r\n", pos_);
      if (at != std::string::npos) {
        std::string line = buf_.substr(pos_, at - pos_);
        pos_ = at + 2;
        return line;
      }
      if (buf_.size() - pos_ > 64 * 1024) return DataLossError("a RESP line longer than 64 KB");
      ATTIC_RETURN_IF_ERROR(More());
    }
  }
  // Exactly n bytes into dst (null: dropped).
  Status Exact(char* dst, size_t n) {
    const size_t have = std::min(n, buf_.size() - pos_);
    if (dst != nullptr) std::memcpy(dst, buf_.data() + pos_, have);
    pos_ += have;
    for (size_t done = have; done < n;) {
      if (dst == nullptr) {  // not expected (every payload has a place); read and drop
        ATTIC_RETURN_IF_ERROR(More());
        const size_t take = std::min(n - done, buf_.size() - pos_);
        pos_ += take;
        done += take;
        continue;
      }
      const ssize_t got = ::recv(c_->fd, dst + done, n - done, 0);
      if (got <= 0) return ReadError(got);
      done += static_cast<size_t>(got);
    }
    return OkStatus();
  }
  // Whether every byte read belonged to the reply.
  bool drained() const { return pos_ == buf_.size(); }

 private:
  Status More() {
    if (pos_ > 0 && pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    }
    char chunk[16 * 1024];
    const ssize_t got = ::recv(c_->fd, chunk, sizeof chunk, 0);
    if (got <= 0) return ReadError(got);
    buf_.append(chunk, static_cast<size_t>(got));
    return OkStatus();
  }
  static Status ReadError(ssize_t got) {
    if (got == 0) return UnavailableError("connection closed by the server");
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status(StatusCode::kDeadlineExceeded, "no reply (timed out)");
    return UnavailableError(std::string("receive failed: ") + std::strerror(errno));
  }
  redisContext* c_;
  std::string buf_;
  size_t pos_ = 0;
};

StatusOr<long long> ParseLength(std::string_view text) {
  long long n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < -1) return DataLossError("bad RESP length");
  return n;
}
}  // namespace

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
  auto broken = [&](const Status& why) {
    broken_ = true;
    return Status(why.code(), "redis " + address_ + ": " + why.message());
  };
  RespInput in(c_);
  auto out = std::make_shared<BuiltReply>();
  auto set_string = [&](redisReply& r, int type, std::string text) {
    r.type = type;
    std::string& kept = out->strings.emplace_back(std::move(text));
    r.str = kept.data();
    r.len = kept.size();
  };
  StatusOr<std::string> head = in.Line();
  if (!head.ok()) return broken(head.status());
  if (head->empty()) return broken(DataLossError("empty RESP reply"));
  const std::string_view rest = std::string_view(*head).substr(1);
  switch ((*head)[0]) {
    case '-':
      set_string(out->top, REDIS_REPLY_ERROR, std::string(rest));
      break;
    case '+':
      set_string(out->top, REDIS_REPLY_STATUS, std::string(rest));
      break;
    case '*': {
      StatusOr<long long> n = ParseLength(rest);
      if (!n.ok()) return broken(n.status());
      if (*n < 0) {
        out->top.type = REDIS_REPLY_NIL;
        break;
      }
      out->top.type = REDIS_REPLY_ARRAY;
      out->elements.resize(static_cast<size_t>(*n));
      for (size_t i = 0; i < out->elements.size(); ++i) {
        redisReply& e = out->elements[i];
        StatusOr<std::string> eh = in.Line();
        if (!eh.ok()) return broken(eh.status());
        if (eh->empty() || (*eh)[0] != '$') return broken(DataLossError("an array element other than a bulk string"));
        StatusOr<long long> len = ParseLength(std::string_view(*eh).substr(1));
        if (!len.ok()) return broken(len.status());
        if (*len < 0) {
          e.type = REDIS_REPLY_NIL;
          continue;
        }
        const size_t size = static_cast<size_t>(*len);
        char* place = sink(i, size);
        std::string* kept = nullptr;
        if (place == nullptr) {
          kept = &out->strings.emplace_back(size, '\0');
          place = kept->data();
        }
        char crlf[2];
        Status st = in.Exact(place, size);
        if (st.ok()) st = in.Exact(crlf, 2);
        if (st.ok() && (crlf[0] != '\r' || crlf[1] != '\n')) st = DataLossError("a bulk string without its CRLF");
        if (!st.ok()) return broken(st);
        e.type = REDIS_REPLY_STRING;
        e.str = place;
        e.len = size;
      }
      for (redisReply& e : out->elements) out->pointers.push_back(&e);
      out->top.elements = out->pointers.size();
      out->top.element = out->pointers.data();
      break;
    }
    default:
      return broken(DataLossError("a reply of an unexpected type '" + head->substr(0, 1) + "'"));
  }
  if (!in.drained()) return broken(DataLossError("bytes after the reply"));
  const redisReply* top = &out->top;
  return Reply(std::move(out), top);
}

StatusOr<Reply> Connection::Run(const Command& command) {
  ATTIC_ASSIGN_OR_RETURN(std::vector<Reply> r, Pipeline({command}));
  return std::move(r[0]);
}

}  // namespace attic::store::redis
