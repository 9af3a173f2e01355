#include "attic/kv/block_pool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attic/attention/kv_q4.h"
#include "attic/attention/kv_q8.h"
#include "attic/attention/rope.h"
#include "attic/kv/enter_rows.h"
#include "attic/tensor/dtype.h"

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
  KvShape s = Shape();  // f32: 3 heads x 4 rows x 4 values x 4 bytes = 192 bytes per layer's K (V) per block
  ASSERT_EQ(s.k_layer_bytes(), 192);
  // Each of the 2 layers' K and V buffers starts at a 4 KiB boundary, so any pool maps at
  // least 4 pages; 5 blocks' 3,840 bytes (plus 7) are under that: the one-block minimum.
  EXPECT_EQ(BlockPool::BlocksForBudget(s, s.block_bytes() * 5 + 7), 1);
  EXPECT_EQ(BlockPool::BlocksForBudget(s, 1), 1);
  // 4 pages hold 21 blocks per buffer (21 x 192 = 4,032 <= 4,096; 22 x 192 = 4,224).
  EXPECT_EQ(BlockPool::BlocksForBudget(s, 4 * 4096), 21);
  EXPECT_EQ(BlockPool::BlocksForBudget(s, 4 * 4096 - 1), 1);
  EXPECT_EQ(BlockPool::BlocksForBudget(s, 8 * 4096), 42);
}

// What a pool maps, read from where its buffers start: each layer's K, then its V, then
// the next layer's K (the constructor's layout), so n_layers times the distance from layer
// 0's K to layer 1's.
uint64_t FootprintOf(BlockPool& pool) {
  const int64_t layer_stride = pool.k_block_bytes(1, 0) - pool.k_block_bytes(0, 0);
  return static_cast<uint64_t>(pool.shape().n_layers) * static_cast<uint64_t>(layer_stride);
}

