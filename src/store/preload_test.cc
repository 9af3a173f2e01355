// The preload strategies alone: a job entered into a small BlockPool by each.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <tuple>
#include <cstring>
#include <mutex>
#include <vector>

#include "attic/attention/rope.h"
#include "attic/backend/thread_pool.h"
#include "attic/kv/block_pool.h"
#include "attic/store/kv_loader.h"
#include "attic/tensor/dtype.h"
#include "store/store_test_util.h"

namespace attic::store {
namespace {

constexpr int kLayers = 3, kHeads = 2, kHeadDim = 4, kBlock = 4, kRows = 10;
constexpr int kFirstPosition = 5;  // rows enter at positions 5.., so K is rotated

kv::KvShape Shape() {
  kv::KvShape s;
  s.n_layers = kLayers;
  s.n_kv_heads = kHeads;
  s.head_dim = kHeadDim;
  s.block_size = kBlock;
  return s;
}

// A stored entry of kRows rows, serialized and verified as the store hands it out.
std::shared_ptr<const KvSource> Source() {
  std::vector<int32_t> tokens(kRows);
  for (int i = 0; i < kRows; ++i) tokens[i] = 100 + i;
  KvEntry e = testing::MakeEntry(tokens, "s", "default", kLayers, kHeads * kHeadDim);
  auto bytes = SerializeEntryBytes(e);
  EXPECT_TRUE(bytes.ok());
  SharedBytes shared(std::move(bytes).value());
  auto header = VerifyEntry(*shared, "fp-A");
  EXPECT_TRUE(header.ok());
  return KvSource::Stored(shared, std::move(header).value(), e.key().ToString());
}

struct Fixture {
  kv::BlockPool pool{Shape(), 8};
  attention::RopeTable rope{kHeadDim, 10000.0f, model::RopeScaling{}, 64};
  backend::ThreadPool threads{2};
  std::shared_ptr<const KvSource> source = Source();
  std::vector<int32_t> blocks;

