// A weight matrix or vector as the kernels read it: its element type, shape and data,
// and optionally a packed copy for the CPU GEMM. A model's weights are made of these
// (model/weights.h); the backend's kernels take them (backend/kernels.h).
//
// Row-major; a linear layer y = x W^T + b has W stored [out, in].
//
// Thread-safety: a value type.
#pragma once

#include <cstdint>
#include <vector>

#include "attic/tensor/dtype.h"

namespace attic {

struct WeightTensor {
  DType dtype = DType::kF32;
  const void* data = nullptr;     // nullptr = absent (e.g. no bias)
  std::vector<int64_t> shape;     // e.g. {out, in}; {n} for vectors
  // The same matrix in the CPU GEMM's packed layout (backend::PrepackWeights), or null.
  // Owned with the weights (the Model); `data` stays the reference (GEMV, embedding rows).
  const void* packed = nullptr;
  // Whose layout `packed` is in (the backend's tag: the ISA whose GEMM packed it).
  int packed_layout = 0;

  bool present() const { return data != nullptr; }
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? 1 : shape[1]; }
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  // Bytes of `data` (the tensor as stored; a packed copy may differ).
  uint64_t stored_bytes() const { return DTypeBytes(dtype, static_cast<size_t>(numel())); }
  // Pointer to row r of a 2-D tensor.
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + DTypeBytes(dtype, static_cast<size_t>(r * cols()));
  }
};

}  // namespace attic
