#include "attic/store/tier.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <vector>

#include "store/store_test_util.h"

namespace attic::store {
namespace {

using testing::ScratchDir;

// An entry key of model `fingerprint` named by `name` (the only keys an SSD tier takes).
std::string K(const std::string& name, const std::string& fingerprint = "fp-A") {
  EntryKey k;
  k.tenant = "default";
  k.fingerprint = fingerprint;
  k.token_hash = std::hash<std::string>()(name);
  k.session_id = name;
  return k.ToString();
}

template <typename MakeTier>
void ExerciseTier(MakeTier make) {
  auto tier = make(100);
  EXPECT_EQ(tier->bytes(), 0u);
  ASSERT_TRUE(tier->Put(K("a"), std::string(60, 'a')).ok());
  EXPECT_TRUE(tier->Contains(K("a")));
  EXPECT_EQ(tier->SizeOf(K("a")), 60);
  EXPECT_EQ(tier->Put(K("b"), std::string(41, 'b')).code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(tier->Contains(K("b")));
  ASSERT_TRUE(tier->Put(K("b"), std::string(40, 'b')).ok());
  EXPECT_EQ(tier->bytes(), 100u);
  // Replacing counts only the difference.
  ASSERT_TRUE(tier->Put(K("a"), std::string(50, 'A')).ok());
  EXPECT_EQ(tier->bytes(), 90u);
  EXPECT_EQ(*tier->Get(K("a")), std::string(50, 'A'));
  EXPECT_EQ(tier->Get(K("zz")).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(tier->Erase(K("a")).ok());
  ASSERT_TRUE(tier->Erase(K("a")).ok());
  EXPECT_EQ(tier->bytes(), 40u);
  EXPECT_EQ(tier->Keys(), std::vector<std::string>{K("b")});
  EXPECT_LE(tier->bytes(), tier->capacity());
}

TEST(DramTier, PutGetEraseWithinCapacity) {
  ExerciseTier([](uint64_t cap) { return std::make_unique<DramTier>(cap); });
}

TEST(SsdTier, PutGetEraseWithinCapacity) {
  ScratchDir dir("tier");
  ExerciseTier([&](uint64_t cap) { return std::move(SsdTier::Open(dir.path(), "fp-A", cap)).value(); });
}

TEST(SsdTier, SurvivesReopenAndDropsInterruptedWrites) {
  ScratchDir dir("reopen");
  {
    auto tier = std::move(SsdTier::Open(dir.path(), "fp-A", 1 << 20)).value();
    ASSERT_TRUE(tier->Put(K("k1"), "hello").ok());
  }
  // A save killed midway leaves only its temporary file behind.
  const std::string tmp = SsdTier::ModelDir(dir.path(), "fp-A") + "/" + K("k2") + ".kv.tmp";
  { std::ofstream(tmp) << "partial"; }
  auto tier = std::move(SsdTier::Open(dir.path(), "fp-A", 1 << 20)).value();
  EXPECT_EQ(tier->removed_temp_files(), 1);
  EXPECT_TRUE(tier->Contains(K("k1")));
  EXPECT_FALSE(tier->Contains(K("k2")));
  EXPECT_FALSE(std::filesystem::exists(tmp));
  EXPECT_EQ(*tier->Get(K("k1")), "hello");
  EXPECT_EQ(tier->bytes(), 5u);
}

TEST(SsdTier, LargeValuesUseParallelChunkedIo) {
  ScratchDir dir("large");
  auto tier = std::move(SsdTier::Open(dir.path(), "fp-A", 64 << 20)).value();
  std::string big(20 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 13);
  ASSERT_TRUE(tier->Put(K("big"), big).ok());
  EXPECT_EQ(std::filesystem::file_size(tier->PathOf(K("big"))), big.size());
  auto back = tier->Get(K("big"));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == big);
}

// GetShared reads with O_DIRECT (where the file system allows it) into an aligned store
// buffer: sizes that are not a multiple of the 4096-byte unit, small and split across
// the I/O threads, read back exactly.
TEST(SsdTier, SharedReadsAreAlignedAndExactAtAnySize) {
  ScratchDir dir("direct");
  auto tier = std::move(SsdTier::Open(dir.path(), "fp-A", 64 << 20)).value();
  for (size_t n : {size_t{1}, size_t{4095}, size_t{4097}, size_t{(9 << 20) + 123}}) {
    std::string v(n, '\0');
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i + n) * 2654435761u >> 11);
    const std::string key = K("v" + std::to_string(n));
    ASSERT_TRUE(tier->Put(key, v).ok());
    auto back = tier->GetShared(key);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ((*back)->size(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*back)->data()) % Bytes::kAlign, 0u);
    EXPECT_TRUE((*back)->view() == v) << n;
  }
}