  std::shared_ptr<LoadJob> Job() {
    blocks.clear();
    for (int b = 0; b < (kRows + kBlock - 1) / kBlock; ++b) blocks.push_back(*pool.Allocate());
    auto job = std::make_shared<LoadJob>();
    job->segments = {LoadSegment{source, 0, kRows, 0}};
    job->blocks = blocks;
    for (int i = 0; i < kRows; ++i) job->positions.push_back(kFirstPosition + i);
    return job;
  }
  // Layer l's K and V as the pool holds them, [kRows, kv_dim] each.
  std::vector<float> Read(int l) {
    std::vector<float> k(kRows * kHeads * kHeadDim), v(k.size());
    pool.ReadRows(l, blocks.data(), 0, kRows, k.data(), v.data());
    k.insert(k.end(), v.begin(), v.end());
    return k;
  }
  // What layer l must hold: V as stored, K rotated to the slots' positions.
  std::vector<float> Expected(int l) {
    const KvSource::Layer src = source->layer(l);
    const int kvd = kHeads * kHeadDim;
    std::vector<float> k(src.K(0), src.K(0) + kRows * kvd), v(src.V(0), src.V(0) + kRows * kvd);
    std::vector<int32_t> pos;
    for (int i = 0; i < kRows; ++i) pos.push_back(kFirstPosition + i);
    rope.Apply(k.data(), kRows, kHeads, pos.data());
    k.insert(k.end(), v.begin(), v.end());
    return k;
  }
  bool Untouched(int l) {
    for (float x : Read(l))
      if (x != 0) return false;
    return true;
  }
};

void ExpectNear(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5f) << what << " at " << i;
}

TEST(Preload, EveryModeEntersTheSameBytes) {
  std::vector<std::vector<float>> first;
  for (Preload mode : {Preload::kSync, Preload::kLayerwise, Preload::kInline}) {
    Fixture f;
    KvLoader loader(f.pool, f.rope);
    auto job = f.Job();
    const PreloadStrategy& strategy = PreloadFor(mode);
    EXPECT_EQ(strategy.mode(), mode);
    strategy.Start(loader, job, f.threads);
    job->WaitAll();
    ASSERT_TRUE(job->done());
    for (int l = 0; l < kLayers; ++l) {
      std::vector<float> got = f.Read(l);
      ExpectNear(got, f.Expected(l), "layer");
      // V is entered unchanged: bit for bit the stored rows.
      const KvSource::Layer src = f.source->layer(l);
      EXPECT_EQ(std::memcmp(got.data() + got.size() / 2, src.v, got.size() / 2 * sizeof(float)), 0);
      if (mode == Preload::kSync) {
        first.push_back(got);
      } else {
        EXPECT_EQ(got, first[l]) << "layer " << l << " differs from sync entering";
      }
    }
  }
}

TEST(Preload, SyncEntersEverythingBeforeStartReturns) {
  Fixture f;
  KvLoader loader(f.pool, f.rope);
  auto job = f.Job();
  SyncPreload().Start(loader, job, f.threads);
  EXPECT_EQ(job->layers_done.load(), kLayers);
  EXPECT_EQ(job->WaitLayer(0), 0.0);
  ExpectNear(f.Read(kLayers - 1), f.Expected(kLayers - 1), "last layer");
}

TEST(Preload, InlineEntersEachLayerWhenItIsWaitedFor) {
  Fixture f;
  KvLoader loader(f.pool, f.rope);
  auto job = f.Job();
  InlinePreload().Start(loader, job, f.threads);
  EXPECT_EQ(job->layers_done.load(), 0);
  for (int l = 0; l < kLayers; ++l) EXPECT_TRUE(f.Untouched(l)) << l;
  job->WaitLayer(0);
  EXPECT_EQ(job->layers_done.load(), 1);
  ExpectNear(f.Read(0), f.Expected(0), "layer 0");
  EXPECT_TRUE(f.Untouched(1));  // not before the forward reaches it
  job->WaitLayer(2);
  EXPECT_EQ(job->layers_done.load(), 3);
  ExpectNear(f.Read(1), f.Expected(1), "layer 1");
  ExpectNear(f.Read(2), f.Expected(2), "layer 2");
}

TEST(Preload, LayerwiseEntersOnTheLoaderThreadInLayerOrder) {
  Fixture f;
  KvLoader loader(f.pool, f.rope);
  // Hold the loader thread in a read-buffer fetch: the job waits for it.
  std::mutex mu;
  std::condition_variable cv;
  bool busy = false, release = false;
  loader.Stage([&] {
    std::unique_lock<std::mutex> lock(mu);
    busy = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return busy; });
  }
  auto job = f.Job();
  LayerwisePreload().Start(loader, job, f.threads);
  EXPECT_EQ(job->layers_done.load(), 0);  // Start returned without entering anything
  for (int l = 0; l < kLayers; ++l) EXPECT_TRUE(f.Untouched(l)) << l;
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  // Each WaitLayer(l) returns with layer l (and those before it) entered.
  for (int l = 0; l < kLayers; ++l) {
    job->WaitLayer(l);
    EXPECT_GT(job->layers_done.load(), l);
    for (int m = 0; m <= l; ++m) ExpectNear(f.Read(m), f.Expected(m), "entered layer");
  }
  EXPECT_TRUE(job->done());
}

// Enters rows [src_row, src_row + n) of `source` into slots [0, n) (positions
// kFirstPosition + 2i, so K is rotated) of a pool of each of `buffers`' types (default:
// every compute-buffer type), in every preload mode: `setup(job)` before the load starts
// (the turn's copy), `check(buffer, job, pool, rope)` once it is done.
template <class Setup, class Check>
void EnterIntoEveryBuffer(const std::shared_ptr<const KvSource>& source, int src_row, int n, Setup setup,
                          Check check,
                          std::vector<DType> buffers = {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_0}) {
  for (DType buffer : buffers) {
    for (Preload mode : {Preload::kSync, Preload::kLayerwise, Preload::kInline}) {
      SCOPED_TRACE(std::string(DTypeName(buffer)) + " buffer, mode " + std::to_string(static_cast<int>(mode)));
      kv::KvShape shape = Shape();
      shape.set_dtype(buffer);
      kv::BlockPool pool(shape, 8);
      attention::RopeTable rope{kHeadDim, 10000.0f, model::RopeScaling{}, 64};
      backend::ThreadPool threads{2};
      KvLoader loader(pool, rope);
      std::vector<int32_t> blocks;
      for (int b = 0; b < (n + kBlock - 1) / kBlock; ++b) blocks.push_back(*pool.Allocate());
      auto job = std::make_shared<LoadJob>();
      job->segments = {LoadSegment{source, src_row, n, 0}};
      job->blocks = blocks;
      for (int i = 0; i < n; ++i) job->positions.push_back(kFirstPosition + 2 * i);
      setup(*job);
      PreloadFor(mode).Start(loader, job, threads);
      job->WaitAll();
      ASSERT_FALSE(job->failed());
      check(buffer, *job, pool, rope);
    }
  }
}

