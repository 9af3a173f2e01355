// AlignedBuffer: an owning, 64-byte-aligned, zero-initialised byte buffer (cache-line
// and AVX-512 aligned) for activations, KV blocks and converted weights.
//
// Thread-safety: none; callers coordinate access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace attic {

class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 64;
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes) { Resize(bytes); }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  // Discards the old contents; the new memory is zeroed.
  void Resize(size_t bytes) {
    ResizeUninitialized(bytes);
    if (data_ != nullptr) std::memset(data_, 0, Rounded(bytes));
  }
  // Like Resize, but the new memory is not initialised: for a caller that writes every
  // byte before reading it, or zeroes it itself (in parallel, with progress).
  void ResizeUninitialized(size_t bytes) {
    std::free(data_);
    data_ = nullptr;
    size_ = bytes;
    if (bytes == 0) return;
    data_ = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, Rounded(bytes)));
    if (data_ == nullptr) std::abort();
  }
  // The bytes actually allocated (a multiple of kAlignment).
  static size_t Rounded(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
  // Grows (never shrinks) without preserving contents.
  void Reserve(size_t bytes) {
    if (bytes > size_) Resize(bytes);
  }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  template <typename T>
  T* as() { return reinterpret_cast<T*>(data_); }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data_); }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace attic