TEST(BlockPool, TheMappingStaysWithinTheBudgetForEveryKvType) {
  // SmolLM2-135M's KV shape (30 layers, 3 KV heads of 64) in 128-token blocks: q8_0 and
  // q4_0 rows carry f16 scales, so a block's layer bytes are no multiple of 4 KiB and
  // each buffer's last page is partly empty.
  KvShape s = Shape();  // 3 KV heads
  s.n_layers = 30;
  s.head_dim = 64;
  s.block_size = 128;
  const std::pair<DType, DType> types[] = {{DType::kF32, DType::kF32},   {DType::kF16, DType::kF16},
                                           {DType::kQ8_0, DType::kQ8_0}, {DType::kQ4_0, DType::kQ4_0},
                                           {DType::kQ8_0, DType::kQ4_0}, {DType::kF16, DType::kQ4_0}};
  for (const auto& [kt, vt] : types) {
    s.k_dtype = kt;
    s.v_dtype = vt;
    // f32: 2-6 blocks of 5.9 MB; q4_0: 15-50 of 0.83 MB.
    for (int64_t budget : {(int64_t{12} << 20) + 12345, int64_t{24} << 20, (int64_t{40} << 20) - 1}) {
      SCOPED_TRACE(std::string(DTypeName(kt)) + "/" + DTypeName(vt) + " budget " + std::to_string(budget));
      const int n = BlockPool::BlocksForBudget(s, budget);
      ASSERT_GE(n, 1);
      BlockPool pool(s, n);
      EXPECT_LE(FootprintOf(pool), static_cast<uint64_t>(budget));
      EXPECT_EQ(pool.mapped_bytes(), FootprintOf(pool));
      // And the largest such pool: one block more would not fit.
      BlockPool bigger(s, n + 1);
      EXPECT_GT(FootprintOf(bigger), static_cast<uint64_t>(budget));
    }
  }
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
  s.set_dtype(DType::kF16);
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

TEST(BlockPool, Q8BlocksHoldInt8ValuesThenTheirScalesAndRoundTripWithinHalfAStep) {
  KvShape s = Shape();
  s.head_dim = 64;  // two groups of 32 per row
  s.set_dtype(DType::kQ8_0);
  // 3 heads x 4 rows x 64 values = 768 int8, then 3 x 4 x 2 f16 scales = 48 bytes.
  EXPECT_EQ(s.k_layer_bytes(), 768 + 48);
  EXPECT_EQ(s.v_layer_bytes(), 768 + 48);
  EXPECT_EQ(s.scales_offset(DType::kQ8_0), 768);
  // Each buffer's 5 x 816 = 4,080 bytes fit one 4 KiB page (6 blocks' would not).
  EXPECT_EQ(BlockPool::BlocksForBudget(s, 4 * 4096), 5);
  BlockPool pool(s, 6);
  SequenceKv seq(&pool);
  const int n = 9, kvd = s.kv_dim();
  std::vector<int32_t> tokens(n), positions(n);
  ASSERT_TRUE(seq.Append(tokens.data(), positions.data(), n).ok());
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> k(static_cast<size_t>(n) * kvd), v(k.size()), k2(k.size()), v2(k.size());
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  seq.WriteKv(1, 0, n, k.data(), v.data());
  seq.ReadKv(1, 0, n, k2.data(), v2.data());
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < s.n_kv_heads; ++h) {
      const size_t row = static_cast<size_t>(i) * kvd + h * s.head_dim;
      // What the pool holds is what the row quantizer writes, bit for bit.
      std::vector<int8_t> q(s.head_dim);
      uint16_t scales[2];
      attention::QuantizeKvRowQ8(&k[row], s.head_dim, q.data(), scales);
      const int8_t* stored = reinterpret_cast<const int8_t*>(pool.k_slot_bytes(1, seq.block_table().data(), i)) +
                             h * s.head_stride();
      const uint16_t* stored_scales = pool.k_slot_q8_scales(1, seq.block_table().data(), i) + h * s.head_stride() / 32;
      EXPECT_EQ(std::vector<int8_t>(stored, stored + s.head_dim), q) << "slot " << i << " head " << h;
      EXPECT_EQ(stored_scales[0], scales[0]);
      EXPECT_EQ(stored_scales[1], scales[1]);
      // Within half a step of its group, plus the f32 rounding of x / step before the
      // rounding to an integer (<= 127 * 2^-24 steps) and of the difference (2^-24).
      uint16_t v_scales[2];
      attention::QuantizeKvRowQ8(&v[row], s.head_dim, q.data(), v_scales);
      for (int t = 0; t < s.head_dim; ++t) {
        const double k_step = F16ToF32(scales[t / 32]), v_step = F16ToF32(v_scales[t / 32]);
        EXPECT_LE(std::abs(k2[row + t] - k[row + t]), (0.5 + 127 * 0x1p-24) * k_step * (1 + 0x1p-24));
        EXPECT_LE(std::abs(v2[row + t] - v[row + t]), (0.5 + 127 * 0x1p-24) * v_step * (1 + 0x1p-24));
      }
    }
  }
  // A copied block carries its scales.
  auto dst = pool.Allocate();
  ASSERT_TRUE(dst.ok());
  pool.CopyBlock(*dst, seq.block_table()[0]);
  std::vector<float> k3(static_cast<size_t>(s.block_size) * kvd), v3(k3.size());
  pool.ReadRows(1, &*dst, 0, s.block_size, k3.data(), v3.data());
  EXPECT_EQ(std::vector<float>(k2.begin(), k2.begin() + k3.size()), k3);
  EXPECT_EQ(std::vector<float>(v2.begin(), v2.begin() + v3.size()), v3);
}

