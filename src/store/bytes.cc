#include "attic/store/bytes.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

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

// Takes the pooled buffer that best serves a request of `capacity` bytes off the list:
// one at most a quarter larger (used as it is, its tail trimmed); else the largest smaller
// one (grown: only the growth is new memory); else the smallest larger one (trimmed),
// unless that would drop most of its pages (a later large entry is better served by it; a
// small one is cheap to fault in). {nullptr, 0} when none. REQUIRES: pool.mu held.
std::pair<char*, size_t> TakePooled(Pool& pool, size_t capacity) {
  if (pool.free.empty()) return {nullptr, 0};
  auto it = pool.free.lower_bound(capacity);
  const bool fits = it != pool.free.end() && it->first - capacity <= it->first / 4;
  if (!fits) {
    if (it != pool.free.begin()) {
      --it;
    } else if (capacity < it->first / 2) {
      return {nullptr, 0};
    }
  }
  const std::pair<char*, size_t> taken{it->second, it->first};
  pool.free.erase(it);
  pool.bytes -= taken.second;
  return taken;
}

// `data` (a pooled mapping of `got` bytes) resized to `capacity`: the spare tail (whole
// huge pages) unmapped, or grown by mremap. nullptr when growing fails (data is gone).
char* Resize(char* data, size_t got, size_t capacity) {
  if (got >= capacity) {
    if (got > capacity) ::munmap(data + capacity, got - capacity);
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
  std::pair<char*, size_t> pooled;
  {
    Pool& pool = GetPool();
    std::lock_guard<std::mutex> lock(pool.mu);
    pooled = TakePooled(pool, capacity);
  }
  // The mapping calls run outside the pool's lock.
  char* data = pooled.first != nullptr ? Resize(pooled.first, pooled.second, capacity) : nullptr;
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