// Every file and directory under `dir`, by relative path, with a regular file's bytes.
std::map<std::string, std::string> Tree(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& de : std::filesystem::recursive_directory_iterator(dir)) {
    std::string bytes = "<dir>";
    if (de.is_symlink()) {
      bytes = "<link>";
    } else if (de.is_regular_file()) {
      std::ifstream in(de.path(), std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    out[std::filesystem::relative(de.path(), dir).string()] = bytes;
  }
  return out;
}

void Write(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The tier reads, writes and removes only entry files of its own model in its own
// subdirectory: files Attic did not write -- in the store directory, in the model's
// subdirectory, named like temporary files or entries, or links -- and another model's
// entries and writes in progress stay as they were; they are counted (and warned about).
TEST(SsdTier, TouchesOnlyItsOwnModelsEntryFiles) {
  ScratchDir dir("own");
  const std::string mine = SsdTier::ModelDir(dir.path(), "fp-A"), theirs = SsdTier::ModelDir(dir.path(), "fp-B");
  {
    auto b = std::move(SsdTier::Open(dir.path(), "fp-B", 1 << 20)).value();
    ASSERT_TRUE(b->Put(K("b1", "fp-B"), "model B's entry").ok());
    auto a = std::move(SsdTier::Open(dir.path(), "fp-A", 1 << 20)).value();
    ASSERT_TRUE(a->Put(K("a1"), "model A's entry").ok());
  }
  Write(dir.path() + "/notes.txt", "notes");
  Write(dir.path() + "/data.tmp", "user data");
  Write(dir.path() + "/" + K("x") + ".kv", "an entry's name, outside any model directory");
  Write(dir.path() + "/sub/a.kv", "a");
  Write(mine + "/readme.txt", "mine?");
  Write(mine + "/x.kv.tmp", "not an entry key");
  Write(mine + "/" + K("b2", "fp-B") + ".kv", "model B's name in model A's directory");
  Write(mine + "/" + K("a9") + ".kv.bak", "a backup");
  std::filesystem::create_directory_symlink(dir.path() + "/sub", mine + "/" + K("a8") + ".kv");
  Write(theirs + "/" + K("b3", "fp-B") + ".kv.tmp", "model B's write in progress");
  Write(theirs + "/" + "b-notes.txt", "in B's directory");
  Write(mine + "/" + K("a2") + ".kv.tmp", "A's interrupted write");
  auto before = Tree(dir.path());
  before.erase(std::filesystem::relative(mine + "/" + K("a2") + ".kv.tmp", dir.path()).string());

  auto tier = SsdTier::Open(dir.path(), "fp-A", 1 << 20);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  const SsdScan& scan = (*tier)->scan();
  EXPECT_FALSE(scan.created);
  EXPECT_EQ(scan.dir, mine);
  EXPECT_EQ(scan.removed_temp_files, 1u);
  EXPECT_EQ(scan.other_models, 1u);
  EXPECT_EQ(scan.other_model_entries, 1u);
  EXPECT_EQ(scan.other_model_bytes, std::string("model B's entry").size());
  // notes.txt, data.tmp, <key>.kv, sub/ at the top; b-notes.txt in B's directory;
  // readme.txt, x.kv.tmp, B's name, the .bak and the link in A's.
  EXPECT_EQ(scan.foreign, 10u);
  EXPECT_FALSE(scan.foreign_example.empty());
  EXPECT_EQ((*tier)->Keys(), std::vector<std::string>{K("a1")});
  EXPECT_EQ((*tier)->bytes(), std::string("model A's entry").size());
  EXPECT_EQ(Tree(dir.path()), before);

  // Keys that are not this model's entry keys are refused, and touch nothing.
  EXPECT_EQ((*tier)->Put(K("b1", "fp-B"), "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*tier)->Put("../notes.txt", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*tier)->Erase("../notes").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*tier)->Erase(K("b2", "fp-B")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*tier)->Get("../" + FingerprintTag("fp-B") + "/" + K("b1", "fp-B")).status().code(),
            StatusCode::kNotFound);
  // Writes and removals of its own entries leave everything else alone.
  ASSERT_TRUE((*tier)->Put(K("a3"), "new").ok());
  ASSERT_TRUE((*tier)->Erase(K("a1")).ok());
  auto after = Tree(dir.path());
  before.erase(std::filesystem::relative((*tier)->PathOf(K("a1")), dir.path()).string());
  after.erase(std::filesystem::relative((*tier)->PathOf(K("a3")), dir.path()).string());
  EXPECT_EQ(after, before);
}

// A directory that is not empty and carries no marker is somebody else's: refused, and
// left exactly as it was (no marker, no model directory). So is one marked by a newer
// Attic, or whose marker is not Attic's.
TEST(SsdTier, RefusesADirectoryThatIsNotAnAtticStore) {
  ScratchDir dir("refuse");
  Write(dir.path() + "/notes.txt", "notes");
  Write(dir.path() + "/" + K("x") + ".kv", "an old flat layout or a look-alike");
  const auto before = Tree(dir.path());
  auto tier = SsdTier::Open(dir.path(), "fp-A", 1 << 20);
  ASSERT_EQ(tier.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(tier.status().message().find(SsdTier::kMarkerName), std::string::npos) << tier.status().ToString();
  EXPECT_NE(tier.status().message().find("empty or new directory"), std::string::npos) << tier.status().ToString();
  EXPECT_EQ(Tree(dir.path()), before);

  Write(dir.path() + "/" + SsdTier::kMarkerName, "attic-kv-store 2\n");
  const auto newer = Tree(dir.path());
  tier = SsdTier::Open(dir.path(), "fp-A", 1 << 20);
  ASSERT_EQ(tier.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(tier.status().message().find("newer Attic (store format 2"), std::string::npos) << tier.status().ToString();
  EXPECT_EQ(Tree(dir.path()), newer);

  Write(dir.path() + "/" + SsdTier::kMarkerName, "something else entirely\n");
  const auto garbled = Tree(dir.path());
  tier = SsdTier::Open(dir.path(), "fp-A", 1 << 20);
  ASSERT_EQ(tier.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(tier.status().message().find("not an Attic store marker"), std::string::npos) << tier.status().ToString();
  EXPECT_EQ(Tree(dir.path()), garbled);

  Write(dir.path() + "/file", "x");
  tier = SsdTier::Open(dir.path() + "/file", "fp-A", 1 << 20);
  EXPECT_EQ(tier.status().code(), StatusCode::kFailedPrecondition);
}

// A new directory, an empty one, or one holding only a fresh file system's lost+found
// becomes a store: the marker (with the format version) and the model's directory.
TEST(SsdTier, MakesANewOrEmptyDirectoryAStore) {
  ScratchDir dir("adopt");
  for (const std::string sub : {"new/deeper", "empty", "fresh-fs"}) {
    const std::string root = dir.path() + "/" + sub;
    if (sub == "empty") std::filesystem::create_directories(root);
    if (sub == "fresh-fs") std::filesystem::create_directories(root + "/lost+found");
    auto tier = SsdTier::Open(root, "fp-A", 1 << 20);
    ASSERT_TRUE(tier.ok()) << sub << ": " << tier.status().ToString();
    EXPECT_TRUE((*tier)->scan().created) << sub;
    EXPECT_EQ((*tier)->scan().foreign, 0u) << sub;
    std::ifstream in(root + "/" + SsdTier::kMarkerName);
    std::string first;
    std::getline(in, first);
    EXPECT_EQ(first, "attic-kv-store 1");
    EXPECT_TRUE(std::filesystem::is_directory(SsdTier::ModelDir(root, "fp-A")));
    // Reopened: the same store, not a new one.
    tier->reset();
    tier = SsdTier::Open(root, "fp-A", 1 << 20);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    EXPECT_FALSE((*tier)->scan().created);
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

#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define ATTIC_TIER_TEST_SHADOW 1
#endif
#endif
#if defined(ATTIC_TIER_TEST_SHADOW) || defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kShadowSanitizer = true;
#else
constexpr bool kShadowSanitizer = false;
#endif

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
  // Under ASan or TSan the count says nothing: the sanitizer's shadow of the pages (1/8 of
  // them for ASan, several times them for TSan) is mapped on first use, and those faults
  // are the process's too (measured: 10,242 under ASan, 164,177 under TSan).
  if (!kShadowSanitizer) {
    EXPECT_LT(MinorFaults() - before, 16) << "the reserved pages were not faulted in";
  }
  EXPECT_EQ(Bytes::PooledBytes(), 0u);
  held.clear();  // all of it goes back: the reservation allows it, kPoolBytes alone would not
  EXPECT_EQ(Bytes::PooledBytes(), reserve);

  r.reset();  // back to kPoolBytes at most
  EXPECT_LE(Bytes::PooledBytes(), Bytes::kPoolBytes);
  EXPECT_GT(Bytes::PooledBytes(), 0u);
}

// An on-demand reservation faults nothing in: the pool holds only pages that were used
// (fresh pages when first allocated), but keeps them up to the reservation once freed,
// and shrinks back when the reservation goes, as Reserve's does.
TEST(Bytes, OnDemandReservationFaultsInOnlyWhatIsUsed) {
  Bytes::ReleasePooled();
  ASSERT_EQ(Bytes::PooledBytes(), 0u);
  const size_t mib = size_t{1} << 20, reserve = Bytes::kPoolBytes + 64 * mib;
  auto r = Bytes::ReserveOnDemand(reserve - mib + 1);
  EXPECT_EQ(r->bytes(), reserve);  // whole 2 MiB pages
  EXPECT_EQ(Bytes::PooledBytes(), 0u) << "an on-demand reservation faulted pages in";

  const long before = MinorFaults();
  std::vector<std::unique_ptr<Bytes>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(Bytes::Allocate(reserve / 4 - 5));
    std::memset(held.back()->data(), i, held.back()->capacity());
  }
  // Fresh pages: at least one fault per 2 MiB (huge pages).
  EXPECT_GE(MinorFaults() - before, static_cast<long>(reserve / (2 * mib) / 2)) << "the pages were there before use";
  held.clear();  // all of it stays pooled: the reservation allows it, kPoolBytes alone would not
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
