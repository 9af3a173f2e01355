#include "store/redis/resp_reader.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <deque>
#include <vector>

namespace attic::store::redis {

namespace {

// A reply read by ReadSunkReply: hiredis's struct, built here; strings are owned here
// or (sunk bulk strings) by the caller.
struct BuiltReply {
  redisReply top{};
  std::vector<redisReply> elements;
  std::vector<redisReply*> pointers;
  std::deque<std::string> strings;  // stable addresses
};

constexpr size_t kMaxLine = 64 * 1024;
constexpr size_t kChunk = 16 * 1024;

class RespInput {
 public:
  explicit RespInput(RespSource& s) : s_(s), buf_(std::move(s.buffered)) { s.buffered.clear(); }
  // The next line, without its CRLF.
  StatusOr<std::string> Line() {
    for (;;) {
      const size_t at = buf_.find("\r\n", pos_);
      if (at != std::string::npos) {
        std::string line = buf_.substr(pos_, at - pos_);
        pos_ = at + 2;
        return line;
      }
      if (buf_.size() - pos_ > kMaxLine) return DataLossError("a RESP line longer than 64 KB");
      ATTIC_RETURN_IF_ERROR(More());
    }
  }
  // Exactly n bytes into dst (a buffer of n bytes the caller placed).
  Status Exact(char* dst, size_t n) {
    const size_t have = std::min(n, buf_.size() - pos_);
    std::memcpy(dst, buf_.data() + pos_, have);
    pos_ += have;
    for (size_t done = have; done < n;) {
      ATTIC_ASSIGN_OR_RETURN(size_t got, s_.recv(dst + done, n - done));
      done += got;
    }
    return OkStatus();
  }
  // Exactly n bytes appended to *out, which grows only as they arrive.
  Status Append(std::string* out, size_t n) {
    while (n > 0) {
      if (pos_ == buf_.size()) ATTIC_RETURN_IF_ERROR(More());
      const size_t take = std::min(n, buf_.size() - pos_);
      out->append(buf_, pos_, take);
      pos_ += take;
      n -= take;
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
    char chunk[kChunk];
    ATTIC_ASSIGN_OR_RETURN(size_t got, s_.recv(chunk, sizeof chunk));
    buf_.append(chunk, std::min(got, sizeof chunk));
    return OkStatus();
  }
  RespSource& s_;
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

StatusOr<Reply> ReadSunkReply(RespSource& source, const BulkSink& sink) {
  RespInput in(source);
  auto out = std::make_shared<BuiltReply>();
  auto set_string = [&](redisReply& r, int type, std::string text) {
    r.type = type;
    std::string& kept = out->strings.emplace_back(std::move(text));
    r.str = kept.data();
    r.len = kept.size();
  };
  ATTIC_ASSIGN_OR_RETURN(std::string head, in.Line());
  if (head.empty()) return DataLossError("empty RESP reply");
  const std::string_view rest = std::string_view(head).substr(1);
  switch (head[0]) {
    case '-':
      set_string(out->top, REDIS_REPLY_ERROR, std::string(rest));
      break;
    case '+':
      set_string(out->top, REDIS_REPLY_STATUS, std::string(rest));
      break;
    case '*': {
      ATTIC_ASSIGN_OR_RETURN(long long n, ParseLength(rest));
      if (n < 0) {
        out->top.type = REDIS_REPLY_NIL;
        break;
      }
      // The count is the peer's word: elements are added as they are read, never sized
      // by it up front.
      if (n > kMaxReplyElements) return DataLossError("a RESP array of " + std::to_string(n) + " elements");
      out->top.type = REDIS_REPLY_ARRAY;
      for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
        redisReply& e = out->elements.emplace_back();
        ATTIC_ASSIGN_OR_RETURN(std::string eh, in.Line());
        if (eh.empty() || eh[0] != '$') return DataLossError("an array element other than a bulk string");
        ATTIC_ASSIGN_OR_RETURN(long long len, ParseLength(std::string_view(eh).substr(1)));
        if (len < 0) {
          e.type = REDIS_REPLY_NIL;
          continue;
        }
        const size_t size = static_cast<size_t>(len);
        char* place = sink ? sink(i, size) : nullptr;
        Status st;
        if (place != nullptr) {
          st = in.Exact(place, size);
        } else {  // kept in the reply
          std::string& kept = out->strings.emplace_back();
          st = in.Append(&kept, size);
          place = kept.data();
        }
        char crlf[2];
        if (st.ok()) st = in.Exact(crlf, 2);
        if (st.ok() && (crlf[0] != '\r' || crlf[1] != '\n')) st = DataLossError("a bulk string without its CRLF");
        ATTIC_RETURN_IF_ERROR(st);
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
      return DataLossError("a reply of an unexpected type '" + head.substr(0, 1) + "'");
  }
  if (!in.drained()) return DataLossError("bytes after the reply");
  const redisReply* top = &out->top;
  return Reply(std::move(out), top);
}

}  // namespace attic::store::redis
