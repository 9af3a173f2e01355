// Private to the attention module: the pieces Attend is assembled from, exposed so tests
// can run each ISA's kernels directly.
//
// Attend works in a per-KV-head "row space": row r of KV head h is query r / group with
// query head h * group + r % group (group = n_heads / n_kv_heads), so one K/V row loaded
// serves every query head of the group and every query of a tile. Query i sees the
// "virtual slots" [0, n_vis[i]) where virtual slot j is slot indices[j] (or j without an
// index list); n_vis folds kv_end and the index list into one number per query.
//
// Kernels compute one TileJob flash-attention style (online softmax over chunks of
// slots) and return the un-normalised output together with the softmax statistics, so
// the driver can normalise directly or merge jobs that split one tile's slots.
// Scores are kept in log2 units (q is pre-scaled by scale * log2(e)).
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "attic/attention/attention.h"
#include "attic/attention/kv_q4.h"
#include "attic/attention/kv_q8.h"
#include "attic/backend/convert.h"
#include "attic/backend/cpu_features.h"
#include "attic/backend/thread_pool.h"

namespace attic::attention::internal {

constexpr float kLog2e = 1.4426950408889634f;

struct AttendParams {
  AttentionShape shape;
  int group = 1;                      // n_heads / n_kv_heads
  const float* q = nullptr;           // [n_q, n_heads, head_dim]
  int n_q = 0;
  const int32_t* n_vis = nullptr;     // [n_q]
  const int32_t* indices = nullptr;   // virtual slot -> slot; nullptr = identity
  KvLayerView kv;
};

// Rows [row_begin, row_begin + n_rows) of KV head kv_head, over virtual slots
// [slot_begin, slot_end) (further limited per row by n_vis).
struct TileJob {
  int kv_head = 0;
  int64_t row_begin = 0;
  int n_rows = 0;
  int slot_begin = 0;
  int slot_end = 0;
  // The job this thread is likely to run next, when it reads the same KV through the same
  // params (else next_kv_head < 0): the f32 / f16 decode kernels prefetch its first rows
  // during their own last step (StepPrefetch). A hint only: the results never depend on it.
  int next_kv_head = -1;
  int next_slot_begin = 0;
  int next_slot_end = 0;
};

// Writes o [n_rows][head_dim] = sum_j 2^(s_j - m) v_j, m [n_rows] = max_j s_j (or
// -FLT_MAX if no slot was visible) and l [n_rows] = sum_j 2^(s_j - m), where s_j is the
// log2-unit score of visible slot j.
using TileKernel = void (*)(const AttendParams& p, const TileJob& job, float* o, float* m, float* l);

struct KernelSet {
  TileKernel tile = nullptr;  // general kernel; handles up to tile_rows * max_tiles_per_job rows
  int tile_rows = 0;
  int max_tiles_per_job = 1;  // tiles `tile` runs together, sharing each K/V row it loads
  int tile_jobs_per_thread = 8;  // a request's `tile` jobs per thread when its slots are split
  TileKernel few = nullptr;   // optional kernel for heads with few rows (decode)
  int few_rows_max = 0;       // use `few` when n_q * group <= few_rows_max
  int few_head_dim_multiple = 1;  // ... and head_dim is a multiple of this
  // `few` on q8_0 KV quantizes each query row to int8 per q8_0 group (max|q| / 127 per
  // group, round to nearest) and takes scores as int8 dot products: an error of up to
  // half that step per query element, which the tests' bounds count.
  bool few_q8_quantizes_query = false;
  // `few` also reads K in q8_0 with V in q4_0 (head_dim a multiple of 32); otherwise it
  // reads one type, f32, f16 or q8_0, for both.
  bool few_k8_v4 = false;
};

// Whether Prepare gives a request the few-row kernel: a decode-sized request
// (rows_per_head = n_q * group), in kFastest mode, of a head_dim and K/V types `few` reads.
inline bool UsesFewKernel(const KernelSet& ks, bool fastest, int64_t rows_per_head, int head_dim, DType kt,
                          DType vt) {
  if (!fastest || ks.few == nullptr || rows_per_head > ks.few_rows_max || head_dim % ks.few_head_dim_multiple != 0)
    return false;
  if (kt == vt) return kt != DType::kQ4_0;
  return ks.few_k8_v4 && kt == DType::kQ8_0 && vt == DType::kQ4_0 && head_dim % 32 == 0;
}

KernelSet GenericKernels();
KernelSet Avx2Kernels();    // REQUIRES: the CPU supports AVX2 and FMA.
KernelSet Avx512Kernels();  // REQUIRES: the CPU supports AVX-512 F/BW/VL/DQ.
// The AVX-512 decode kernel on q8_0 KV (Avx512Kernels().few picks one by the CPU): with
// VNNI (scores as int8 dot products of K and the query quantized per q8_0 group;
// REQUIRES: AVX512-VNNI) or without (K widened to f32 in registers). Exposed so the
// tests check both on one CPU.
void Avx512DecodeQ8Vnni(const AttendParams& p, const TileJob& job, float* o, float* m, float* l);
void Avx512DecodeQ8NoVnni(const AttendParams& p, const TileJob& job, float* o, float* m, float* l);
// The same with V in q4_0 (KernelSet::few_k8_v4).
void Avx512DecodeK8V4Vnni(const AttendParams& p, const TileJob& job, float* o, float* m, float* l);
void Avx512DecodeK8V4NoVnni(const AttendParams& p, const TileJob& job, float* o, float* m, float* l);

// Attend with the kernels of `isa` (which the CPU must support).
void AttendIsa(backend::Isa isa, backend::ThreadPool& pool, const AttentionShape& shape, const float* q, int n_q,
               const int32_t* kv_end, const int32_t* indices, int n_indices, const KvLayerView& kv, float* out);
void AttendBatchIsa(backend::Isa isa, backend::ThreadPool& pool, const AttentionShape& shape,
                    const AttendRequest* requests, int n_requests, AttendMode mode = AttendMode::kFastest);

// A per-thread, 64-byte aligned scratch buffer of at least n floats; `which` (0..4)
// selects one of several independent buffers. Contents are unspecified.
float* ThreadScratch(int which, size_t n);

// Rotate-half over one head: y1 = x1*c - x2*(sign*s), y2 = x2*c + x1*(sign*s), `half`
// pairs, each operation rounded in that order (bit-identical to RopeTable's scalar loop).
// In place when y1 == x1 and y2 == x2. rope_avx512.cc; only with backend::Isa::kAvx512.
// The same on AVX2 (rope.cc; a CPU with AVX2). Same bits as the scalar loop.
void RotateHalfAvx2(const float* x1, const float* x2, float* y1, float* y2, const float* c, const float* s, float sign,
                    int half);
void RotateHalfAvx512(const float* x1, const float* x2, float* y1, float* y2, const float* c, const float* s,
                      float sign, int half);
constexpr int kF16Scratch = 4;  // the buffer kernels widen f16 / q8_0 KV rows into

// A q8_0 row's f16 scales: at byte `scale_off` (SlotMap::Q8ScaleOffset) of `pool`.
inline const uint16_t* Q8Scales(const int8_t* pool, int64_t scale_off) {
  return reinterpret_cast<const uint16_t*>(pool + scale_off);
}

// One row of a tensor (K or V) of type `type` at offset `off` (elements; q8_0 and q4_0:
// bytes, with `soff` the row's scale offset, unused otherwise): in place for f32 storage;
// an f16 row is widened into `buf` ([d] floats), a q8_0 or q4_0 row dequantized into it.
inline const float* TensorRow(DType type, const void* pool, int64_t off, int64_t soff, int d, float* buf) {
  if (type == DType::kF32) return static_cast<const float*>(pool) + off;
  if (type == DType::kQ8_0) {
    const int8_t* q = static_cast<const int8_t*>(pool);
    DequantizeKvRowQ8(q + off, Q8Scales(q, soff), d, buf);
  } else if (type == DType::kQ4_0) {
    const uint8_t* q = static_cast<const uint8_t*>(pool);
    DequantizeKvRowQ4(q + off, q + soff, d, buf);
  } else {
    backend::ConvertF16ToF32(static_cast<const uint16_t*>(pool) + off, buf, d);
  }
  return buf;
}

// A view's K / V storage, whatever its type.
inline const void* KData(const KvLayerView& kv) {
  return kv.k_q8 != nullptr    ? static_cast<const void*>(kv.k_q8)
         : kv.k_q4 != nullptr  ? static_cast<const void*>(kv.k_q4)
         : kv.k_f16 != nullptr ? static_cast<const void*>(kv.k_f16)
                               : static_cast<const void*>(kv.k_pool);
}
inline const void* VData(const KvLayerView& kv) {
  return kv.v_q8 != nullptr    ? static_cast<const void*>(kv.v_q8)
         : kv.v_q4 != nullptr  ? static_cast<const void*>(kv.v_q4)
         : kv.v_f16 != nullptr ? static_cast<const void*>(kv.v_f16)
                               : static_cast<const void*>(kv.v_pool);
}

// Maps slots to the offset of their K row for one KV head -- or V's row (ForV), which is
// the same offset when K and V share a type; shifts instead of dividing when block_size
// is a power of two. Offsets count the storage's elements (f32, f16) or bytes (q8_0,
// q4_0).
class SlotMap {
 public:
  SlotMap(const KvLayerView& kv, int kv_head, int head_dim)
      : SlotMap(kv, kv_head, head_dim, kv.block_stride, kv.q8_scales, KType(kv)) {}
  static SlotMap ForV(const KvLayerView& kv, int kv_head, int head_dim) {
    return SlotMap(kv, kv_head, head_dim, kv.v_block_stride, kv.v_q8_scales, VType(kv));
  }

