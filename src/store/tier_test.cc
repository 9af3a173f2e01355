#include "attic/store/tier.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::ScratchDir;

template <typename MakeTier>
void ExerciseTier(MakeTier make) {
  auto tier = make(100);
  EXPECT_EQ(tier->bytes(), 0u);
  ASSERT_TRUE(tier->Put("a", std::string(60, 'a')).ok());
  EXPECT_TRUE(tier->Contains("a"));
  EXPECT_EQ(tier->SizeOf("a"), 60);
  EXPECT_EQ(tier->Put("b", std::string(41, 'b')).code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(tier->Contains("b"));
  ASSERT_TRUE(tier->Put("b", std::string(40, 'b')).ok());
  EXPECT_EQ(tier->bytes(), 100u);
  // Replacing counts only the difference.
  ASSERT_TRUE(tier->Put("a", std::string(50, 'A')).ok());
  EXPECT_EQ(tier->bytes(), 90u);
  EXPECT_EQ(*tier->Get("a"), std::string(50, 'A'));
  EXPECT_EQ(tier->Get("zz").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(tier->Erase("a").ok());
  ASSERT_TRUE(tier->Erase("a").ok());
  EXPECT_EQ(tier->bytes(), 40u);
  EXPECT_EQ(tier->Keys(), std::vector<std::string>{"b"});
  EXPECT_LE(tier->bytes(), tier->capacity());
}

TEST(DramTier, PutGetEraseWithinCapacity) {
  ExerciseTier([](uint64_t cap) { return std::make_unique<DramTier>(cap); });
}

TEST(SsdTier, PutGetEraseWithinCapacity) {
  ScratchDir dir("tier");
  ExerciseTier([&](uint64_t cap) { return std::move(SsdTier::Open(dir.path(), cap)).value(); });
}

TEST(SsdTier, SurvivesReopenAndDropsInterruptedWrites) {
  ScratchDir dir("reopen");
  {
    auto tier = std::move(SsdTier::Open(dir.path(), 1 << 20)).value();
    ASSERT_TRUE(tier->Put("k1", "hello").ok());
  }
  // A save killed midway leaves only its temporary file behind.
  { std::ofstream(dir.path() + "/k2.kv.tmp") << "partial"; }
  auto tier = std::move(SsdTier::Open(dir.path(), 1 << 20)).value();
  EXPECT_EQ(tier->removed_temp_files(), 1);
  EXPECT_TRUE(tier->Contains("k1"));
  EXPECT_FALSE(tier->Contains("k2"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/k2.kv.tmp"));
  EXPECT_EQ(*tier->Get("k1"), "hello");
  EXPECT_EQ(tier->bytes(), 5u);
}

TEST(SsdTier, LargeValuesUseParallelChunkedIo) {
  ScratchDir dir("large");
  auto tier = std::move(SsdTier::Open(dir.path(), 64 << 20)).value();
  std::string big(20 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 13);
  ASSERT_TRUE(tier->Put("big", big).ok());
  EXPECT_EQ(std::filesystem::file_size(tier->PathOf("big")), big.size());
  auto back = tier->Get("big");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == big);
}

// GetShared reads with O_DIRECT (where the file system allows it) into an aligned store
// buffer: sizes that are not a multiple of the 4096-byte unit, small and split across
// the I/O threads, read back exactly.
TEST(SsdTier, SharedReadsAreAlignedAndExactAtAnySize) {
  ScratchDir dir("direct");
  auto tier = std::move(SsdTier::Open(dir.path(), 64 << 20)).value();
  for (size_t n : {size_t{1}, size_t{4095}, size_t{4097}, size_t{(9 << 20) + 123}}) {
    std::string v(n, '\0');
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i + n) * 2654435761u >> 11);
    const std::string key = "v" + std::to_string(n);
    ASSERT_TRUE(tier->Put(key, v).ok());
    auto back = tier->GetShared(key);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ((*back)->size(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*back)->data()) % Bytes::kAlign, 0u);
    EXPECT_TRUE((*back)->view() == v) << n;
  }
}

