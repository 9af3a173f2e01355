#include "attic/store/bytes.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "attic/core/status.h"

namespace attic::store {

namespace {

constexpr size_t kHuge = size_t{2} << 20;  // transparent huge page size (x86-64)

// Large buffers by capacity (each an mmap of its own, kHuge aligned).
struct Pool {
  std::mutex mu;
  std::multimap<size_t, char*> free;
  size_t bytes = 0;
};

Pool& GetPool() {
  static Pool* pool = new Pool;  // never destroyed: buffers may be freed during exit
  return *pool;
}

size_t RoundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

// A kHuge-aligned range of `capacity` bytes (a multiple of kHuge): a reservation with
// room to align, its unaligned ends unmapped. With `from`, the pages of that mapping
// (from_capacity bytes) are moved to the start of the range (mremap: no copy, no new
// faults) and `from` is gone; otherwise the range is fresh anonymous memory.
char* MapAligned(size_t capacity, char* from = nullptr, size_t from_capacity = 0) {
  const size_t span = capacity + kHuge;
  void* r = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return nullptr;
  char* base = static_cast<char*>(r);
  char* p = reinterpret_cast<char*>(RoundUp(reinterpret_cast<uintptr_t>(base), kHuge));
  if (from != nullptr) {
    void* moved = ::mremap(from, from_capacity, capacity, MREMAP_MAYMOVE | MREMAP_FIXED, p);
    if (moved == MAP_FAILED) {
      ::munmap(base, span);
      return nullptr;
    }
  }
  if (p > base) ::munmap(base, static_cast<size_t>(p - base));
  if (base + span > p + capacity) ::munmap(p + capacity, static_cast<size_t>(base + span - (p + capacity)));
  ::madvise(p, capacity, MADV_HUGEPAGE);  // best effort (kept by mremap)
  return p;
}

// A pooled buffer of exactly `capacity` bytes, or nullptr when the pool is empty.
// REQUIRES: pool.mu held.
char* TakePooled(Pool& pool, size_t capacity) {
  if (pool.free.empty()) return nullptr;
  auto it = pool.free.lower_bound(capacity);
  // As it is: a buffer at most a quarter larger.
  if (it != pool.free.end() && it->first - capacity <= it->first / 4) {
    char* data = it->second;
    const size_t got = it->first;
    pool.free.erase(it);
    pool.bytes -= got;
    if (got == capacity) return data;
    ::munmap(data + capacity, got - capacity);  // the spare tail (whole huge pages)
    return data;
  }
  // Else the largest smaller buffer, grown (only the growth is new memory), or failing
  // that the smallest larger one shrunk, unless that would drop most of its pages (a
  // later large entry is better served by it; a small one is cheap to fault in).
  const bool grow = it != pool.free.begin();
  if (grow) {
    --it;
  } else if (capacity < it->first / 2) {
    return nullptr;
  }
  char* data = it->second;
  const size_t got = it->first;
  pool.free.erase(it);
  pool.bytes -= got;
  if (!grow) {
    ::munmap(data + capacity, got - capacity);
    return data;
  }
  char* moved = MapAligned(capacity, data, got);
  if (moved == nullptr) ::munmap(data, got);
  return moved;
}

}  // namespace

std::unique_ptr<Bytes> Bytes::Allocate(size_t size) {
  if (size < kHuge) {  // small: the C heap (not pooled)
    const size_t capacity = RoundUp(std::max<size_t>(size, 1), kAlign);
    void* p = nullptr;
    ATTIC_CHECK(posix_memalign(&p, kAlign, capacity) == 0);
    return std::unique_ptr<Bytes>(new Bytes(static_cast<char*>(p), size, capacity));
  }
  const size_t capacity = RoundUp(size, kHuge);
  char* data = nullptr;
  {
    Pool& pool = GetPool();
    std::lock_guard<std::mutex> lock(pool.mu);
    data = TakePooled(pool, capacity);
  }
  if (data == nullptr) data = MapAligned(capacity);
  ATTIC_CHECK(data != nullptr);
  return std::unique_ptr<Bytes>(new Bytes(data, size, capacity));
}

Bytes::~Bytes() {
  if (capacity_ < kHuge) {
    std::free(data_);
    return;
  }
  Pool& pool = GetPool();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (pool.bytes + capacity_ <= kPoolBytes) {
      pool.free.emplace(capacity_, data_);
      pool.bytes += capacity_;
      return;
    }
  }
  ::munmap(data_, capacity_);
}

size_t Bytes::PooledBytes() {
  Pool& pool = GetPool();
  std::lock_guard<std::mutex> lock(pool.mu);
  return pool.bytes;
}

std::unique_ptr<Bytes> CopyBytes(std::string_view bytes) {
  auto b = Bytes::Allocate(bytes.size());
  if (!bytes.empty()) std::memcpy(b->data(), bytes.data(), bytes.size());
  return b;
}

}  // namespace attic::store