// An f16 entry into an f16 compute buffer, by every mode and into slots other than its
// rows (a truncation's kept rows): each K element is the half nearest to RoPE (at the
// slot's position) of the stored halves widened to f32; V is the stored halves, bit for
// bit. The reference is built with the scalar conversions and RopeTable::Apply.
TEST(Preload, F16EntryEntersAnF16BufferAsItsRotatedHalves) {
  const int kvd = kHeads * kHeadDim;
  std::vector<int32_t> tokens(kRows);
  for (int i = 0; i < kRows; ++i) tokens[i] = 100 + i;
  KvEntry e = testing::MakeEntry(tokens, "s", "default", kLayers, kvd);
  e.dtype = KvDtype::kF16;
  e.k16.resize(kLayers);
  e.v16.resize(kLayers);
  for (int l = 0; l < kLayers; ++l)
    for (size_t i = 0; i < e.k[l].size(); ++i) {
      e.k16[l].push_back(F32ToF16(4 * e.k[l][i]));
      e.v16[l].push_back(F32ToF16(e.v[l][i]));
    }
  e.k.clear();
  e.v.clear();
  SharedBytes shared(std::move(*SerializeEntryBytes(e)));
  auto header = VerifyEntry(*shared, "fp-A");
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  auto source = KvSource::Stored(shared, *header, e.key().ToString());
  const int src_row = 3, n = kRows - src_row;  // rows [3, 10) into slots [0, 7)
  std::vector<std::vector<uint16_t>> copy_k, copy_v;
  EnterIntoEveryBuffer(
      source, src_row, n,
      [&](LoadJob& job) {
        copy_k.assign(kLayers, {});
        copy_v.assign(kLayers, {});
        job.copy_k16 = &copy_k;
        job.copy_v16 = &copy_v;
      },
      [&](DType, const LoadJob& job, const kv::BlockPool& pool, const attention::RopeTable& rope) {
        for (int l = 0; l < kLayers; ++l) {
          std::vector<float> k(n * kvd), v(n * kvd);
          for (int i = 0; i < n * kvd; ++i) {
            k[i] = F16ToF32(e.k16[l][src_row * kvd + i]);
            v[i] = F16ToF32(e.v16[l][src_row * kvd + i]);
          }
          rope.Apply(k.data(), n, kHeads, job.positions.data());
          for (float& x : k) x = F16ToF32(F32ToF16(x));
          std::vector<float> got_k(n * kvd), got_v(n * kvd);
          pool.ReadRows(l, job.blocks.data(), 0, n, got_k.data(), got_v.data());
          EXPECT_EQ(got_k, k) << "layer " << l;
          EXPECT_EQ(got_v, v) << "layer " << l;
          // The pre-RoPE copy the turn saves: the stored halves of the rows, in slot order.
          EXPECT_EQ(copy_k[l], std::vector<uint16_t>(e.k16[l].begin() + src_row * kvd, e.k16[l].end())) << l;
          EXPECT_EQ(copy_v[l], std::vector<uint16_t>(e.v16[l].begin() + src_row * kvd, e.v16[l].end())) << l;
        }
      },
      {DType::kF16});
}