TEST(BlockPool, Q4BlocksHoldHalfByteCodesThenTheirScalesAndRoundTripWithinAStep) {
  KvShape s = Shape();
  s.head_dim = 64;  // two groups of 32 per row
  s.k_dtype = DType::kQ4_0;
  s.v_dtype = DType::kQ8_0;
  // K: 3 heads x 4 rows x 64 values = 384 bytes of codes, then 3 x 4 x 2 f16 scales.
  EXPECT_EQ(s.k_layer_bytes(), 384 + 48);
  EXPECT_EQ(s.v_layer_bytes(), 768 + 48);
  EXPECT_EQ(s.scales_offset(DType::kQ4_0), 384);
  BlockPool pool(s, 6);
  SequenceKv seq(&pool);
  const int n = 9, kvd = s.kv_dim();
  std::vector<int32_t> tokens(n), positions(n);
  ASSERT_TRUE(seq.Append(tokens.data(), positions.data(), n).ok());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> k(static_cast<size_t>(n) * kvd), v(k.size()), k2(k.size()), v2(k.size());
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  seq.WriteKv(1, 0, n, k.data(), v.data());
  seq.ReadKv(1, 0, n, k2.data(), v2.data());
  const int32_t* blocks = seq.block_table().data();
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < s.n_kv_heads; ++h) {
      const size_t row = static_cast<size_t>(i) * kvd + h * s.head_dim;
      // The pool holds the row quantizer's bytes: head h's codes head_stride() / 2 bytes
      // after head 0's, its scales head_stride() / 32 scales after head 0's.
      std::vector<uint8_t> q(s.head_dim / 2);
      uint16_t scales[2];
      attention::QuantizeKvRowQ4(&k[row], s.head_dim, q.data(), scales);
      const uint8_t* stored = pool.k_slot_bytes(1, blocks, i) + h * s.head_stride() / 2;
      const uint16_t* stored_scales = pool.k_slot_q8_scales(1, blocks, i) + h * s.head_stride() / 32;
      EXPECT_EQ(std::vector<uint8_t>(stored, stored + s.head_dim / 2), q) << "slot " << i << " head " << h;
      EXPECT_EQ(stored_scales[0], scales[0]);
      EXPECT_EQ(stored_scales[1], scales[1]);
      // kv_q4.h's bound: a step, plus the f16 rounding of the scale over 8 steps.
      for (int t = 0; t < s.head_dim; ++t) {
        EXPECT_LE(std::abs(k2[row + t] - k[row + t]), std::abs(F16ToF32(scales[t / 32])) * (1 + 1.0 / 128));
      }
    }
  }
  // V (q8_0) beside a q4_0 K reads back as a q8_0 pool's V.
  KvShape q8 = s;
  q8.set_dtype(DType::kQ8_0);
  BlockPool pool8(q8, 6);
  SequenceKv seq8(&pool8);
  ASSERT_TRUE(seq8.Append(tokens.data(), positions.data(), n).ok());
  seq8.WriteKv(1, 0, n, k.data(), v.data());
  std::vector<float> k8(k.size()), v8(k.size());
  seq8.ReadKv(1, 0, n, k8.data(), v8.data());
  EXPECT_EQ(v2, v8);
  // A copied block carries its codes and scales.
  auto dst = pool.Allocate();
  ASSERT_TRUE(dst.ok());
  pool.CopyBlock(*dst, blocks[1]);
  std::vector<float> k3(static_cast<size_t>(s.block_size) * kvd), v3(k3.size());
  pool.ReadRows(1, &*dst, 0, s.block_size, k3.data(), v3.data());
  const size_t at = static_cast<size_t>(s.block_size) * kvd;
  EXPECT_EQ(std::vector<float>(k2.begin() + at, k2.begin() + 2 * at), k3);
  EXPECT_EQ(std::vector<float>(v2.begin() + at, v2.begin() + 2 * at), v3);
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


// The value K element i of `slot` in `layer` gets from WriteTagged (V: its negation).
float Tag(float tag, int layer, int slot, int i) { return tag + 1000 * layer + 10 * slot + 0.01f * i; }

// Fills slots [first, first + n) of every layer with values that name (layer, slot, i),
// so that a read shows whose rows a block holds.
void WriteTagged(SequenceKv& seq, int first, int n, float tag) {
  const int kvd = Shape().kv_dim();
  std::vector<float> k(n * kvd), v(n * kvd);
  for (int l = 0; l < Shape().n_layers; ++l) {
    for (int s = 0; s < n; ++s)
      for (int i = 0; i < kvd; ++i) {
        k[s * kvd + i] = Tag(tag, l, first + s, i);
        v[s * kvd + i] = -k[s * kvd + i];
      }
    seq.WriteKv(l, first, n, k.data(), v.data());
  }
}

float ReadK(const SequenceKv& seq, int layer, int slot, int i) {
  const int kvd = Shape().kv_dim();
  std::vector<float> k(kvd), v(kvd);
  seq.ReadKv(layer, slot, 1, k.data(), v.data());
  return k[i];
}

TEST(SequenceKv, ForkSharesBlocksAndCountsThemOnce) {
  BlockPool pool(Shape(), 8);
  SequenceKv a(&pool);
  std::vector<int32_t> t(6), p(6);
  for (int i = 0; i < 6; ++i) t[i] = 100 + i, p[i] = i;
  ASSERT_TRUE(a.Append(t.data(), p.data(), 6).ok());  // block_size 4: a full block and a half-full one
  WriteTagged(a, 0, 6, 0);
  ASSERT_EQ(pool.n_used(), 2);
  std::unique_ptr<SequenceKv> b = a.Fork();
  std::unique_ptr<SequenceKv> c = a.Fork();
  // Same slots, same blocks; the pool still has 2 blocks in use (a shared block counts once).
  EXPECT_EQ(b->tokens(), a.tokens());
  EXPECT_EQ(b->positions(), a.positions());
  EXPECT_EQ(b->block_table(), a.block_table());
  EXPECT_EQ(pool.n_used(), 2);
  EXPECT_EQ(pool.n_free(), 6);
  EXPECT_EQ(pool.refs(a.block_table()[0]), 3);
  EXPECT_EQ(a.n_exclusive_blocks(), 0);
  EXPECT_EQ(ReadK(*c, 1, 5, 2), Tag(0, 1, 5, 2));
  // Releasing owners frees a shared block only with the last one.
  c->Release();
  b->Release();
  EXPECT_EQ(pool.n_used(), 2);
  EXPECT_EQ(a.n_exclusive_blocks(), 2);
  EXPECT_EQ(ReadK(a, 0, 4, 1), Tag(0, 0, 4, 1));
  a.Release();
  EXPECT_EQ(pool.n_free(), 8);
}