  int64_t Offset(int32_t slot) const {
    int32_t block, row;
    Split(slot, &block, &row);
    return table_[block] * stride_ + head_offset_ + static_cast<int64_t>(row) * row_units_;
  }
  // q8_0 / q4_0 storage: the byte offset of the slot's row's first f16 scale.
  int64_t Q8ScaleOffset(int32_t slot) const {
    int32_t block, row;
    Split(slot, &block, &row);
    return table_[block] * stride_ + scales_ + static_cast<int64_t>(row) * scale_row_bytes_;
  }
  int block_size() const { return block_size_; }
  int kv_head() const { return kv_head_; }

 private:
  SlotMap(const KvLayerView& kv, int kv_head, int head_dim, int64_t stride, int64_t scales_at, DType type)
      : table_(kv.block_table),
        stride_(stride),
        row_units_(KvHasScales(type) ? KvValueBytes(type, head_dim) : head_dim),
        head_offset_(static_cast<int64_t>(kv_head) * kv.block_size * row_units_),
        scale_row_bytes_(static_cast<int64_t>(head_dim / KvQ8Group(head_dim)) * 2),
        scales_(scales_at + static_cast<int64_t>(kv_head) * kv.block_size * scale_row_bytes_),
        block_size_(kv.block_size),
        shift_((kv.block_size & (kv.block_size - 1)) == 0 ? __builtin_ctz(static_cast<unsigned>(kv.block_size)) : -1),
        kv_head_(kv_head) {}

