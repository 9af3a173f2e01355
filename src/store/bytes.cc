#include "attic/store/bytes.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "attic/core/status.h"

namespace attic::store {

namespace {

constexpr size_t kHuge = size_t{2} << 20;  // transparent huge page size (x86-64)

// Buffers by capacity. A request takes the smallest free buffer that fits and wastes at
// most a quarter of it.
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

char* NewBuffer(size_t capacity) {
  const size_t align = capacity >= kHuge ? kHuge : Bytes::kAlign;
  void* p = nullptr;
  if (posix_memalign(&p, align, capacity) != 0) return nullptr;
  if (capacity >= kHuge) ::madvise(p, capacity, MADV_HUGEPAGE);  // best effort
  return static_cast<char*>(p);
}

}  // namespace

std::unique_ptr<Bytes> Bytes::Allocate(size_t size) {
  const size_t capacity = RoundUp(std::max<size_t>(size, 1), size >= kHuge ? kHuge : kAlign);
  Pool& pool = GetPool();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    auto it = pool.free.lower_bound(capacity);
    if (it != pool.free.end() && it->first - capacity <= it->first / 4) {
      const size_t got = it->first;
      char* data = it->second;
      pool.free.erase(it);
      pool.bytes -= got;
      return std::unique_ptr<Bytes>(new Bytes(data, size, got));
    }
  }
  char* data = NewBuffer(capacity);
  ATTIC_CHECK(data != nullptr);
  return std::unique_ptr<Bytes>(new Bytes(data, size, capacity));
}

Bytes::~Bytes() {
  Pool& pool = GetPool();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (capacity_ >= kHuge && pool.bytes + capacity_ <= kPoolBytes) {
      pool.free.emplace(capacity_, data_);
      pool.bytes += capacity_;
      return;
    }
  }
  std::free(data_);
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
