// Block-quantized weights packed for integer dot products (qpack.h): 16 rows
// interleaved, so that one vpdpbusd (or vpmaddubsw + vpmaddwd) computes 4 products for
// each of 16 rows and the lanes of an accumulator are outputs (no horizontal sums, one
// sequential stream).
//
// Layout. Rows are cut into panels of kQuantPanelRows = 16 (the last one zero-padded);
// a panel holds its rows' blocks of 32 elements one after the other, each block as
//   codes: unsigned 8-bit codes u, 4 per row per 64-byte chunk: chunk c holds elements
//          4c..4c+3 of the 16 rows (row r at bytes 4r..4r+3). 4-bit types pack two
//          chunks in one: chunk c (c < 4) in the low nibbles, chunk c + 4 in the high.
// with the scales before the codes they apply to:
//   per-32 types (q4_0, q4_1, q5_0, q5_1, q8_0): [d: 16 f16][m: 16 f16, q4_1/q5_1][codes]
//     w = d (u - o) + m, o = 8 (q4_0), 16 (q5_0), 128 (q8_0), 0 otherwise;
//   q4_k, per 256: [d: 16 f16][dmin: 16 f16][sc: 8 x 16 u8][mn: 8 x 16 u8][8 x codes]
//     w = d sc_j u - dmin mn_j for the j-th 32 of the 256;
//   q6_k, per 256: [d: 16 f16][sc: 16 x 16 i8][8 x codes], w = d sc_g (u - 32) per 16.
// The scales are the file's own bits (f16, 6- or 8-bit integers), so the weights are
// exactly the format's; q4_0, q4_1, q8_0 take the file's bytes, q4_k 2.8% more (scales
// unpacked), q6_k 30% more and q5_0/q5_1 ~55% more (codes widened to bytes).
//
// The dot product per x row (x quantized by QuantizeX: per 32 a scale dx and int8 codes
// xq, with the codes' sums s per 16): for each block, the int32 sum of u * xq (exact),
// minus o times the sum of xq, converted to f32 (exact: |sum| < 2^24) and scaled:
//   y += dx (d (sum u xq - o s32) + m s32)               (per-32 types)
//   y += d sum_j dx_j sc_j (sum u xq) - dmin sum_j dx_j mn_j s32_j      (q4_k)
//   y += d sum_g dx sc_g (sum u xq - 32 s16_g)                         (q6_k)
// So the result equals the portable kernel's (qdot.cc) up to f32 rounding of the scale
// products and the accumulation order.

#include "backend/cpu/qpack.h"

#include <algorithm>
#include <cstring>

#include "attic/core/status.h"
#include "attic/tensor/quants.h"
#include "backend/cpu/qdot.h"