TEST(SequenceKv, AppendCopiesASharedPartialBlockBeforeWritingIntoIt) {
  BlockPool pool(Shape(), 8);
  SequenceKv a(&pool);
  std::vector<int32_t> t(6), p(6);
  for (int i = 0; i < 6; ++i) t[i] = 100 + i, p[i] = i;
  ASSERT_TRUE(a.Append(t.data(), p.data(), 6).ok());
  WriteTagged(a, 0, 6, 0);
  std::unique_ptr<SequenceKv> b = a.Fork();
  const int32_t full = a.block_table()[0], tail = a.block_table()[1];
  EXPECT_EQ(a.n_pending_copies(), 1);
  EXPECT_EQ(b->BlocksToAppend(1), 1);  // the copy, no new block
  EXPECT_EQ(b->BlocksToAppend(3), 2);  // the copy and one more block
  // b writes slot 6: its tail becomes a private copy holding slots 4, 5 as they were.
  int32_t t6 = 7, p6 = 6;
  ASSERT_TRUE(b->Append(&t6, &p6, 1).ok());
  WriteTagged(*b, 6, 1, 500);
  EXPECT_EQ(b->block_table()[0], full);
  EXPECT_NE(b->block_table()[1], tail);
  EXPECT_EQ(pool.n_used(), 3);
  EXPECT_EQ(pool.refs(full), 2);
  EXPECT_EQ(pool.refs(tail), 1);
  EXPECT_EQ(a.n_pending_copies(), 0);  // a is the tail's last owner: it writes in place
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(ReadK(*b, l, 5, 3), Tag(0, l, 5, 3));
    EXPECT_EQ(ReadK(*b, l, 4, 0), Tag(0, l, 4, 0));
    EXPECT_EQ(ReadK(*b, l, 6, 0), Tag(500, l, 6, 0));
  }
  // a writes its own slot 6 in its (now unshared) tail, in place: b's rows are untouched.
  ASSERT_TRUE(a.Append(&t6, &p6, 1).ok());
  WriteTagged(a, 6, 1, 900);
  EXPECT_EQ(a.block_table()[1], tail);
  EXPECT_EQ(pool.n_used(), 3);
  EXPECT_EQ(ReadK(a, 1, 6, 0), Tag(900, 1, 6, 0));
  EXPECT_EQ(ReadK(*b, 1, 6, 0), Tag(500, 1, 6, 0));
  // A fork of a sequence whose last block is full shares everything and copies nothing.
  SequenceKv d(&pool);
  ASSERT_TRUE(d.Append(t.data(), p.data(), 4).ok());
  std::unique_ptr<SequenceKv> e = d.Fork();
  EXPECT_EQ(e->n_pending_copies(), 0);
  EXPECT_EQ(e->BlocksToAppend(1), 1);
  const int used = pool.n_used();
  ASSERT_TRUE(e->Append(&t6, &p6, 1).ok());
  EXPECT_EQ(pool.n_used(), used + 1);
  EXPECT_EQ(e->block_table()[0], d.block_table()[0]);
}

TEST(SequenceKv, CopyOnWriteIsAllOrNothingWhenFull) {
  BlockPool pool(Shape(), 2);
  SequenceKv a(&pool);
  std::vector<int32_t> t(6, 1), p(6, 0);
  ASSERT_TRUE(a.Append(t.data(), p.data(), 6).ok());
  std::unique_ptr<SequenceKv> b = a.Fork();
  // No free block for the copy: nothing changes.
  EXPECT_EQ(b->Append(t.data(), p.data(), 1).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(b->n_slots(), 6);
  EXPECT_EQ(b->block_table(), a.block_table());
  EXPECT_EQ(pool.refs(a.block_table()[1]), 2);
  // Truncating one owner back into a shared block keeps the block for the other.
  b->Truncate(2);
  EXPECT_EQ(b->block_table().size(), 1u);
  EXPECT_EQ(pool.refs(a.block_table()[1]), 1);
  EXPECT_EQ(pool.n_free(), 0);
  a.Release();
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_EQ(b->n_exclusive_blocks(), 1);
  b->Release();
  EXPECT_EQ(pool.n_free(), 2);
}

}  // namespace
}  // namespace attic::kv