// Layer l's rows of `job` as the `buffer` pool holds them, against the reference's
// dequantized rows (k rotated to the slots' positions, v). Tolerances, from the arithmetic
// each step adds to the dequantized values:
//   f32 buffer: V exact (a copy of an exact f32); K only RoPE's f32 rounding (1e-5, as
//     EveryModeEntersTheSameBytes).
//   f16 buffer: one f16 rounding, |x - f16(x)| <= 2^-11 |x| (normal halves; these values
//     are far above f16's subnormals), plus K's RoPE rounding.
//   q8_0 buffer: one more quantization of the row's group, |x - d q| <= d / 2 with d =
//     f16(max|x| / 127) <= max|x| / 127 * (1 + 2^-11) (kv_q8.h), plus the f32 rounding of
//     x / d (2^-24 |x| relative, so d * 2^-24 * 127 at most) and K's RoPE rounding.
//   q4_0 buffer: one more q4_0 quantization of the group, |x - read(x)| <= |d'| (1 +
//     2^-7) with |d'| = |f16(m / -8)| <= max|x| / 8 (1 + 2^-11) (kv_q4.h), max|x| taken
//     with K's RoPE rounding added, plus that rounding.
void ExpectEnteredWithin(DType buffer, int group, const kv::BlockPool& pool, const LoadJob& job, int l,
                         const std::vector<float>& k, const std::vector<float>& v) {
  const int n = static_cast<int>(job.positions.size()), kvd = kHeads * kHeadDim;
  std::vector<float> got_k(n * kvd), got_v(n * kvd);
  pool.ReadRows(l, job.blocks.data(), 0, n, got_k.data(), got_v.data());
  for (const auto& [want, got, is_k] : {std::tuple{&k, &got_k, true}, std::tuple{&v, &got_v, false}}) {
    for (int i = 0; i < n * kvd; ++i) {
      const double x = (*want)[i], rope_err = is_k ? 1e-5 : 0.0;
      double tol = rope_err;
      if (buffer == DType::kF16) tol += std::ldexp(std::fabs(x), -11);
      const int g0 = i / group * group;
      double amax = 0;
      for (int j = g0; j < g0 + group; ++j) amax = std::max(amax, std::fabs(static_cast<double>((*want)[j])));
      if (buffer == DType::kQ8_0) {
        const double d = amax / 127 * (1 + std::ldexp(1.0, -11));
        tol += d / 2 + d * 127 * std::ldexp(1.0, -24);
      }
      if (buffer == DType::kQ4_0) tol += (amax + rope_err) / 8 * (1 + std::ldexp(1.0, -11)) * (1 + std::ldexp(1.0, -7));
      ASSERT_LE(std::fabs((*got)[i] - x), tol) << (is_k ? "K" : "V") << " layer " << l << " at " << i;
    }
  }
}

