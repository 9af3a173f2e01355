// Attic's own RESP reader: the reply to the last command of a pipeline whose bulk
// strings the caller places (Connection::Pipeline with a BulkSink). It reads from a
// RespSource (a socket in Connection; bytes in memory in tests and the fuzz harness).
//
// Every length in a reply is data from the network: it is checked before anything is
// sized by it, and a bulk string kept in the reply grows as its bytes arrive, so a
// hostile length costs no more memory than the bytes actually sent.
//
// Thread-safety: a RespSource and the reader run on one thread.
#pragma once

#include <hiredis/hiredis.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <sys/types.h>

#include "attic/core/status.h"

namespace attic::store::redis {

using Reply = std::shared_ptr<const redisReply>;
using BulkSink = std::function<char*(size_t element, size_t len)>;

// The most elements an array reply may have (a read of Attic's never asks for more
// than kMaxParts + 1 fields; Redis itself allows more, none of which Attic reads here).
inline constexpr long long kMaxReplyElements = 1 << 20;

// The bytes of one reply: `buffered` (read already by hiredis), then `recv` calls.
// recv(dst, n) returns the bytes received (> 0) or a non-OK status (closed, timed out).
struct RespSource {
  std::string buffered;
  std::function<StatusOr<size_t>(char* dst, size_t n)> recv;
};

// Reads one reply: an error or status line, a nil array, or an array of bulk strings
// (nil or not). Element i's bytes go where sink(i, len) places them, or into the reply.
// DataLoss for anything else or malformed; the source's error when it fails first; and
// DataLoss when bytes follow the reply.
StatusOr<Reply> ReadSunkReply(RespSource& source, const BulkSink& sink);

}  // namespace attic::store::redis