  const int32_t* table_;
  int64_t stride_;
  int64_t row_units_;        // a row's elements, or bytes (q4_0: head_dim / 2)
  int64_t head_offset_;      // from a block's start to this head's first row
  int64_t scale_row_bytes_;  // q8_0 / q4_0: a row's scales
  int64_t scales_;           // from a block's start to this head's first row's scales
  int block_size_;
  int shift_;
  int kv_head_;

  void Split(int32_t slot, int32_t* block, int32_t* row) const {
    if (shift_ >= 0) {
      *block = slot >> shift_;
      *row = slot & (block_size_ - 1);
    } else {
      *block = slot / block_size_;
      *row = slot % block_size_;
    }
  }
};

// Whether a view's K and V share one type and layout (then V's offsets are K's).
inline bool SameKvLayout(const KvLayerView& kv) {
  return KType(kv) == VType(kv) && kv.block_stride == kv.v_block_stride && kv.q8_scales == kv.v_q8_scales;
}

// The general kernels' K and V rows for n virtual slots from `c` (through p.indices when
// set): kp[j] / vp[j] point at them, in place or widened into `buf` ([2n][d] floats: K's
// rows, then V's) by each tensor's own type.
struct KvRowReader {
  DType kt, vt;
  const void* k;
  const void* v;
  bool same;     // SameKvLayout
  SlotMap vmap;  // V's rows (unused when `same`)
  KvRowReader(const KvLayerView& kv, int kv_head, int head_dim)
      : kt(KType(kv)),
        vt(VType(kv)),
        k(KData(kv)),
        v(VData(kv)),
        same(SameKvLayout(kv)),
        vmap(SlotMap::ForV(kv, kv_head, head_dim)) {}
  // Whether either tensor needs `buf`.
  bool widens() const { return kt != DType::kF32 || vt != DType::kF32; }
  // `map`: K's rows of the same head.
  void Read(const SlotMap& map, const int32_t* indices, int c, int n, int d, float* buf, const float** kp,
            const float** vp) const {
    for (int j = 0; j < n; ++j) {
      const int32_t slot = indices ? indices[c + j] : c + j;
      const int64_t koff = map.Offset(slot);
      const int64_t ksoff = KvHasScales(kt) ? map.Q8ScaleOffset(slot) : 0;
      const int64_t voff = same ? koff : vmap.Offset(slot);
      const int64_t vsoff = same ? ksoff : KvHasScales(vt) ? vmap.Q8ScaleOffset(slot) : 0;
      kp[j] = TensorRow(kt, k, koff, ksoff, d, buf + static_cast<int64_t>(j) * d);
      vp[j] = TensorRow(vt, v, voff, vsoff, d, buf + static_cast<int64_t>(n + j) * d);
    }
  }
};

// prefetcht1 (into L2) as a volatile asm: GCC 12 deletes a loop whose only statements are
// __builtin_prefetch (or _mm_prefetch) calls as free of side effects.
inline void PrefetchL2(const char* a) { asm volatile("prefetcht1 %0" : : "m"(*a)); }

// Prefetches into L2 the K and V rows of virtual slots [begin, end) (through `indices`
// when set) of the head `map` addresses. The kernels call it for the rows they read next
// (the f32 / f16 decode kernels through StepPrefetch, below): a sequence's blocks are
// scattered over the pool, and each short run (one block's rows of one head) otherwise
// starts with a DRAM round trip the hardware prefetcher has not caught up with.
inline void PrefetchKvRows(const KvLayerView& kv, const SlotMap& map, const int32_t* indices, int begin, int end,
                           int head_dim) {
  const DType kt = KType(kv), vt = VType(kv);
  const char* k = static_cast<const char*>(KData(kv));
  const char* v = static_cast<const char*>(VData(kv));
  const int64_t k_row_bytes = KvValueBytes(kt, head_dim), v_row_bytes = KvValueBytes(vt, head_dim);
  // An offset's unit: an element (f32, f16) or a byte (q8_0, q4_0).
  const int64_t k_unit = KvHasScales(kt) ? 1 : KvValueBytes(kt, 1);
  const int64_t v_unit = KvHasScales(vt) ? 1 : KvValueBytes(vt, 1);
  const bool same = SameKvLayout(kv);
  const SlotMap vmap = SlotMap::ForV(kv, map.kv_head(), head_dim);  // used when !same
  for (int j = begin; j < end; ++j) {
    const int32_t slot = indices ? indices[j] : j;
    const int64_t kat = map.Offset(slot) * k_unit;
    // A q8_0 / q4_0 row's scales too: one line serves many rows.
    if (same) {
      for (int64_t b = 0; b < k_row_bytes; b += 64) {
        PrefetchL2(k + kat + b);
        PrefetchL2(v + kat + b);
      }
      if (KvHasScales(kt)) {
        const int64_t sat = map.Q8ScaleOffset(slot);
        PrefetchL2(k + sat);
        PrefetchL2(v + sat);
      }
    } else {
      const int64_t vat = vmap.Offset(slot) * v_unit;
      for (int64_t b = 0; b < k_row_bytes; b += 64) PrefetchL2(k + kat + b);
      for (int64_t b = 0; b < v_row_bytes; b += 64) PrefetchL2(v + vat + b);
      if (KvHasScales(kt)) PrefetchL2(k + map.Q8ScaleOffset(slot));
      if (KvHasScales(vt)) PrefetchL2(v + vmap.Q8ScaleOffset(slot));
    }
  }
}

// Prefetches, spread over a decode step's compute, the rows the next step reads: the
// job's next kDecodeChunk slots, or in its last step the first ones of job.next_kv_head's
// range. The kernel calls Begin(c) as step c starts and Part(i, n) at n points spread
// over the step. One burst of a whole step's lines (512 for f32 rows of 64) waits for
// free miss buffers and so runs after the compute instead of beside it; parts of it keep
// the two overlapping (docs/engine.md, "Decode attention's prefetch").
class StepPrefetch {
 public:
  StepPrefetch(const AttendParams& p, const TileJob& job, const SlotMap& map, int max_lim, int chunk)
      : p_(p),
        job_(job),
        map_(map),
        next_map_(job.next_kv_head >= 0 ? SlotMap(p.kv, job.next_kv_head, p.shape.head_dim) : map),
        max_lim_(max_lim),
        chunk_(chunk),
        k_(static_cast<const char*>(KData(p.kv))),
        v_(static_cast<const char*>(VData(p.kv))),
        row_bytes_(KvValueBytes(KType(p.kv), p.shape.head_dim)),
        unit_(KvValueBytes(KType(p.kv), 1)),
        linear_(p.indices == nullptr && SameKvLayout(p.kv) && !KvHasScales(KType(p.kv)) &&
                ((reinterpret_cast<uintptr_t>(k_) ^ reinterpret_cast<uintptr_t>(v_)) & 63) == 0) {}

