#include "attic/store/tier.h"

namespace attic::store {

const char* TierName(TierLevel level) { return level == TierLevel::kDram ? "dram" : "ssd"; }

StatusOr<SharedBytes> Tier::GetShared(const std::string& key) {
  ATTIC_ASSIGN_OR_RETURN(std::string bytes, Get(key));
  return SharedBytes(CopyBytes(bytes));
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
