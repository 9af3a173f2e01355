// Internal: block-quantized weights packed 16 rows at a time for integer dot products
// (the layout is described in qpack.cc). The packing is portable; the kernels that read
// it are per ISA: AVX512-VNNI (qpack_vnni.cc, vpdpbusd) and AVX2 (qpack_avx2.cc,
// vpmaddubsw + vpmaddwd). Each ISA's table prepacks the weights its kernel can read
// (PrepackWeights) and its GEMV then reads only the packed copy, for every m.
#pragma once

#include <xmmintrin.h>

#include <cstdint>

#include "attic/backend/cpu_features.h"
#include "attic/backend/thread_pool.h"
#include "attic/tensor/buffer.h"
#include "attic/tensor/weight_tensor.h"
#include "backend/cpu/qdot.h"

namespace attic::backend::cpu {

// Rows per packed panel: a GEMV over packed weights takes row ranges starting at
// multiples of it.
constexpr int64_t kQuantPanelRows = 16;

namespace qpack {

enum class Fmt { kPer32, kQ4K, kQ6K };

struct TypeInfo {
  Fmt fmt;
  bool nibbles;  // 4-bit codes, two per byte
  int offset;    // o: w = d (u - o) ...
  bool has_min;  // per-32 m
};

// The packed form of type t, or false when t has none.
bool Info(DType t, TypeInfo* info);
inline int64_t CodeBytes(const TypeInfo& ti) { return ti.nibbles ? 4 * 64 : 8 * 64; }
inline int64_t UnitElems(const TypeInfo& ti) { return ti.fmt == Fmt::kPer32 ? 32 : 256; }
// Bytes of one panel's unit: a block of 32 (per-32 types) or a superblock of 256.
int64_t UnitBytes(const TypeInfo& ti);
inline int64_t PanelBytes(const TypeInfo& ti, int64_t k) { return k / UnitElems(ti) * UnitBytes(ti); }

// Whether w is block-quantized and packed in this layout by `isa`'s table (whose GEMV
// then reads the packed copy, for every m: gemv_max_m_packed_block).
inline bool IsPacked(const WeightTensor& w, Isa isa) {
  return DTypeIsBlock(w.dtype) && w.packed != nullptr && w.packed_layout == static_cast<int>(isa);
}

// Whether w has a packed form (type and shape; not whether the CPU can read it).
bool CanPack(const WeightTensor& w);
uint64_t PackedBytes(const WeightTensor& w);
void Pack(ThreadPool& pool, const WeightTensor& w, void* out);  // out: 64-byte aligned

// x row i of QuantizeX's layout (qdot.h): codes, scales per 32, sums per 16.
struct XRow {
  const int8_t* q;
  const float* dx;
  const int32_t* s;
  XRow() = default;
  XRow(const uint8_t* xb, int64_t i, int64_t k)
      : q(reinterpret_cast<const int8_t*>(xb + i * QuantXRowBytes(k))),
        dx(reinterpret_cast<const float*>(xb + i * QuantXRowBytes(k) + k)),
        s(reinterpret_cast<const int32_t*>(xb + i * QuantXRowBytes(k) + k + 4 * (k / 32))) {}
};

// Software prefetch of a packed stream kPrefetchAhead bytes ahead of p, every cache line
// of the `bytes` about to be read (one sequential stream per thread; with one prefetch a
// block 1 KiB ahead, decode stayed well below the read roof: see the commit that set it).
constexpr int64_t kPrefetchAhead = 4096;
inline void PrefetchAhead(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchAhead + o), _MM_HINT_T0);
}

}  // namespace qpack

namespace vnni {
// CPUs with AVX512-VNNI: every type with a packed form.
bool CanPrepackQuant(const WeightTensor& w);
// Rows [n0, n1) (n0 % kQuantPanelRows == 0) of a packed weight; xp from QuantizeX.
void GemvPackedQuant(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                     int64_t n1);
// QuantizeX with AVX-512 (the same bytes). REQUIRES: the CPU has AVX512-VNNI.
const float* QuantizeX(const float* x, int64_t m, int64_t k, AlignedBuffer* scratch);
}  // namespace vnni

namespace avx2 {
// Every type with a packed form but q8_0, whose codes (up to 255) would saturate
// vpmaddubsw's 16-bit pair sums.
bool CanPrepackQuant(const WeightTensor& w);
void GemvPackedQuant(const float* xp, int64_t m, const WeightTensor& w, const float* bias, float* y, int64_t n0,
                     int64_t n1);
}  // namespace avx2

}  // namespace attic::backend::cpu
