#include "attic/store/bytes.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "attic/core/status.h"

namespace attic::store {

namespace {

constexpr size_t kHuge = size_t{2} << 20;  // transparent huge page size (x86-64)

// Large buffers by capacity (each an mmap of its own, kHuge aligned).
struct Pool {
  std::mutex mu;
  std::multimap<size_t, char*> free;
  size_t bytes = 0;     // on the free list
  size_t live = 0;      // large buffers allocated and not freed yet
  size_t reserved = 0;  // the live reservations' total
  // Pooled bytes the free list may hold: kPoolBytes, or what the reservations leave
  // beside the allocated buffers.
  size_t Limit() const { return std::max(Bytes::kPoolBytes, reserved > live ? reserved - live : 0); }
};

Pool& GetPool() {
  static Pool* pool = new Pool;  // never destroyed: buffers may be freed during exit
  return *pool;
}

size_t RoundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

using Piece = std::pair<char*, size_t>;  // pooled pages: address, bytes (multiples of kHuge)

// A kHuge-aligned range of `capacity` bytes (a multiple of kHuge): a reservation with
// room to align, its unaligned ends unmapped. The pages of `pieces` (at most capacity
// bytes together) are moved to its start, one after the other (mremap: no copy, no new
// faults) and the pieces are gone; the rest of the range is fresh anonymous memory.
// nullptr on failure (the pieces not yet moved are unmapped).
char* MapAligned(size_t capacity, const std::vector<Piece>& pieces) {
  const size_t span = capacity + kHuge;
  void* r = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) {
    for (const Piece& piece : pieces) ::munmap(piece.first, piece.second);
    return nullptr;
  }
  char* base = static_cast<char*>(r);
  char* p = reinterpret_cast<char*>(RoundUp(reinterpret_cast<uintptr_t>(base), kHuge));
  size_t at = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    void* moved = ::mremap(pieces[i].first, pieces[i].second, pieces[i].second, MREMAP_MAYMOVE | MREMAP_FIXED, p + at);
    if (moved == MAP_FAILED) {
      for (size_t j = i; j < pieces.size(); ++j) ::munmap(pieces[j].first, pieces[j].second);
      ::munmap(base, span);
      return nullptr;
    }
    at += pieces[i].second;
  }
  if (p > base) ::munmap(base, static_cast<size_t>(p - base));
  if (base + span > p + capacity) ::munmap(p + capacity, static_cast<size_t>(base + span - (p + capacity)));
  ::madvise(p, capacity, MADV_HUGEPAGE);  // best effort (kept by mremap)
  return p;
}

// Takes pages for a request of `capacity` bytes off the list: the smallest pooled buffer
// at least that large, split -- its head is taken and its tail (whole huge pages, still
// mapped and faulted in) stays on the list; else the largest ones, until they cover the
// request or the list is empty (gathered into one range: only what they lack is new
// memory). Faulting fresh pages is what a save costs most on a busy VM (measured: ~70%
// of the writer's CPU went to clearing new pages), so pooled pages are never dropped for
// a better fit. REQUIRES: pool.mu held.
std::vector<Piece> TakePooled(Pool& pool, size_t capacity) {
  std::vector<Piece> taken;
  size_t need = capacity;
  while (need > 0 && !pool.free.empty()) {
    auto it = pool.free.lower_bound(need);
    if (it == pool.free.end()) --it;
    Piece piece{it->second, it->first};
    pool.free.erase(it);
    pool.bytes -= piece.second;
    if (piece.second > need) {  // split: the tail stays pooled
      pool.free.emplace(piece.second - need, piece.first + need);
      pool.bytes += piece.second - need;
      piece.second = need;
    }
    taken.push_back(piece);
    need -= piece.second;
  }
  return taken;
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
  std::vector<Piece> pooled;
  {
    Pool& pool = GetPool();
    std::lock_guard<std::mutex> lock(pool.mu);
    pooled = TakePooled(pool, capacity);
    pool.live += capacity;
  }
  // The mapping calls run outside the pool's lock. One piece of the whole size is used
  // where it is; if moving the pieces fails (they are gone), the range is all fresh.
  char* data = nullptr;
  if (pooled.size() == 1 && pooled[0].second == capacity) data = pooled[0].first;
  if (data == nullptr) data = MapAligned(capacity, pooled);
  if (data == nullptr && !pooled.empty()) data = MapAligned(capacity, {});
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
    pool.live -= capacity_;
    if (pool.bytes + capacity_ <= pool.Limit()) {
      pool.free.emplace(capacity_, data_);
      pool.bytes += capacity_;
      return;
    }
  }
  ::munmap(data_, capacity_);
}

std::unique_ptr<Bytes::Reservation> Bytes::Reserve(size_t bytes,
                                                   const std::function<void(uint64_t, uint64_t)>& progress) {
  bytes = RoundUp(bytes, kHuge);
  Pool& pool = GetPool();
  size_t need = 0;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.reserved += bytes;
    const size_t have = pool.live + pool.bytes;
    need = pool.reserved > have ? std::min(bytes, pool.reserved - have) : 0;
  }
  // Mapped and faulted in a piece at a time (outside the lock: saves go on meanwhile).
  constexpr size_t kPiece = size_t{64} << 20;
  for (size_t done = 0; done < need;) {
    const size_t n = std::min(kPiece, need - done);
    char* p = MapAligned(n, {});
    if (p == nullptr) break;  // best effort: buffers then fault their pages in when used
    bool populated = false;
#ifdef MADV_POPULATE_WRITE
    populated = ::madvise(p, n, MADV_POPULATE_WRITE) == 0;  // Linux 5.14+
#endif
    if (!populated)
      for (size_t i = 0; i < n; i += kAlign) static_cast<volatile char*>(p)[i] = 0;
    {
      std::lock_guard<std::mutex> lock(pool.mu);
      pool.free.emplace(n, p);
      pool.bytes += n;
    }
    done += n;
    if (progress) progress(done, need);
  }
  return std::unique_ptr<Reservation>(new Reservation(bytes));
}

std::unique_ptr<Bytes::Reservation> Bytes::ReserveOnDemand(size_t bytes) {
  bytes = RoundUp(bytes, kHuge);
  Pool& pool = GetPool();
  std::lock_guard<std::mutex> lock(pool.mu);
  pool.reserved += bytes;
  return std::unique_ptr<Reservation>(new Reservation(bytes));
}

Bytes::Reservation::~Reservation() {
  Pool& pool = GetPool();
  std::vector<Piece> drop;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.reserved -= bytes_;
    while (pool.bytes > pool.Limit() && !pool.free.empty()) {  // largest pieces first
      auto it = std::prev(pool.free.end());
      drop.emplace_back(it->second, it->first);
      pool.bytes -= it->first;
      pool.free.erase(it);
    }
  }
  for (const Piece& piece : drop) ::munmap(piece.first, piece.second);
}

size_t Bytes::PooledBytes() {
  Pool& pool = GetPool();
  std::lock_guard<std::mutex> lock(pool.mu);
  return pool.bytes;
}

void Bytes::ReleasePooled() {
  Pool& pool = GetPool();
  std::multimap<size_t, char*> drop;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    drop.swap(pool.free);
    pool.bytes = 0;
  }
  for (const auto& [bytes, p] : drop) ::munmap(p, bytes);
}

std::unique_ptr<Bytes> CopyBytes(std::string_view bytes) {
  auto b = Bytes::Allocate(bytes.size());
  if (!bytes.empty()) std::memcpy(b->data(), bytes.data(), bytes.size());
  return b;
}

}  // namespace attic::store
