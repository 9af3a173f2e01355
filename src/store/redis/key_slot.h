// Redis Cluster key slots: which of the 16384 hash slots a key belongs to (the Redis
// Cluster specification, "Keys distribution model"): CRC16 (XMODEM: polynomial 0x1021,
// initial value 0) of the key, modulo 16384. When the key holds a hash tag -- the bytes
// between its first '{' and the first '}' after it, when there is at least one byte
// between them -- only the tag is hashed, so keys sharing a tag share a slot (and a
// node: multi-key commands and MULTI/EXEC work on them).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

namespace attic::store::redis {

inline constexpr int kClusterSlots = 16384;

// CRC16-XMODEM of `bytes` (the checksum Redis Cluster hashes keys with).
uint16_t Crc16(std::string_view bytes);
// The slot of `key`, in [0, kClusterSlots).
int KeySlot(std::string_view key);
// The part of `key` that is hashed: its hash tag, or the whole key.
std::string_view HashedPart(std::string_view key);

}  // namespace attic::store::redis