// A quantized entry (q8_0, q4_0, q8_0/q4_0) enters every compute-buffer type: each stored row
// dequantized (the reference decodes the bytes itself, from entry.h's layout: an int8, or
// a 4-bit code minus 8, times the group's f16 scale, in double), K rotated to the slot's
// position (RopeTable::Apply, the reference the other preload tests use), then written
// in the buffer's type, within ExpectEnteredWithin's tolerances. The pre-RoPE copy the
// turn saves is the stored bytes, in slot order.
void QuantizedEntryEntersEveryBufferType(KvDtype etype) {
  const int kvd = kHeads * kHeadDim, group = attention::KvQ8Group(kHeadDim);
  // K's and V's row types (q8_0/q4_0: K q8_0, V q4_0) and row bytes.
  const KvDtype kt = etype == KvDtype::kQ4_0 ? KvDtype::kQ4_0 : KvDtype::kQ8_0;
  const KvDtype vt = etype == KvDtype::kQ8_0 ? KvDtype::kQ8_0 : KvDtype::kQ4_0;
  const size_t krow = KvRowBytes(kt, kvd, group), vrow = KvRowBytes(vt, kvd, group);
  std::vector<int32_t> tokens(kRows);
  for (int i = 0; i < kRows; ++i) tokens[i] = 100 + i;
  KvEntry e = testing::MakeEntry(tokens, "s", "default", kLayers, kvd);
  e.dtype = etype;
  e.group = group;
  e.kq.resize(kLayers);
  e.vq.resize(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    e.kq[l].resize(kRows * krow);
    e.vq[l].resize(kRows * vrow);
    for (int r = 0; r < kRows; ++r) {
      std::vector<float> k4(e.k[l].begin() + r * kvd, e.k[l].begin() + (r + 1) * kvd);
      for (float& x : k4) x *= 4;  // K larger than V, as a model's is
      QuantizeRow(kt, k4.data(), kvd, group, e.kq[l].data() + r * krow);
      QuantizeRow(vt, e.v[l].data() + r * kvd, kvd, group, e.vq[l].data() + r * vrow);
    }
  }
  e.k.clear();
  e.v.clear();
  SharedBytes shared(std::move(*SerializeEntryBytes(e)));
  auto header = VerifyEntry(*shared, "fp-A");
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  auto source = KvSource::Stored(shared, *header, e.key().ToString());
  // Row r of a layer, decoded from its bytes: q8_0, kvd int8 values then the scales; q4_0,
  // kvd / 2 bytes of codes (group g's at [g * group / 2, ...): byte b its value b in the
  // low nibble, value b + group / 2 in the high one), then the scales.
  auto decode = [&](const std::vector<uint8_t>& layer, KvDtype type, int r, float* out) {
    const uint8_t* p = layer.data() + r * (type == kt ? krow : vrow);
    const int scales_at = type == KvDtype::kQ4_0 ? kvd / 2 : kvd;
    for (int j = 0; j < kvd; ++j) {
      const int jg = j / group, in = j % group;
      const uint16_t scale = static_cast<uint16_t>(p[scales_at + 2 * jg] | (p[scales_at + 2 * jg + 1] << 8));
      int q;
      if (type == KvDtype::kQ4_0) {
        const uint8_t byte = p[jg * group / 2 + in % (group / 2)];
        q = (in < group / 2 ? byte & 15 : byte >> 4) - 8;
      } else {
        q = static_cast<int8_t>(p[j]);
      }
      out[j] = static_cast<float>(static_cast<double>(F16ToF32(scale)) * q);
    }
  };
  const int src_row = 3, n = kRows - src_row;  // rows [3, 10) into slots [0, 7)
  std::vector<std::vector<uint8_t>> copy_k, copy_v;
  EnterIntoEveryBuffer(
      source, src_row, n,
      [&](LoadJob& job) {
        copy_k.assign(kLayers, {});
        copy_v.assign(kLayers, {});
        job.copy_kq = &copy_k;
        job.copy_vq = &copy_v;
      },
      [&](DType buffer, const LoadJob& job, const kv::BlockPool& pool, const attention::RopeTable& rope) {
        EXPECT_EQ(job.stored_bytes(), 1ull * kLayers * n * (krow + vrow));
        for (int l = 0; l < kLayers; ++l) {
          std::vector<float> k(n * kvd), v(n * kvd);
          for (int i = 0; i < n; ++i) {
            decode(e.kq[l], kt, src_row + i, k.data() + i * kvd);
            decode(e.vq[l], vt, src_row + i, v.data() + i * kvd);
          }
          rope.Apply(k.data(), n, kHeads, job.positions.data());
          ExpectEnteredWithin(buffer, group, pool, job, l, k, v);
          EXPECT_EQ(copy_k[l], std::vector<uint8_t>(e.kq[l].begin() + src_row * krow, e.kq[l].end())) << l;
          EXPECT_EQ(copy_v[l], std::vector<uint8_t>(e.vq[l].begin() + src_row * vrow, e.vq[l].end())) << l;
        }
      });
}

