// DramTier (tier.h): values in this process's memory.
#include "attic/store/tier.h"

namespace attic::store {

TierTraits DramTier::traits() const {
  TierTraits t;
  t.local_memory = true;
  return t;
}

Status DramTier::Put(const std::string& key, std::string_view bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    uint64_t old = it == values_.end() ? 0 : it->second->size();
    if (bytes_ - old + bytes.size() > capacity_)
      return ResourceExhaustedError("DRAM tier full: " + std::to_string(bytes_) + " + " +
                                    std::to_string(bytes.size()) + " > " + std::to_string(capacity_));
  }
  return PutShared(key, SharedBytes(CopyBytes(bytes)));
}

Status DramTier::PutShared(const std::string& key, SharedBytes bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  uint64_t old = it == values_.end() ? 0 : it->second->size();
  if (bytes_ - old + bytes->size() > capacity_)
    return ResourceExhaustedError("DRAM tier full: " + std::to_string(bytes_) + " + " + std::to_string(bytes->size()) +
                                  " > " + std::to_string(capacity_));
  bytes_ = bytes_ - old + bytes->size();
  values_[key] = std::move(bytes);
  return OkStatus();
}

StatusOr<std::string> DramTier::Get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return NotFoundError("no entry " + key + " in DRAM");
  return std::string(it->second->view());
}

StatusOr<SharedBytes> DramTier::GetShared(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return NotFoundError("no entry " + key + " in DRAM");
  return it->second;
}

StatusOr<ByteRange> DramTier::GetRange(const std::string& key, uint64_t offset, uint64_t length) {
  SharedBytes value;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it == values_.end()) return NotFoundError("no entry " + key + " in DRAM");
    value = it->second;
  }
  ATTIC_RETURN_IF_ERROR(CheckRange(value->size(), offset, length));
  const char* data = value->data() + offset;
  return ByteRange{std::move(value), data, static_cast<size_t>(length)};  // a view: nothing copied
}

Status DramTier::Erase(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it != values_.end()) {
    bytes_ -= it->second->size();
    values_.erase(it);
  }
  return OkStatus();
}

bool DramTier::Contains(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.count(key) != 0;
}

int64_t DramTier::SizeOf(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  return it == values_.end() ? -1 : static_cast<int64_t>(it->second->size());
}

std::vector<std::string> DramTier::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> keys;
  for (const auto& [k, v] : values_) keys.push_back(k);
  return keys;
}

uint64_t DramTier::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace attic::store
