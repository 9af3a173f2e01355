#include "attic/kv/block_pool.h"

#include <gtest/gtest.h>

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
  const float* kb = pool.k_block(1, seq.block_table()[1]);
  EXPECT_EQ(kb[(2 * 4 + 1) * 4 + 3], k[5 * kvd + 2 * 4 + 3]);
  seq.Truncate(4);
  EXPECT_EQ(seq.n_slots(), 4);
  EXPECT_EQ(seq.block_table().size(), 1u);
  EXPECT_EQ(pool.n_free(), 7);
  seq.Release();
  EXPECT_EQ(pool.n_free(), 8);
}

TEST(SequenceKv, AppendIsAllOrNothingWhenFull) {
  BlockPool pool(Shape(), 2);
  SequenceKv seq(&pool);
  std::vector<int32_t> t(9, 1), p(9, 0);
  EXPECT_EQ(seq.Append(t.data(), p.data(), 9).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(seq.n_slots(), 0);
  EXPECT_EQ(pool.n_free(), 2);
}

}  // namespace
}  // namespace attic::kv