namespace attic::kv {
namespace {

// K and V of different types: each tensor holds, bit for bit, what a pool of its own type
// alone holds for the same rows (written, read back, copied with a block, and entered
// pre-RoPE through EnterRotatedRows), and the pool's bytes are the two types' sum.
TEST(BlockPool, KAndVOfDifferentTypesEachHoldWhatTheirOwnTypeHolds) {
  const DType types[] = {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_0};
  constexpr int kTypes = 4;
  KvShape s = Shape();
  s.head_dim = 32;  // one q8_0 group per row
  const int n = 9, kvd = s.kv_dim();
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> k(static_cast<size_t>(n) * kvd), v(k.size());
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  std::vector<int32_t> tokens(n), positions(n);
  for (int i = 0; i < n; ++i) positions[i] = 3 * i;
  const attention::RopeTable rope{s.head_dim, 10000.0f, model::RopeScaling{}, 64};
  // What one-type pools hold, by type: rows read back after WriteKv, and after entering.
  struct Held {
    std::vector<float> k, v, k_entered, v_entered;
  };
  auto fill = [&](KvShape shape, Held* held) {
    BlockPool pool(shape, 8);
    SequenceKv seq(&pool);
    EXPECT_TRUE(seq.Append(tokens.data(), positions.data(), n).ok());
    seq.WriteKv(1, 0, n, k.data(), v.data());
    held->k.resize(k.size());
    held->v.resize(k.size());
    seq.ReadKv(1, 0, n, held->k.data(), held->v.data());
    EnterRotatedRows(
        pool, rope, 0, seq.block_table().data(), 0, n, positions.data(),
        [&](int slot) { return k.data() + static_cast<size_t>(slot) * kvd; },
        [&](int slot) { return v.data() + static_cast<size_t>(slot) * kvd; });
    held->k_entered.resize(k.size());
    held->v_entered.resize(k.size());
    seq.ReadKv(0, 0, n, held->k_entered.data(), held->v_entered.data());
    // A copied block carries both tensors (and q8_0's scales).
    auto dst = pool.Allocate();
    EXPECT_TRUE(dst.ok());
    pool.CopyBlock(*dst, seq.block_table()[1]);
    std::vector<float> kc(static_cast<size_t>(shape.block_size) * kvd), vc(kc.size());
    pool.ReadRows(1, &*dst, 0, shape.block_size, kc.data(), vc.data());
    const size_t at = static_cast<size_t>(shape.block_size) * kvd;
    EXPECT_EQ(kc, std::vector<float>(held->k.begin() + at, held->k.begin() + 2 * at));
    EXPECT_EQ(vc, std::vector<float>(held->v.begin() + at, held->v.begin() + 2 * at));
  };
  Held one[kTypes];
  for (int t = 0; t < kTypes; ++t) {
    KvShape shape = s;
    shape.set_dtype(types[t]);
    fill(shape, &one[t]);
  }
  for (int kt = 0; kt < kTypes; ++kt) {
    for (int vt = 0; vt < kTypes; ++vt) {
      if (kt == vt) continue;
      SCOPED_TRACE(std::string("K ") + DTypeName(types[kt]) + ", V " + DTypeName(types[vt]));
      KvShape shape = s;
      shape.k_dtype = types[kt];
      shape.v_dtype = types[vt];
      KvShape k_only = s, v_only = s;
      k_only.set_dtype(types[kt]);
      v_only.set_dtype(types[vt]);
      EXPECT_EQ(shape.block_bytes() * 2, k_only.block_bytes() + v_only.block_bytes());
      Held mixed;
      fill(shape, &mixed);
      EXPECT_EQ(mixed.k, one[kt].k);
      EXPECT_EQ(mixed.v, one[vt].v);
      EXPECT_EQ(mixed.k_entered, one[kt].k_entered);
      EXPECT_EQ(mixed.v_entered, one[vt].v_entered);
    }
  }
}

}  // namespace
}  // namespace attic::kv
