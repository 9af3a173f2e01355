// Sources of tensor values for the checkpoint writers, and streaming of one tensor to
// a file in chunks (converted to the storage dtype, q/k rows optionally permuted into
// GGUF order), so that writing never holds a whole model in memory.
//
// Thread-safety: a TensorJob's producer is called from one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attic/model/tensor_specs.h"
#include "attic/model/writer.h"
#include "attic/tensor/buffer.h"

namespace attic::model {

// Writes `n_rows` rows starting at `row0` of the tensor (HF row order) as f32 into `out`.
using RowProducer = std::function<void(int64_t row0, int64_t n_rows, float* out)>;

struct TensorJob {
  TensorSpec spec;
  RowProducer produce;
  int64_t rows() const { return spec.shape.size() < 2 ? 1 : spec.shape[0]; }
  int64_t cols() const { return spec.shape.size() < 2 ? spec.numel() : spec.numel() / spec.shape[0]; }
};

// Jobs copying explicit tensors (which must outlive the jobs). InvalidArgument when a
// tensor's data size differs from its shape's element count.
StatusOr<std::vector<TensorJob>> ExplicitJobs(const std::vector<NamedTensor>& tensors);
// Jobs for every tensor of ModelTensorSpecs(c) with seeded random values.
std::vector<TensorJob> RandomJobs(const ModelConfig& c, const RandomWeights& r);

// A file written to `path.partial` and renamed over `path` by Commit(); dropped
// (unlinked) if destroyed uncommitted.
class FileSink {
 public:
  static StatusOr<std::unique_ptr<FileSink>> Create(const std::string& path);
  ~FileSink();
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;
  Status Write(const void* data, size_t n);
  // Renames the file into place (atomic for readers); `sync` first flushes its data to
  // disk (seconds for a multi-GB checkpoint).
  Status Commit(bool sync);
  uint64_t written() const { return written_; }

 private:
  FileSink() = default;
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

struct WriteProgress {
  std::function<void(uint64_t, uint64_t)> fn;
  uint64_t done = 0;
  uint64_t total = 0;
  void Add(uint64_t n) {
    done += n;
    if (fn) fn(done, total);
  }
};

// Chunk buffers reused across StreamTensor calls (allocating and zeroing fresh ones per
// tensor costs more than generating the values).
struct StreamBuffers {
  AlignedBuffer f32, permuted, bytes;
};

// Streams `job` to `out` as `dtype` (f32/f16/bf16). permute_head_dim > 0 reorders rows
// from HF to GGUF's interleaved RoPE order in blocks of that many rows.
Status StreamTensor(const TensorJob& job, DType dtype, int permute_head_dim, FileSink* out, WriteProgress* progress,
                    StreamBuffers* buffers);

// Storage kind implied by an HF name: "...norm.weight" -> kNorm, "...bias" -> kBias.
TensorKind KindOfName(const std::string& hf_name);

}  // namespace attic::model
