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
// A store sized by its operator faults its pages in once, when it opens (Reserve: the
// DRAM tier plus the write buffer), as vLLM's swap space or SGLang's host KV pool are
// allocated at start-up: the pool then keeps freed buffers while pooled and allocated
// large buffers together are within the reservations, and a save on the serving path
// does not pay for fresh pages at all (measured over the CA replay of `attic bench
// sessions`, sampling the CPU while a turn waits for its first token: the writer's share
// went from 2.4% to 0.1%, most of it the kernel clearing fresh pages before). A store
// sized automatically (`attic serve` without --kv-dram) reserves on demand instead
// (ReserveOnDemand): the same recycling once pages have been used, without a resident
// set the size of the tier from the start.
//
// Thread-safety: a Bytes is a value owned by one thread until shared as SharedBytes
// (immutable from then on); Allocate, Reserve and the destructors may run on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
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
  // Unmaps everything on the free list (tests: a known empty pool).
  static void ReleasePooled();

  // While it lives, the free list keeps freed buffers as long as pooled and allocated
  // large buffers together stay within the live reservations' total (beyond kPoolBytes).
  class Reservation {
   public:
    ~Reservation();  // the pool shrinks back to what the other reservations allow
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    size_t bytes() const { return bytes_; }

   private:
    friend class Bytes;
    explicit Reservation(size_t bytes) : bytes_(bytes) {}
    size_t bytes_;
  };
  // Reserves `bytes` (rounded up to whole 2 MiB pages) and faults in the pages the pool
  // lacks for it now, onto the free list. progress(done, total) is called as they are.
  static std::unique_ptr<Reservation> Reserve(size_t bytes,
                                              const std::function<void(uint64_t, uint64_t)>& progress = nullptr);
  // Reserves `bytes` (rounded up to whole 2 MiB pages) without faulting any page in: the
  // pool keeps freed buffers up to the reservation as Reserve's does, but only pages the
  // process has used are ever there, so its memory follows the largest use so far, not
  // the reservation (the automatic DRAM tier, docs/store.md "The DRAM tier by default").
  static std::unique_ptr<Reservation> ReserveOnDemand(size_t bytes);

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
