#include "attic/kv/block_pool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace attic::kv {
namespace {

KvShape Shape() {
  KvShape s;
  s.n_layers = 2;
  s.n_kv_heads = 3;
  s.head_dim = 4;
  s.block_size = 4;
  return s;
}

TEST(BlockPool, AllocatesAndFreesWithinCapacity) {
  BlockPool pool(Shape(), 3);
  EXPECT_EQ(pool.n_free(), 3);
  auto a = pool.Allocate(), b = pool.Allocate(), c = pool.Allocate();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(pool.Allocate().status().code(), StatusCode::kResourceExhausted);
  pool.Free(*b);
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_TRUE(pool.Allocate().ok());
}

TEST(BlockPool, BudgetBoundsBlocks) {
  KvShape s = Shape();
  EXPECT_EQ(BlockPool::BlocksForBudget(s, s.block_bytes() * 5 + 7), 5);
  EXPECT_EQ(BlockPool::BlocksForBudget(s, 1), 1);
}

TEST(SequenceKv, WriteReadRoundTripAcrossBlocksAndTruncate) {
  BlockPool pool(Shape(), 8);
  SequenceKv seq(&pool);
  const int n = 11, kvd = Shape().kv_dim();
  std::vector<int32_t> tok(n), pos(n);
  for (int i = 0; i < n; ++i) tok[i] = 100 + i, pos[i] = i;
  ASSERT_TRUE(seq.Append(tok.data(), pos.data(), n).ok());
  EXPECT_EQ(seq.block_table().size(), 3u);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> k(n * kvd), v(n * kvd);
  for (auto& x : k) x = u(rng);
  for (auto& x : v) x = u(rng);
  for (int l = 0; l < 2; ++l) seq.WriteKv(l, 0, n, k.data(), v.data());
  std::vector<float> k2(n * kvd), v2(n * kvd);
  seq.ReadKv(1, 0, n, k2.data(), v2.data());
  EXPECT_EQ(k, k2);
  EXPECT_EQ(v, v2);
  // Slot 5 (block 1, row 1), head 2 lives where the layout comment says.
  const float* kb = reinterpret_cast<const float*>(pool.k_block_bytes(1, seq.block_table()[1]));
  EXPECT_EQ(kb[(2 * 4 + 1) * 4 + 3], k[5 * kvd + 2 * 4 + 3]);
  seq.Truncate(4);
  EXPECT_EQ(seq.n_slots(), 4);
  EXPECT_EQ(seq.block_table().size(), 1u);
  EXPECT_EQ(pool.n_free(), 7);
  seq.Release();
  EXPECT_EQ(pool.n_free(), 8);
}

TEST(BlockPool, F16HalvesTheBytesAndRoundsLikeTheScalarConversion) {
  KvShape s = Shape();
  const int64_t f32_bytes = s.block_bytes();
  s.dtype = DType::kF16;
  EXPECT_EQ(s.block_bytes() * 2, f32_bytes);
  BlockPool pool(s, 4);
  SequenceKv seq(&pool);
  const int n = 7, kvd = s.kv_dim();
  std::vector<int32_t> tok(n, 1), pos(n);
  for (int i = 0; i < n; ++i) pos[i] = i;
  ASSERT_TRUE(seq.Append(tok.data(), pos.data(), n).ok());
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-300, 300);
  std::vector<float> k(n * kvd), v(n * kvd);
  for (auto& x : k) x = u(rng);
  for (auto& x : v) x = u(rng);
  k[3] = 1e-6f;   // f16 subnormal
  v[4] = 1e5f;    // overflows f16 to inf
  seq.WriteKv(0, 0, n, k.data(), v.data());
  std::vector<float> k2(n * kvd), v2(n * kvd);
  seq.ReadKv(0, 0, n, k2.data(), v2.data());
  for (int i = 0; i < n * kvd; ++i) {
    ASSERT_EQ(k2[i], F16ToF32(F32ToF16(k[i]))) << i;
    ASSERT_EQ(v2[i], F16ToF32(F32ToF16(v[i]))) << i;
  }
  EXPECT_TRUE(std::isinf(v2[4]));
  // Slot 5 (block 1, row 1), head 2 as f16 where the layout comment says.
  const uint16_t* kb = reinterpret_cast<const uint16_t*>(pool.k_block_bytes(0, seq.block_table()[1]));
  EXPECT_EQ(kb[(2 * 4 + 1) * 4 + 3], F32ToF16(k[5 * kvd + 2 * 4 + 3]));
}

TEST(SequenceKv, AppendIsAllOrNothingWhenFull) {
  BlockPool pool(Shape(), 2);
  SequenceKv seq(&pool);
  std::vector<int32_t> t(9, 1), p(9, 0);
  EXPECT_EQ(seq.Append(t.data(), p.data(), 9).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(seq.n_slots(), 0);
  EXPECT_EQ(pool.n_free(), 2);
}

TEST(SequenceKv, ReleasedBlocksReturnToThePoolAndTheSlotsStay) {
  BlockPool pool(Shape(), 4);
  SequenceKv seq(&pool);
  std::vector<int32_t> t(12), p(12);
  for (int i = 0; i < 12; ++i) t[i] = 100 + i, p[i] = i;
  ASSERT_TRUE(seq.Append(t.data(), p.data(), 12).ok());  // block_size 4: 3 blocks
  ASSERT_EQ(pool.n_free(), 1);
  seq.ReleaseBlock(1);
  seq.ReleaseBlock(1);  // twice: no-op
  EXPECT_EQ(pool.n_free(), 2);
  EXPECT_FALSE(seq.resident(1));
  EXPECT_TRUE(seq.resident(0) && seq.resident(2));
  EXPECT_EQ(seq.block_table()[1], SequenceKv::kNoBlock);
  EXPECT_EQ(seq.n_resident_blocks(), 2);
  EXPECT_EQ(seq.n_slots(), 12);
  EXPECT_EQ(seq.tokens()[5], 105);
  // Appending still takes new blocks at the end; truncating and releasing free only what is held.
  ASSERT_TRUE(seq.Append(t.data(), p.data(), 4).ok());
  EXPECT_EQ(pool.n_free(), 1);
  seq.Truncate(6);  // keeps blocks 0 and 1 (released)
  EXPECT_EQ(pool.n_free(), 3);
  seq.Release();
  EXPECT_EQ(pool.n_free(), 4);
}

}  // namespace
}  // namespace attic::kv