  void Begin(int c) {
    if (c + chunk_ < max_lim_) {
      target_ = &map_;
      begin_ = c + chunk_;
      n_ = std::min(max_lim_, c + 2 * chunk_) - begin_;
    } else if (job_.next_kv_head >= 0) {
      target_ = &next_map_;
      begin_ = job_.next_slot_begin;
      n_ = std::min(job_.next_slot_end, begin_ + chunk_) - begin_;
    } else {
      n_ = 0;
    }
  }

  void Part(int i, int parts) const {
    if (n_ <= 0) return;
    const int b = begin_ + n_ * i / parts, e = begin_ + n_ * (i + 1) / parts;
    if (b >= e) return;
    const int bs = target_->block_size();
    if (linear_ && b / bs == (e - 1) / bs) {  // one run of rows: one address range each, alike mod 64
      const int64_t at = target_->Offset(b) * unit_;
      const int64_t lead = static_cast<int64_t>(reinterpret_cast<uintptr_t>(k_ + at) & 63);
      const int64_t bytes = static_cast<int64_t>(e - b) * row_bytes_;
      for (int64_t x = at - lead; x < at + bytes; x += 64) {
        PrefetchL2(k_ + x);
        PrefetchL2(v_ + x);
      }
    } else {
      PrefetchKvRows(p_.kv, *target_, p_.indices, b, e, p_.shape.head_dim);
    }
  }

