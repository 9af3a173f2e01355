// GEMM for ISAs without a hand-written one (generic, AVX2): the output columns are cut
// into tiles of kTileRows weight rows; pool threads claim tiles, widen the tile's weights
// to f32 in a thread-local buffer (f32 weights are used in place) and call
// single-threaded OpenBLAS sgemm on it. OpenBLAS's own threads are switched off: our
// pool owns the cores.
#include <cblas.h>

#include <algorithm>
#include <mutex>

#include "attic/tensor/buffer.h"
#include "backend/cpu/kernel_table.h"

namespace attic::backend::cpu {

namespace {

void UseSingleThreadedBlas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Weight rows converted per sgemm call: 128 rows x k=8192 f32 = 4 MiB at most.
constexpr int64_t kTileRows = 128;

}  // namespace

void SgemmFallback(const KernelTable& t, ThreadPool& pool, const float* x, int64_t m, const WeightTensor& w,
                   const float* bias, float* y) {
  UseSingleThreadedBlas();
  const int64_t n = w.rows(), k = w.cols();
  // Tiles are claimed dynamically by whichever thread is free.
  pool.ParallelFor((n + kTileRows - 1) / kTileRows, [&](int64_t tile_index, int) {
    thread_local AlignedBuffer tile;
    {
      const int64_t j0 = tile_index * kTileRows;
      const int64_t nb = std::min(kTileRows, n - j0);
      const float* wf;
      if (w.dtype == DType::kF32) {
        wf = reinterpret_cast<const float*>(w.row(j0));
      } else {
        tile.Reserve(static_cast<size_t>(nb * k) * sizeof(float));
        float* dst = tile.as<float>();
        for (int64_t j = 0; j < nb; ++j) t.row_to_f32(w.dtype, w.row(j0 + j), dst + j * k, k);
        wf = dst;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(nb),
                  static_cast<int>(k), 1.0f, x, static_cast<int>(k), wf, static_cast<int>(k), 0.0f, y + j0,
                  static_cast<int>(n));
      if (bias != nullptr) {
        for (int64_t i = 0; i < m; ++i) {
          float* yr = y + i * n + j0;
          for (int64_t j = 0; j < nb; ++j) yr[j] += bias[j0 + j];
        }
      }
    }
  });
}

}  // namespace attic::backend::cpu
