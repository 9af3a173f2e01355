// Rotary position embedding at arbitrary positions (HF "rotate half" layout: dimension
// i pairs with i + head_dim/2). Positions are per token, so KV that re-enters the
// compute buffer can be rotated to whatever position it now has.
//
// Numerics match Hugging Face transformers in float32: inv_freq = 1 / theta^(2i/d) in f32,
// angle = f32(position) * inv_freq in f32, then cos/sin of that f32 angle (computed in
// double and rounded, i.e. within half an ulp of torch's f32 cos/sin). Angles for positions
// below table_positions() are tabulated at construction; later ones are tabulated on first
// use, kLazyChunkPositions at a time (the same values: a position's angles never depend on
// which table holds them).
//
// Thread-safety: every method is const and may be called from any thread; the first use of
// a lazily tabulated chunk fills it under a lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "attic/model/config.h"

namespace attic::attention {

class RopeTable {
 public:
  // Inverse frequencies from rope_theta and rope_scaling (linear, llama3).
  RopeTable(const model::ModelConfig& config);
  // Same, from the fields alone. head_dim must be even.
  RopeTable(int head_dim, float rope_theta, const model::RopeScaling& scaling, int max_position_embeddings = 2048);
  int head_dim() const { return head_dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  int table_positions() const { return table_positions_; }
  // Positions past the table are tabulated in chunks of this many on first use, up to
  // kMaxLazyPositions; beyond that (and for negative positions) computed per row.
  static constexpr int kLazyChunkPositions = 4096;
  static constexpr int64_t kMaxLazyPositions = int64_t{1} << 24;
  // Bytes of the chunks tabulated so far (head_dim floats per position).
  int64_t lazy_bytes() const;

  // cos/sin of the angles for one position: each [head_dim / 2].
  void CosSin(int32_t position, float* cos_out, float* sin_out) const;

  // x: [n_tokens, n_heads, head_dim]; rotates token t by positions[t]. In place.
  void Apply(float* x, int64_t n_tokens, int n_heads, const int32_t* positions) const;
  // One token, out of place: src [n_heads, head_dim] (contiguous) rotated by `position`
  // into dst, head h at dst + h * dst_head_stride (the compute buffer's block layout).
  // Same numerics as Apply.
  void ApplyToken(const float* src, float* dst, int n_heads, int64_t dst_head_stride, int32_t position) const;
  // The inverse rotation (rotate by -position); used to recover pre-RoPE K.
  void ApplyInverse(float* x, int64_t n_tokens, int n_heads, const int32_t* positions) const;

 private:
  // cos and sin of `position`'s angles: the table's, or computed into `scratch`
  // ([head_dim] floats; unused, and may be null, for tabulated positions).
  std::pair<const float*, const float*> Angles(int32_t position, float* scratch) const;
  void Rotate(float* x, int64_t n_tokens, int n_heads, const int32_t* positions, float sign) const;
  // One token's heads rotated by sign * position, src -> dst (head h at dst + h *
  // dst_head_stride; src == dst rotates in place).
  void RotateToken(const float* src, float* dst, int n_heads, int64_t dst_head_stride, int32_t position, float sign,
                   float* scratch) const;
  // Chunk c of the positions past the table (cos [kLazyChunkPositions][head_dim / 2], then
  // sin), filled on first use.
  const float* LazyChunk(int64_t c) const;
  int head_dim_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  int table_positions_ = 0;
  std::vector<float> cos_, sin_;  // [table_positions_][head_dim / 2]
  // Shared by copies (the values are a function of the position alone).
  struct Lazy {
    std::mutex mu;
    std::vector<std::unique_ptr<float[]>> owned;
    // One per chunk up to kMaxLazyPositions, null until filled.
    std::unique_ptr<std::atomic<const float*>[]> chunks;
  };
  std::shared_ptr<Lazy> lazy_;
  bool avx512_ = false;           // rotate with the AVX-512 kernel (same bits, ~4x faster)
  bool avx2_ = false;             // ... or the AVX2 one (same bits)
};

}  // namespace attic::attention
