// The RESP reader of the remote tier's reads (src/store/redis/resp_reader.cc), and
// hiredis's reader (which reads every other reply) on the same bytes.
//
// Byte 0 picks how the bytes arrive (all buffered, or in receives of 1..16 bytes) and
// which array elements the sink places in caller buffers; the rest is the stream.
// Invariants: no crash, no allocation beyond the bytes received (libFuzzer's -malloc_limit_mb
// and slow-unit reports catch one; hiredis needed LimitReplyElements); a reply that reads is
// one the writer below re-encodes to bytes that read back to the same reply (round
// trip); sunk elements land in the caller's buffer with the length announced.
#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "store/redis/connection.h"
#include "store/redis/resp_reader.h"

using namespace attic;
using namespace attic::store::redis;

namespace {

// RESP2, written from the protocol specification.
std::string Encode(const redisReply& r) {
  switch (r.type) {
    case REDIS_REPLY_ERROR: return "-" + std::string(r.str, r.len) + "\r\n";
    case REDIS_REPLY_STATUS: return "+" + std::string(r.str, r.len) + "\r\n";
    case REDIS_REPLY_NIL: return "*-1\r\n";
    case REDIS_REPLY_ARRAY: {
      std::string out = "*" + std::to_string(r.elements) + "\r\n";
      for (size_t i = 0; i < r.elements; ++i) {
        const redisReply& e = *r.element[i];
        if (e.type == REDIS_REPLY_NIL) out += "$-1\r\n";
        else out += "$" + std::to_string(e.len) + "\r\n" + std::string(e.str, e.len) + "\r\n";
      }
      return out;
    }
  }
  FUZZ_CHECK(false, "reply type %d", r.type);
  return "";
}

struct Reading {
  StatusOr<Reply> reply = DataLossError("unread");
  std::deque<std::string> placed;  // the sink's buffers
};

void Read(std::string_view stream, size_t step, uint8_t sink_mask, Reading* out) {
  RespSource src;
  size_t at = 0;
  if (step == 0) {
    src.buffered = std::string(stream);
    at = stream.size();
  }
  const size_t chunk = step == 0 ? 1 : step;
  src.recv = [&](char* dst, size_t n) -> StatusOr<size_t> {
    if (at == stream.size()) return UnavailableError("connection closed by the server");
    const size_t take = std::min({n, chunk, stream.size() - at});
    std::memcpy(dst, stream.data() + at, take);
    at += take;
    return take;
  };
  BulkSink sink = [&](size_t element, size_t len) -> char* {
    if (((sink_mask >> (element % 8)) & 1) == 0) return nullptr;
    if (len > stream.size()) return nullptr;  // a caller never places more than it planned
    return out->placed.emplace_back(len, '\0').data();
  };
  out->reply = ReadSunkReply(src, sink);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t step = data[0] % 17;  // 0: everything buffered already
  const uint8_t mask = data[1];
  const std::string_view stream(reinterpret_cast<const char*>(data) + 2, size - 2);

  Reading first;
  Read(stream, step, mask, &first);
  if (first.reply.ok()) {
    const std::string again = Encode(**first.reply);
    Reading second;
    Read(again, 0, 0, &second);
    FUZZ_CHECK(second.reply.ok(), "re-encoded reply does not read: %s", second.reply.status().ToString().c_str());
    FUZZ_CHECK(Encode(**second.reply) == again, "round trip differs");
  }

  // hiredis's reader on the same bytes, bounded as every Connection's is: replies until
  // it needs more or fails.
  redisReader* reader = redisReaderCreate();
  FUZZ_CHECK(reader != nullptr);
  LimitReplyElements(reader);
  if (redisReaderFeed(reader, stream.data(), stream.size()) == REDIS_OK) {
    for (int i = 0; i < 64; ++i) {
      void* reply = nullptr;
      if (redisReaderGetReply(reader, &reply) != REDIS_OK || reply == nullptr) break;
      freeReplyObject(reply);
    }
  }
  redisReaderFree(reader);
  return 0;
}
