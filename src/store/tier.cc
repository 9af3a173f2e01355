// Tier (tier.h): level names and the interface's default methods.
#include "attic/store/tier.h"

#include <cstring>

namespace attic::store {

std::string TierName(TierLevel level) {
  switch (level) {
    case TierLevel::kDram: return "dram";
    case TierLevel::kSsd: return "ssd";
  }
  return "tier" + std::to_string(TierIndex(level));
}

ReadError ClassifyReadError(const Status& status) {
  switch (status.code()) {
    case StatusCode::kNotFound: return ReadError::kVanished;
    case StatusCode::kDataLoss:
    case StatusCode::kFailedPrecondition: return ReadError::kCorrupt;
    default: return ReadError::kTransient;  // never delete on an error that may pass
  }
}

Status CheckRange(uint64_t size, uint64_t offset, uint64_t length) {
  if (offset > size || length > size - offset)
    return OutOfRangeError("range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                           ") passes the end of a value of " + std::to_string(size) + " bytes");
  return OkStatus();
}

StatusOr<SharedBytes> Tier::GetShared(const std::string& key) {
  ATTIC_ASSIGN_OR_RETURN(std::string bytes, Get(key));
  return SharedBytes(CopyBytes(bytes));
}

StatusOr<ByteRange> Tier::GetRange(const std::string& key, uint64_t offset, uint64_t length) {
  ATTIC_ASSIGN_OR_RETURN(SharedBytes bytes, GetShared(key));
  ATTIC_RETURN_IF_ERROR(CheckRange(bytes->size(), offset, length));
  const char* data = bytes->data() + offset;
  return ByteRange{std::move(bytes), data, static_cast<size_t>(length)};
}

Status Tier::ReadInto(const std::string& key, uint64_t offset, uint64_t length, char* dst) {
  ATTIC_ASSIGN_OR_RETURN(ByteRange r, GetRange(key, offset, length));
  std::memcpy(dst, r.data, r.size);
  return OkStatus();
}

}  // namespace attic::store