namespace attic::backend::cpu::qpack {

namespace {

constexpr int64_t kP = kQuantPanelRows;

uint16_t HalfBits(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// Writes the 32 codes u (of one row, elements 0..31 of a block) into a codes area: row
// r's 4 bytes of each 64-byte chunk (nibbles: elements 4c..4c+3 low, 16+4c.. high).
void PutCodes(const TypeInfo& ti, const uint8_t* u, int r, uint8_t* codes) {
  if (ti.nibbles) {
    for (int c = 0; c < 4; ++c)
      for (int t = 0; t < 4; ++t)
        codes[64 * c + 4 * r + t] = static_cast<uint8_t>(u[4 * c + t] | (u[16 + 4 * c + t] << 4));
  } else {
    for (int c = 0; c < 8; ++c) std::memcpy(codes + 64 * c + 4 * r, u + 4 * c, 4);
  }
}

// Packs rows [r0, r0 + rows) (rows <= kP) of w into one panel (zeroed beforehand).
void PackPanel(const TypeInfo& ti, const WeightTensor& w, int64_t r0, int64_t rows, uint8_t* panel) {
  const int64_t k = w.cols(), ue = UnitElems(ti), ub = UnitBytes(ti);
  const size_t bb = DTypeBlockBytes(w.dtype);
  DecodedBlock blk;
  uint8_t u[256];
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w.row(r0 + r);
    for (int64_t b = 0; b < k / ue; ++b) {
      const uint8_t* src = row + b * bb;
      uint8_t* unit = panel + b * ub;
      DecodeBlock(w.dtype, src, &blk);
      for (int64_t e = 0; e < ue; ++e) u[e] = static_cast<uint8_t>(blk.q[e] + ti.offset);
      switch (ti.fmt) {
        case Fmt::kPer32: {
          const uint16_t d = HalfBits(src);
          std::memcpy(unit + 2 * r, &d, 2);
          if (ti.has_min) {
            const uint16_t m = HalfBits(src + 2);
            std::memcpy(unit + 32 + 2 * r, &m, 2);
          }
          PutCodes(ti, u, static_cast<int>(r), unit + (ti.has_min ? 64 : 32));
          break;
        }
        case Fmt::kQ4K: {
          const uint16_t d = HalfBits(src), dmin = HalfBits(src + 2);
          std::memcpy(unit + 2 * r, &d, 2);
          std::memcpy(unit + 32 + 2 * r, &dmin, 2);
          for (int j = 0; j < 8; ++j) {
            uint8_t sc, mn;
            KQuantScaleMin(j, src + 4, &sc, &mn);
            unit[64 + kP * j + r] = sc;
            unit[64 + 8 * kP + kP * j + r] = mn;
            PutCodes(ti, u + 32 * j, static_cast<int>(r), unit + 64 + 16 * kP + j * CodeBytes(ti));
          }
          break;
        }
        case Fmt::kQ6K: {
          const uint16_t d = HalfBits(src + 208);
          std::memcpy(unit + 2 * r, &d, 2);
          for (int g = 0; g < 16; ++g) unit[32 + kP * g + r] = src[192 + g];
          for (int j = 0; j < 8; ++j)
            PutCodes(ti, u + 32 * j, static_cast<int>(r), unit + 32 + 16 * kP + j * CodeBytes(ti));
          break;
        }
      }
    }
  }
}

}  // namespace

bool Info(DType t, TypeInfo* info) {
  switch (t) {
    case DType::kQ4_0: *info = {Fmt::kPer32, true, 8, false}; return true;
    case DType::kQ4_1: *info = {Fmt::kPer32, true, 0, true}; return true;
    case DType::kQ5_0: *info = {Fmt::kPer32, false, 16, false}; return true;
    case DType::kQ5_1: *info = {Fmt::kPer32, false, 0, true}; return true;
    case DType::kQ8_0: *info = {Fmt::kPer32, false, 128, false}; return true;
    case DType::kQ4_K: *info = {Fmt::kQ4K, true, 0, false}; return true;
    case DType::kQ6_K: *info = {Fmt::kQ6K, false, 32, false}; return true;
    default: return false;
  }
}

int64_t UnitBytes(const TypeInfo& ti) {
  switch (ti.fmt) {
    case Fmt::kPer32: return (ti.has_min ? 64 : 32) + CodeBytes(ti);
    case Fmt::kQ4K: return 64 + 2 * 8 * kP + 8 * CodeBytes(ti);
    case Fmt::kQ6K: return 32 + 16 * kP + 8 * CodeBytes(ti);
  }
  return 0;
}

bool CanPack(const WeightTensor& w) {
  TypeInfo ti;
  return w.shape.size() == 2 && w.rows() > 0 && Info(w.dtype, &ti) && w.cols() % UnitElems(ti) == 0;
}

uint64_t PackedBytes(const WeightTensor& w) {
  TypeInfo ti;
  if (!Info(w.dtype, &ti)) return 0;
  return static_cast<uint64_t>((w.rows() + kP - 1) / kP * PanelBytes(ti, w.cols()));
}

void Pack(ThreadPool& pool, const WeightTensor& w, void* out) {
  TypeInfo ti;
  ATTIC_CHECK(Info(w.dtype, &ti));
  const int64_t n = w.rows(), panels = (n + kP - 1) / kP, pb = PanelBytes(ti, w.cols());
  uint8_t* dst = static_cast<uint8_t*>(out);
  pool.ParallelFor(panels, [&](int64_t p, int) {
    // Every byte of a full panel is written; a last, partial one's padding rows stay 0.
    const int64_t rows = std::min<int64_t>(kP, n - p * kP);
    if (rows < kP) std::memset(dst + p * pb, 0, static_cast<size_t>(pb));
    PackPanel(ti, w, p * kP, rows, dst + p * pb);
  });
}

}  // namespace attic::backend::cpu::qpack