TEST(Bytes, AlignedAndLargeBuffersAreRecycled) {
  const size_t n = (6 << 20) + 5;
  auto a = Bytes::Allocate(n);
  EXPECT_EQ(a->size(), n);
  const size_t capacity = a->capacity();
  EXPECT_GE(capacity, n);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % Bytes::kAlign, 0u);
  const size_t pooled = Bytes::PooledBytes();
  a.reset();
  EXPECT_EQ(Bytes::PooledBytes(), pooled + capacity);  // freed into the pool
  auto b = Bytes::Allocate(n + 1000);                    // a similar size is taken from it
  EXPECT_LT(Bytes::PooledBytes(), pooled + capacity);
  auto c = CopyBytes("hello");
  EXPECT_EQ(c->view(), "hello");
}

// Takes everything on the (process-wide) free list out of the way, for tests that count
// its bytes; nullptr when it is empty.
std::unique_ptr<Bytes> TakeWholePool() {
  return Bytes::PooledBytes() > 0 ? Bytes::Allocate(Bytes::PooledBytes()) : nullptr;
}

// A pooled buffer that does not fit is grown, or split, in place of a fresh mapping: the
// result is aligned, writable over its whole capacity, and keeps the pooled pages.
TEST(Bytes, PooledBuffersAreGrownAndShrunkToFit) {
  auto fill = [](Bytes& b, char c) {
    std::memset(b.data(), c, b.capacity());
    EXPECT_EQ(b.data()[0], c);
    EXPECT_EQ(b.data()[b.capacity() - 1], c);
  };
  const std::unique_ptr<Bytes> drain = TakeWholePool();  // what earlier tests left pooled
  ASSERT_EQ(Bytes::PooledBytes(), 0u);
  auto a = Bytes::Allocate(size_t{8} << 20);
  fill(*a, 1);
  const size_t before = Bytes::PooledBytes();
  a.reset();
  ASSERT_EQ(Bytes::PooledBytes(), before + (size_t{8} << 20));
  auto grown = Bytes::Allocate((size_t{20} << 20) + 7);  // no pooled buffer within a quarter
  EXPECT_EQ(Bytes::PooledBytes(), before);               // the 8 MiB one was grown
  EXPECT_EQ(grown->capacity(), size_t{22} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(grown->data()) % Bytes::kAlign, 0u);
  EXPECT_EQ(grown->data()[0], 1);  // its pages were kept
  fill(*grown, 2);
  grown.reset();
  auto head = Bytes::Allocate(size_t{6} << 20);  // only a larger one: it is split
  EXPECT_EQ(Bytes::PooledBytes(), before + (size_t{16} << 20));  // its tail stays pooled
  EXPECT_EQ(head->capacity(), size_t{6} << 20);
  EXPECT_EQ(head->data()[0], 2);  // pages of the pooled buffer, not fresh ones
  auto tail = Bytes::Allocate(size_t{16} << 20);  // the tail serves the next request whole
  EXPECT_EQ(Bytes::PooledBytes(), before);
  EXPECT_EQ(tail->data()[0], 2);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tail->data()) % Bytes::kAlign, 0u);
  fill(*head, 3);
  fill(*tail, 4);
  head.reset();
  tail.reset();  // both pieces go back to the pool and unmap cleanly
  EXPECT_EQ(Bytes::PooledBytes(), before + (size_t{22} << 20));
}

