// Bytes: the store's buffer for one serialized KV entry.
//
// Entries are tens of MB and short-lived (a turn's save, an SSD read, a promotion), so
// the buffers are the store's own: 4096-byte aligned (the SSD tier reads into them with
// O_DIRECT, no page-cache copy), never zero-filled (every byte is written before it is
// read), backed by transparent huge pages when large, and recycled. Memory handed back
// to the kernel and faulted in again is the expensive part (the kernel zeroes every page,
// and on a virtual machine the host may have reclaimed it: ~2 ms per MB measured on the
// development VM, against ~0.1 ms to write it), so a freed large buffer goes to a
// process-wide free list (at most kPoolBytes) and the next large entry reuses its pages:
// the head of the smallest pooled buffer that is large enough (its tail stays pooled),
// else the largest pooled buffers gathered into one range (mremap moves pages without
// copying or faulting them; only what they lack is new). A session's entry grows a little
// every turn, so a save faults in about the growth while the pool holds enough (measured
// over `attic bench sessions`' CA replay: 1,283 -> 774 MB of new pages for 2,647 MB saved).
//
// Thread-safety: a Bytes is a value owned by one thread until shared as SharedBytes
// (immutable from then on); Allocate and the destructor may run on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace attic::store {

class Bytes {
 public:
  // Bytes kept on the free list for reuse (beyond that, freed buffers are released).
  static constexpr size_t kPoolBytes = size_t{256} << 20;
  static constexpr size_t kAlign = 4096;

  // An uninitialized buffer of `size` bytes; capacity() is at least size rounded up to
  // kAlign (direct reads may fill up to capacity()).
  static std::unique_ptr<Bytes> Allocate(size_t size);
  ~Bytes();
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  std::string_view view() const { return {data_, size_}; }
  operator std::string_view() const { return view(); }

  // Bytes on the free list now (for tests and metrics).
  static size_t PooledBytes();

 private:
  Bytes(char* data, size_t size, size_t capacity) : data_(data), size_(size), capacity_(capacity) {}
  char* data_;
  size_t size_;
  size_t capacity_;
};

using SharedBytes = std::shared_ptr<const Bytes>;

// A copy of `bytes` in a new Bytes.
std::unique_ptr<Bytes> CopyBytes(std::string_view bytes);

}  // namespace attic::store