 private:
  const AttendParams& p_;
  const TileJob& job_;
  const SlotMap& map_;
  SlotMap next_map_;
  int max_lim_, chunk_;
  const char* k_;
  const char* v_;
  int64_t row_bytes_, unit_;
  bool linear_;
  const SlotMap* target_ = nullptr;
  int begin_ = 0, n_ = 0;
};

// The decode kernels' rows (row-major, <= a few per job): qs[r][d] = row r's query
// pre-scaled to log2 units, lim[r] = the virtual slots it sees within the job;
// *min_lim / *max_lim their range.
inline void LoadDecodeRows(const AttendParams& p, const TileJob& job, int n_rows, float* qs, int32_t* lim,
                           int32_t* min_lim, int32_t* max_lim) {
  const int d = p.shape.head_dim, g = p.group;
  const float qscale = p.shape.scale * kLog2e;
  *min_lim = INT32_MAX;
  *max_lim = 0;
  for (int r = 0; r < n_rows; ++r) {
    const int64_t row = job.row_begin + r;
    const int64_t query = row / g;
    const int head = job.kv_head * g + static_cast<int>(row % g);
    const float* src = p.q + (query * p.shape.n_heads + head) * d;
    for (int i = 0; i < d; ++i) qs[r * d + i] = src[i] * qscale;
    lim[r] = std::min(p.n_vis[query], job.slot_end);
    *min_lim = std::min(*min_lim, lim[r]);
    *max_lim = std::max(*max_lim, lim[r]);
  }
}

// The AVX-512 decode kernel's K/V rows (the AVX2 one reads rows in place: DecodeRows
// below) for one softmax step of kGroups x kGroup virtual slots
// from `c` (of T elements: float, or uint16_t for f16): kb[gi] / vb[gi] point at group
// gi's kGroup rows, head_dim apart -- in the pool itself when the group is one run
// inside a block, else gathered into kbuf / vbuf ([kGroups * kGroup][d] each) and
// zero-padded past max_lim.
template <int kGroup, int kGroups, class T>
inline void DecodeGroups(const AttendParams& p, const SlotMap& map, int c, int max_lim, const T* k_pool,
                         const T* v_pool, T* kbuf, T* vbuf, const T** kb, const T** vb) {
  const int d = p.shape.head_dim, bs = map.block_size();
  for (int gi = 0; gi < kGroups; ++gi) {
    const int c0 = c + gi * kGroup;
    const int n = std::clamp(max_lim - c0, 0, kGroup);
    if (p.indices == nullptr && n == kGroup && c0 % bs + kGroup <= bs) {  // one run of rows
      const int64_t off = map.Offset(c0);
      kb[gi] = k_pool + off;
      vb[gi] = v_pool + off;
      continue;
    }
    T* kg = kbuf + gi * kGroup * d;
    T* vg = vbuf + gi * kGroup * d;
    for (int j = 0; j < n; ++j) {
      const int64_t off = map.Offset(p.indices ? p.indices[c0 + j] : c0 + j);
      std::copy_n(k_pool + off, d, kg + j * d);
      std::copy_n(v_pool + off, d, vg + j * d);
    }
    std::fill(kg + n * d, kg + kGroup * d, T{0});
    std::fill(vg + n * d, vg + kGroup * d, T{0});
    kb[gi] = kg;
    vb[gi] = vg;
  }
}

// One tensor's rows for one softmax step of kGroups x kGroup virtual slots from `c`
// (DecodeRows' rule, for a tensor laid out by its own SlotMap): rows[i] points at virtual
// slot c + i's row in the pool, or at `zero` past max_lim. `pool` is in the map's units
// (elements, or bytes for q8_0 / q4_0).
template <int kGroup, int kGroups, class T>
inline void TensorRows(const AttendParams& p, const SlotMap& map, int c, int max_lim, const T* pool,
                       int64_t row_units, const T* zero, const T** rows) {
  const int bs = map.block_size();
  for (int gi = 0; gi < kGroups; ++gi) {
    const int c0 = c + gi * kGroup;
    const int n = std::clamp(max_lim - c0, 0, kGroup);
    const T** g = rows + gi * kGroup;
    if (p.indices == nullptr && n == kGroup && c0 % bs + kGroup <= bs) {  // one run of rows
      const T* run = pool + map.Offset(c0);
      for (int j = 0; j < kGroup; ++j) g[j] = run + static_cast<int64_t>(j) * row_units;
      continue;
    }
    for (int j = 0; j < n; ++j) g[j] = pool + map.Offset(p.indices ? p.indices[c0 + j] : c0 + j);
    for (int j = n; j < kGroup; ++j) g[j] = zero;
  }
}

// The decode kernels' K/V rows for one softmax step of kGroups x kGroup virtual slots
// from `c`, as one pointer per row: kr[i] / vr[i] point at virtual slot c + i's K / V
// row in the pool itself, or at `zero` (head_dim zeros) past max_lim. Where
// DecodeGroups copies an index list's rows into a buffer (two row copies per selected
// slot, then the kernel reads the copies), this lets the kernel read every selected row
// where it lies: a scattered selection then costs its row loads and nothing more. The
// values read, and so the kernel's results, are the same.
template <int kGroup, int kGroups, class T>
inline void DecodeRows(const AttendParams& p, const SlotMap& map, int c, int max_lim, const T* k_pool,
                       const T* v_pool, const T* zero, const T** kr, const T** vr) {
  const int d = p.shape.head_dim, bs = map.block_size();
  for (int gi = 0; gi < kGroups; ++gi) {
    const int c0 = c + gi * kGroup;
    const int n = std::clamp(max_lim - c0, 0, kGroup);
    const T** kg = kr + gi * kGroup;
    const T** vg = vr + gi * kGroup;
    if (p.indices == nullptr && n == kGroup && c0 % bs + kGroup <= bs) {  // one run of rows
      const int64_t off = map.Offset(c0);
      for (int j = 0; j < kGroup; ++j) {
        kg[j] = k_pool + off + static_cast<int64_t>(j) * d;
        vg[j] = v_pool + off + static_cast<int64_t>(j) * d;
      }
      continue;
    }
    for (int j = 0; j < n; ++j) {
      const int64_t off = map.Offset(p.indices ? p.indices[c0 + j] : c0 + j);
      kg[j] = k_pool + off;
      vg[j] = v_pool + off;
    }
    for (int j = n; j < kGroup; ++j) kg[j] = vg[j] = zero;
  }
}

}  // namespace attic::attention::internal
