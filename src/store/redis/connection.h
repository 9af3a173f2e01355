// One connection to one Redis node over hiredis (blocking, with timeouts): commands are
// sent pipelined and their replies read in order. Replies are hiredis reply trees kept
// alive by shared pointers, so a value read from the node can be handed out without a
// copy (store::ByteRange owners).
//
// Errors: a connect that fails or takes longer than its timeout is Unavailable /
// DeadlineExceeded; so is a command whose reply does not arrive within the I/O timeout.
// After any such error the connection is broken (broken() is true) and must be dropped:
// the protocol stream is no longer in step. An error *reply* (-MOVED, -ERR ...) is not a
// failed call: it comes back as a reply of type REDIS_REPLY_ERROR for the caller to judge.
//
// Thread-safety: one thread at a time (ClusterClient hands each out exclusively).
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attic/core/status.h"
#include "store/redis/resp_reader.h"

namespace attic::store::redis {

// One command: its arguments (binary safe).
using Command = std::vector<std::string_view>;
// Where the bulk strings of an array reply go instead of into the reply (Pipeline): for
// element `element` of `len` bytes, a buffer of at least `len` bytes that receives them
// straight from the socket, or nullptr to keep that element in the reply as usual. The
// reply's element then points into the caller's buffer (its str is not owned).
// (BulkSink: resp_reader.h.)

// Makes hiredis's reader refuse an array reply of more than kMaxReplyElements elements
// (an out-of-memory error, which breaks the connection) instead of allocating for
// whatever count the peer announces: hiredis 0.14 callocs the announced count of
// element pointers up front (a hostile "*92233777" cost 737 MB; found by
// fuzz/resp_reader_fuzz). Every Connection's reader gets it.
void LimitReplyElements(redisReader* reader);

// A reply's string (STRING, STATUS, ERROR), "" for other types.
std::string_view ReplyText(const redisReply& r);
// Whether `r` is an error reply whose first word is `word` ("MOVED", "ASK", ...).
bool IsErrorReply(const redisReply& r, std::string_view word);

class Connection {
 public:
  // Connects to host:port within `connect_timeout`; commands then time out after
  // `io_timeout` (SetTimeout changes it).
  static StatusOr<std::unique_ptr<Connection>> Open(const std::string& host, int port,
                                                    std::chrono::milliseconds connect_timeout,
                                                    std::chrono::milliseconds io_timeout);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends `commands` in one pipeline and reads one reply each, in order. REQUIRES: !broken().
  // With `sink`, the last command's reply is read by Attic's own RESP reader, which
  // receives the bulk strings the sink places straight into its buffers (one copy, from
  // the kernel; hiredis would copy a large value three to four times, in 16 KB reads:
  // remote_tier_bench measured it at a third of a loopback connection's rate).
  StatusOr<std::vector<Reply>> Pipeline(const std::vector<Command>& commands, const BulkSink* sink = nullptr);
  StatusOr<Reply> Run(const Command& command);
  // The time a reply may take from now on (the rest of a caller's budget).
  Status SetTimeout(std::chrono::milliseconds timeout);
  bool broken() const { return broken_; }
  // "host:port"
  const std::string& address() const { return address_; }

 private:
  Connection(redisContext* c, std::string address) : c_(c), address_(std::move(address)) {}
  // The context's error as a Status (and the connection broken).
  Status Fail(const char* what);
  // Reads one reply with Attic's RESP reader (Pipeline with a sink). Any error breaks
  // the connection.
  StatusOr<Reply> ReadSunkReply(const BulkSink& sink);

  redisContext* c_;
  std::string address_;
  bool broken_ = false;
};

// Splits "host:port" (IPv4 or a name; "[v6]:port" for IPv6). InvalidArgument otherwise.
Status ParseAddress(std::string_view address, std::string* host, int* port);

}  // namespace attic::store::redis
