#include "attic/store/memory_tier.h"

#include <algorithm>
#include <thread>

namespace attic::store {

MemoryTier::MemoryTier(MemoryTierOptions options) : options_(std::move(options)) {}

void MemoryTier::Sleep() const {
  if (options_.latency.count() > 0) std::this_thread::sleep_for(options_.latency);
}

Status MemoryTier::TakeReadFault() {
  ++reads_;
  if (fail_reads_ == 0) return OkStatus();
  --fail_reads_;
  return read_fault_;
}

void MemoryTier::EraseLocked(const std::string& key) {
  auto it = values_.find(key);
  if (it == values_.end()) return;
  bytes_ -= it->second.size();
  values_.erase(it);
  order_.erase(std::remove(order_.begin(), order_.end(), key), order_.end());
}

Status MemoryTier::Put(const std::string& key, std::string_view bytes) {
  Sleep();
  std::lock_guard<std::mutex> lock(mu_);
  ++puts_;
  if (fail_puts_ > 0) {
    --fail_puts_;
    return put_fault_;
  }
  if (bytes.size() > options_.capacity)
    return ResourceExhaustedError(options_.name + " tier: a value of " + std::to_string(bytes.size()) +
                                  " bytes exceeds its capacity");
  auto it = values_.find(key);
  const uint64_t old = it == values_.end() ? 0 : it->second.size();
  if (bytes_ - old + bytes.size() > options_.capacity) {
    if (!options_.traits.evicts_itself)
      return ResourceExhaustedError(options_.name + " tier full: " + std::to_string(bytes_) + " + " +
                                    std::to_string(bytes.size()) + " > " + std::to_string(options_.capacity));
    EraseLocked(key);  // replaced anyway
    while (bytes_ + bytes.size() > options_.capacity) EraseLocked(order_.front());  // the oldest go
  } else if (it != values_.end()) {
    EraseLocked(key);
  }
  values_[key] = std::string(bytes);
  order_.push_back(key);
  bytes_ += bytes.size();
  return OkStatus();
}

StatusOr<std::string> MemoryTier::Get(const std::string& key) {
  Sleep();
  std::lock_guard<std::mutex> lock(mu_);
  ATTIC_RETURN_IF_ERROR(TakeReadFault());
  auto it = values_.find(key);
  if (it == values_.end()) return NotFoundError("no entry " + key + " in the " + options_.name + " tier");
  return it->second;
}

StatusOr<SharedBytes> MemoryTier::GetShared(const std::string& key) {
  ATTIC_ASSIGN_OR_RETURN(std::string bytes, Get(key));
  return SharedBytes(CopyBytes(bytes));
}

StatusOr<ByteRange> MemoryTier::GetRange(const std::string& key, uint64_t offset, uint64_t length) {
  Sleep();
  std::lock_guard<std::mutex> lock(mu_);
  ATTIC_RETURN_IF_ERROR(TakeReadFault());
  auto it = values_.find(key);
  if (it == values_.end()) return NotFoundError("no entry " + key + " in the " + options_.name + " tier");
  ATTIC_RETURN_IF_ERROR(CheckRange(it->second.size(), offset, length));
  SharedBytes copy(CopyBytes(std::string_view(it->second).substr(offset, length)));
  const char* data = copy->data();
  return ByteRange{std::move(copy), data, static_cast<size_t>(length)};
}

Status MemoryTier::Erase(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  EraseLocked(key);
  return OkStatus();
}

bool MemoryTier::Contains(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.count(key) != 0;
}

int64_t MemoryTier::SizeOf(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  return it == values_.end() ? -1 : static_cast<int64_t>(it->second.size());
}

std::vector<std::string> MemoryTier::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> keys;
  for (const auto& [k, v] : values_) keys.push_back(k);
  return keys;
}

uint64_t MemoryTier::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void MemoryTier::FailNextReads(int n, Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_reads_ = n;
  read_fault_ = std::move(status);
}

void MemoryTier::FailNextPuts(int n, Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_puts_ = n;
  put_fault_ = std::move(status);
}

void MemoryTier::Corrupt(const std::string& key, uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it != values_.end() && offset < it->second.size()) it->second[offset] ^= 0x01;
}

void MemoryTier::Vanish(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  EraseLocked(key);
}

uint64_t MemoryTier::reads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reads_;
}

uint64_t MemoryTier::puts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return puts_;
}

}  // namespace attic::store
