#include "attic/attention/rope.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "attention/attention_internal.h"
#include "attic/backend/cpu_features.h"
#include "attic/core/status.h"

namespace attic::attention {
namespace {

// Positions tabulated at construction (cos + sin, head_dim/2 each): 8 MiB at head_dim 64
// for a 32k window. Later positions are tabulated a chunk at a time when first used
// (RopeTable::LazyChunk): computed per row, in double, a row past the table cost ~40x a
// tabulated one (0.84 vs 0.02 us at head_dim 64, AMD EPYC Zen 3), which made entering KV
// at such positions -- linked chunks, a sparse offload's fetched rows -- that much slower.
constexpr int kMaxTablePositions = 32768;

// inv_freq as transformers computes it, every step in float32:
//   inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim))
std::vector<float> DefaultInvFreq(int head_dim, float theta) {
  std::vector<float> inv(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(theta, exponent);  // powf: float overload
  }
  return inv;
}

// transformers' _compute_llama3_parameters, in float32 tensor arithmetic (python scalars
// are cast to float32 by torch's tensor-scalar ops).
void ApplyLlama3(const model::RopeScaling& s, std::vector<float>& inv) {
  const float factor = s.factor;
  const float low = s.low_freq_factor, high = s.high_freq_factor;
  const float old_ctx = static_cast<float>(s.original_max_position_embeddings);
  const float low_freq_wavelen = static_cast<float>(s.original_max_position_embeddings / static_cast<double>(low));
  const float high_freq_wavelen = static_cast<float>(s.original_max_position_embeddings / static_cast<double>(high));
  const float two_pi = static_cast<float>(2.0 * M_PI);
  for (float& f : inv) {
    float wavelen = two_pi / f;
    float scaled = wavelen > low_freq_wavelen ? f / factor : f;
    bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      float smooth = (old_ctx / wavelen - low) / (high - low);
      scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
    f = scaled;
  }
}

// cos/sin of the float32 angle f32(pos) * inv_freq, evaluated in double and rounded.
void ComputeCosSin(const std::vector<float>& inv, int32_t position, float* c, float* s) {
  const float pos = static_cast<float>(position);
  for (size_t i = 0; i < inv.size(); ++i) {
    const float angle = pos * inv[i];
    c[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
    s[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
  }
}

}  // namespace

RopeTable::RopeTable(const model::ModelConfig& config)
    : RopeTable(config.head_dim > 0 ? config.head_dim : (config.n_heads > 0 ? config.hidden_size / config.n_heads : 0),
                config.rope_theta, config.rope_scaling, config.max_position_embeddings) {}

RopeTable::RopeTable(int head_dim, float rope_theta, const model::RopeScaling& scaling, int max_position_embeddings)
    : head_dim_(head_dim) {
  ATTIC_CHECK(head_dim > 0 && head_dim % 2 == 0);
  inv_freq_ = DefaultInvFreq(head_dim, rope_theta);
  switch (scaling.type) {
    case model::RopeScalingType::kNone:
      break;
    case model::RopeScalingType::kLinear:
      for (float& f : inv_freq_) f /= scaling.factor;
      break;
    case model::RopeScalingType::kLlama3:
      ApplyLlama3(scaling, inv_freq_);
      break;
  }
  const int half = head_dim / 2;
  avx512_ = backend::ActiveIsa() == backend::Isa::kAvx512;
  avx2_ = backend::ActiveIsa() == backend::Isa::kAvx2;
  table_positions_ = std::clamp(max_position_embeddings, 0, kMaxTablePositions);
  cos_.resize(static_cast<size_t>(table_positions_) * half);
  sin_.resize(cos_.size());
  for (int p = 0; p < table_positions_; ++p) {
    ComputeCosSin(inv_freq_, p, &cos_[static_cast<size_t>(p) * half], &sin_[static_cast<size_t>(p) * half]);
  }
  lazy_ = std::make_shared<Lazy>();
  const int64_t n_chunks = (kMaxLazyPositions - table_positions_ + kLazyChunkPositions - 1) / kLazyChunkPositions;
  lazy_->chunks = std::make_unique<std::atomic<const float*>[]>(static_cast<size_t>(n_chunks));  // C++20: null
}

const float* RopeTable::LazyChunk(int64_t c) const {
  const float* chunk = lazy_->chunks[c].load(std::memory_order_acquire);
  if (chunk != nullptr) return chunk;
  std::lock_guard<std::mutex> lock(lazy_->mu);
  chunk = lazy_->chunks[c].load(std::memory_order_relaxed);
  if (chunk != nullptr) return chunk;  // filled by another thread meanwhile
  const int half = head_dim_ / 2;
  auto owned = std::make_unique<float[]>(static_cast<size_t>(2) * kLazyChunkPositions * half);
  float* cos = owned.get();
  float* sin = cos + static_cast<size_t>(kLazyChunkPositions) * half;
  const int64_t first = table_positions_ + c * kLazyChunkPositions;
  for (int r = 0; r < kLazyChunkPositions; ++r)
    ComputeCosSin(inv_freq_, static_cast<int32_t>(first + r), cos + static_cast<size_t>(r) * half,
                  sin + static_cast<size_t>(r) * half);
  chunk = owned.get();
  lazy_->owned.push_back(std::move(owned));
  lazy_->chunks[c].store(chunk, std::memory_order_release);
  return chunk;
}

int64_t RopeTable::lazy_bytes() const {
  std::lock_guard<std::mutex> lock(lazy_->mu);
  return static_cast<int64_t>(lazy_->owned.size()) * 2 * kLazyChunkPositions * (head_dim_ / 2) *
         static_cast<int64_t>(sizeof(float));
}

std::pair<const float*, const float*> RopeTable::Angles(int32_t position, float* scratch) const {
  const int half = head_dim_ / 2;
  if (position >= 0 && position < table_positions_)
    return {&cos_[static_cast<size_t>(position) * half], &sin_[static_cast<size_t>(position) * half]};
  if (position >= 0 && position < kMaxLazyPositions) {
    const int64_t past = static_cast<int64_t>(position) - table_positions_;
    const float* chunk = LazyChunk(past / kLazyChunkPositions);
    const int64_t r = past % kLazyChunkPositions;
    return {chunk + r * half, chunk + (kLazyChunkPositions + r) * half};
  }
  ComputeCosSin(inv_freq_, position, scratch, scratch + half);
  return {scratch, scratch + half};
}

void RopeTable::CosSin(int32_t position, float* cos_out, float* sin_out) const {
  const int half = head_dim_ / 2;
  std::vector<float> scratch(static_cast<size_t>(head_dim_));
  const auto [c, s] = Angles(position, scratch.data());
  std::copy_n(c, half, cos_out);
  std::copy_n(s, half, sin_out);
}

void RopeTable::Apply(float* x, int64_t n_tokens, int n_heads, const int32_t* positions) const {
  Rotate(x, n_tokens, n_heads, positions, 1.0f);
}

void RopeTable::ApplyInverse(float* x, int64_t n_tokens, int n_heads, const int32_t* positions) const {
  Rotate(x, n_tokens, n_heads, positions, -1.0f);
}

void RopeTable::ApplyToken(const float* src, float* dst, int n_heads, int64_t dst_head_stride,
                           int32_t position) const {
  std::vector<float> scratch;  // positions past the lazily tabulated ones only
  if (position < 0 || position >= kMaxLazyPositions) scratch.resize(static_cast<size_t>(head_dim_));
  RotateToken(src, dst, n_heads, dst_head_stride, position, 1.0f, scratch.data());
}

void RopeTable::Rotate(float* x, int64_t n_tokens, int n_heads, const int32_t* positions, float sign) const {
  std::vector<float> scratch(static_cast<size_t>(head_dim_));
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* xt = x + t * n_heads * static_cast<int64_t>(head_dim_);
    RotateToken(xt, xt, n_heads, head_dim_, positions[t], sign, scratch.data());
  }
}

namespace internal {

// AVX2 rotate-half (a target attribute without FMA: products and sums stay separately
// rounded, in the scalar code's order, so the bits equal the scalar loop's).
__attribute__((target("avx2"))) void RotateHalfAvx2(const float* x1, const float* x2, float* y1, float* y2,
                                                    const float* c, const float* s, float sign, int half) {
  const __m256 sg = _mm256_set1_ps(sign);
  int i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 a = _mm256_loadu_ps(x1 + i), b = _mm256_loadu_ps(x2 + i);
    const __m256 cv = _mm256_loadu_ps(c + i);
    const __m256 si = _mm256_mul_ps(sg, _mm256_loadu_ps(s + i));
    const __m256 r1 = _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(b, si));
    const __m256 r2 = _mm256_add_ps(_mm256_mul_ps(b, cv), _mm256_mul_ps(a, si));
    _mm256_storeu_ps(y1 + i, r1);
    _mm256_storeu_ps(y2 + i, r2);
  }
  for (; i < half; ++i) {
    const float a = x1[i], b = x2[i], si = sign * s[i];
    y1[i] = a * c[i] - b * si;
    y2[i] = b * c[i] + a * si;
  }
}

}  // namespace internal

// HF: out = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]; each product and
// the sum rounded to f32 (the same operation order, so results are bit-identical when the
// compiler does not contract to FMA, which the baseline x86-64 target cannot). In place
// when src == dst (each pair is read before it is written).
void RopeTable::RotateToken(const float* src, float* dst, int n_heads, int64_t dst_head_stride, int32_t position,
                            float sign, float* scratch) const {
  const int half = head_dim_ / 2;
  const auto [c, s] = Angles(position, scratch);
  for (int h = 0; h < n_heads; ++h) {
    const float* x1 = src + static_cast<int64_t>(h) * head_dim_;
    const float* x2 = x1 + half;
    float* y1 = dst + h * dst_head_stride;
    float* y2 = y1 + half;
    if (avx512_) {
      internal::RotateHalfAvx512(x1, x2, y1, y2, c, s, sign, half);
      continue;
    }
    if (avx2_) {
      internal::RotateHalfAvx2(x1, x2, y1, y2, c, s, sign, half);
      continue;
    }
    for (int i = 0; i < half; ++i) {
      const float a = x1[i], b = x2[i], si = sign * s[i];
      y1[i] = a * c[i] - b * si;
      y2[i] = b * c[i] + a * si;
    }
  }
}

}  // namespace attic::attention