// A kivi4 entry (K per channel over groups of tokens, V q4_0) enters every compute-buffer
// type. Its K groups: rows [0, 6) a stored entry's (the entry's base), rows [6, 10) its own,
// so two groups. The reference decodes K from the serialized bytes itself (entry.h's
// layout: the channel's 4-bit code times its group's f16 scale plus its f16 minimum, in
// double) and V as q4_0, rotates K as the other tests do; ExpectEnteredWithin's tolerances
// (the buffer's rounding or quantization of the dequantized values, K's RoPE rounding).
// The turn's pre-RoPE copy: K as f32, the decoded rows exactly; V's rows by bytes.
TEST(Preload, Kivi4EntryEntersEveryBufferType) {
  const int kvd = kHeads * kHeadDim, group = attention::KvQ8Group(kHeadDim);
  const size_t vrow = KvRowBytes(KvDtype::kQ4_0, kvd, group);
  std::vector<int32_t> tokens(kRows);
  for (int i = 0; i < kRows; ++i) tokens[i] = 100 + i;
  KvEntry full = testing::MakeEntry(tokens, "s", "default", kLayers, kvd);
  full.dtype = KvDtype::kKivi4;
  full.group = group;
  full.vq.resize(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    for (float& x : full.k[l]) x *= 4;  // K larger than V, as a model's is
    full.vq[l].resize(kRows * vrow);
    for (int r = 0; r < kRows; ++r)
      QuantizeRow(KvDtype::kQ4_0, full.v[l].data() + r * kvd, kvd, group, full.vq[l].data() + r * vrow);
  }
  full.v.clear();
  KvEntry head = full;
  head.TruncateTo(6);
  SharedBytes head_bytes(std::move(*SerializeEntryBytes(head)));
  KvEntry e = full;
  e.base = EntryRowsBase(head_bytes, *VerifyEntry(*head_bytes, "fp-A"), 6);
  for (int l = 0; l < kLayers; ++l) {
    e.k[l].erase(e.k[l].begin(), e.k[l].begin() + 6 * kvd);
    e.vq[l].erase(e.vq[l].begin(), e.vq[l].begin() + 6 * vrow);
  }
  SharedBytes shared(std::move(*SerializeEntryBytes(e)));
  auto header = VerifyEntry(*shared, "fp-A");
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  ASSERT_EQ(header->k_group_ends, (std::vector<int32_t>{6, kRows}));
  auto source = KvSource::Stored(shared, *header, e.key().ToString());
  auto f16_at = [&](size_t at) {
    const auto* p = reinterpret_cast<const uint8_t*>(shared->data()) + at;
    return static_cast<double>(F16ToF32(static_cast<uint16_t>(p[0] | p[1] << 8)));
  };
  // K row r of layer l from the bytes: codes (channel c: byte c / 2, low nibble for even
  // c), then per group kvd scales and kvd minimums.
  auto decode_k = [&](int l, int r, float* out) {
    const size_t layer = EntryLayerOffset(*header, l), g = r < 6 ? 0 : 1;
    const auto* codes = reinterpret_cast<const uint8_t*>(shared->data()) + layer + r * kvd / 2;
    const size_t params = layer + kRows * kvd / 2 + g * 4 * kvd;
    for (int c = 0; c < kvd; ++c) {
      const int code = (codes[c / 2] >> (c % 2 * 4)) & 15;
      out[c] = static_cast<float>(f16_at(params + 2 * (kvd + c)) + f16_at(params + 2 * c) * code);
    }
  };
  auto decode_v = [&](int l, int r, float* out) {
    const uint8_t* p = full.vq[l].data() + r * vrow;
    for (int j = 0; j < kvd; ++j) {
      const int jg = j / group, in = j % group;
      const uint16_t scale = static_cast<uint16_t>(p[kvd / 2 + 2 * jg] | (p[kvd / 2 + 2 * jg + 1] << 8));
      const uint8_t byte = p[jg * group / 2 + in % (group / 2)];
      out[j] = static_cast<float>(static_cast<double>(F16ToF32(scale)) * ((in < group / 2 ? byte & 15 : byte >> 4) - 8));
    }
  };
  const int src_row = 3, n = kRows - src_row;  // rows [3, 10) into slots [0, 7): both groups
  std::vector<std::vector<float>> copy_k;
  std::vector<std::vector<uint8_t>> copy_v;
  EnterIntoEveryBuffer(
      source, src_row, n,
      [&](LoadJob& job) {
        copy_k.assign(kLayers, {});
        copy_v.assign(kLayers, {});
        job.copy_k = &copy_k;
        job.copy_vq = &copy_v;
      },
      [&](DType buffer, const LoadJob& job, const kv::BlockPool& pool, const attention::RopeTable& rope) {
        for (int l = 0; l < kLayers; ++l) {
          std::vector<float> k(n * kvd), v(n * kvd);
          for (int i = 0; i < n; ++i) {
            decode_k(l, src_row + i, k.data() + i * kvd);
            decode_v(l, src_row + i, v.data() + i * kvd);
          }
          EXPECT_EQ(copy_k[l], k) << l;  // pre-RoPE, as decoded
          EXPECT_EQ(copy_v[l], std::vector<uint8_t>(full.vq[l].begin() + src_row * vrow, full.vq[l].end())) << l;
          rope.Apply(k.data(), n, kHeads, job.positions.data());
          ExpectEnteredWithin(buffer, group, pool, job, l, k, v);
        }
      });
}

TEST(Preload, QuantizedEntryEntersEveryBufferType) {
  for (KvDtype etype : {KvDtype::kQ8_0, KvDtype::kQ4_0, KvDtype::kQ8_0Q4_0}) {
    SCOPED_TRACE(std::string(KvDtypeName(etype)) + " entry");
    QuantizedEntryEntersEveryBufferType(etype);
  }
}

}  // namespace
}  // namespace attic::store