// Smaller pooled buffers are gathered into one range for a larger request: their pages,
// in order, then fresh ones for the rest.
TEST(Bytes, PooledBuffersAreGatheredForALargerRequest) {
  const std::unique_ptr<Bytes> drain = TakeWholePool();  // what earlier tests left pooled
  ASSERT_EQ(Bytes::PooledBytes(), 0u);
  auto a = Bytes::Allocate(size_t{4} << 20);
  auto b = Bytes::Allocate(size_t{6} << 20);
  std::memset(a->data(), 5, a->capacity());
  std::memset(b->data(), 6, b->capacity());
  const size_t before = Bytes::PooledBytes();
  a.reset();
  b.reset();
  ASSERT_EQ(Bytes::PooledBytes(), before + (size_t{10} << 20));
  auto big = Bytes::Allocate((size_t{14} << 20) + 3);
  EXPECT_EQ(Bytes::PooledBytes(), before);  // both taken
  ASSERT_EQ(big->capacity(), size_t{16} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big->data()) % Bytes::kAlign, 0u);
  // The larger piece comes first, then the smaller one, then new (zeroed) pages.
  EXPECT_EQ(big->data()[0], 6);
  EXPECT_EQ(big->data()[(size_t{6} << 20) - 1], 6);
  EXPECT_EQ(big->data()[size_t{6} << 20], 5);
  EXPECT_EQ(big->data()[(size_t{10} << 20) - 1], 5);
  EXPECT_EQ(big->data()[size_t{10} << 20], 0);
  std::memset(big->data(), 7, big->capacity());
  big.reset();
  EXPECT_EQ(Bytes::PooledBytes(), before + (size_t{16} << 20));
}

// Page faults taken by this thread so far.
long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// A reservation faults its pages in up front: a buffer taken from them and written all
// over takes (almost) no page fault, where fresh pages would take one per 2 MiB at least.
// Freed buffers stay pooled up to the reservation (beyond kPoolBytes), and the pool
// shrinks back when the reservation goes.
TEST(Bytes, ReservedPagesAreFaultedInUpFrontAndKeptWhileReserved) {
  Bytes::ReleasePooled();  // what earlier tests left pooled
  ASSERT_EQ(Bytes::PooledBytes(), 0u);
  const size_t mib = size_t{1} << 20, reserve = Bytes::kPoolBytes + 64 * mib;
  uint64_t reported = 0, total = 0;
  auto r = Bytes::Reserve(reserve - mib + 1, [&](uint64_t done, uint64_t t) {
    EXPECT_GT(done, reported);
    reported = done;
    total = t;
  });
  EXPECT_EQ(r->bytes(), reserve);  // whole 2 MiB pages
  EXPECT_EQ(Bytes::PooledBytes(), reserve);
  EXPECT_EQ(reported, reserve);
  EXPECT_EQ(total, reserve);

  const long before = MinorFaults();
  std::vector<std::unique_ptr<Bytes>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(Bytes::Allocate(reserve / 4 - 5));
    std::memset(held.back()->data(), i, held.back()->capacity());
  }
  // Fresh pages: >= reserve / 2 MiB faults (huge pages), 512x that with 4 KiB pages.
  EXPECT_LT(MinorFaults() - before, 16) << "the reserved pages were not faulted in";
  EXPECT_EQ(Bytes::PooledBytes(), 0u);
  held.clear();  // all of it goes back: the reservation allows it, kPoolBytes alone would not
  EXPECT_EQ(Bytes::PooledBytes(), reserve);

  r.reset();  // back to kPoolBytes at most
  EXPECT_LE(Bytes::PooledBytes(), Bytes::kPoolBytes);
  EXPECT_GT(Bytes::PooledBytes(), 0u);
}

// Allocated buffers count against the reservation: the pool keeps only what the
// reservation leaves beside them (or kPoolBytes, whichever is more).
TEST(Bytes, AllocatedBuffersCountAgainstTheReservation) {
  Bytes::ReleasePooled();
  ASSERT_EQ(Bytes::PooledBytes(), 0u);
  const size_t mib = size_t{1} << 20;
  std::vector<std::unique_ptr<Bytes>> live;
  for (int i = 0; i < 3; ++i) live.push_back(Bytes::Allocate(128 * mib));  // 384 MiB live
  auto r = Bytes::Reserve(512 * mib);
  EXPECT_EQ(Bytes::PooledBytes(), 128 * mib);  // only what the live buffers leave
  std::vector<std::unique_ptr<Bytes>> more;
  for (int i = 0; i < 3; ++i) more.push_back(Bytes::Allocate(128 * mib));  // 640 MiB live
  more.clear();
  live.clear();  // 768 MiB freed: the pool keeps max(kPoolBytes, 512 MiB)
  EXPECT_EQ(Bytes::PooledBytes(), std::max(Bytes::kPoolBytes, 512 * mib));
}

}  // namespace
}  // namespace attic::store
