#include "model/weight_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "attic/core/hash.h"
#include "attic/tensor/buffer.h"
#include "model/random_fill.h"

namespace attic::model {

namespace {

// Elements converted and written per chunk (16 MiB of f32).
constexpr int64_t kChunkElems = int64_t{4} << 20;

inline uint64_t Mix64(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

TensorKind KindOfName(const std::string& n) {
  auto ends = [&](const std::string& suf) { return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0; };
  if (ends("norm.weight")) return TensorKind::kNorm;
  if (ends(".bias")) return TensorKind::kBias;
  return TensorKind::kMatrix;
}

StatusOr<std::vector<TensorJob>> ExplicitJobs(const std::vector<NamedTensor>& tensors) {
  std::vector<TensorJob> jobs;
  for (const NamedTensor& t : tensors) {
    TensorJob j;
    j.spec.name = t.name;
    j.spec.shape = t.shape;
    j.spec.kind = KindOfName(t.name);
    for (int64_t d : t.shape) {
      if (d < 0) return InvalidArgumentError("tensor '" + t.name + "' has a negative dimension");
    }
    if (t.shape.empty() || static_cast<size_t>(j.spec.numel()) != t.data.size()) {
      return InvalidArgumentError("tensor '" + t.name + "': " + std::to_string(t.data.size()) +
                                  " values do not match its shape");
    }
    const int64_t cols = j.cols();
    const float* data = t.data.data();
    j.produce = [data, cols](int64_t row0, int64_t n_rows, float* out) {
      std::memcpy(out, data + row0 * cols, static_cast<size_t>(n_rows * cols) * sizeof(float));
    };
    jobs.push_back(std::move(j));
  }
  return jobs;
}

std::vector<TensorJob> RandomJobs(const ModelConfig& c, const RandomWeights& r) {
  std::vector<TensorJob> jobs;
  for (const TensorSpec& spec : ModelTensorSpecs(c)) {
    TensorJob j;
    j.spec = spec;
    const int64_t cols = j.cols();
    if (spec.kind == TensorKind::kNorm) {
      j.produce = [cols](int64_t, int64_t n_rows, float* out) {
        for (int64_t i = 0; i < n_rows * cols; ++i) out[i] = 1.0f;
      };
    } else {
      const uint64_t key = Mix64(r.seed ^ Hash64(spec.name));
      const float stddev = r.stddev;
      j.produce = [key, cols, stddev](int64_t row0, int64_t n_rows, float* out) {
        FillNormal(key, static_cast<uint64_t>(row0 * cols), n_rows * cols, stddev, out);
      };
    }
    jobs.push_back(std::move(j));
  }
  return jobs;
}

std::vector<NamedTensor> RandomTensors(const ModelConfig& c, const RandomWeights& r) {
  std::vector<NamedTensor> out;
  for (const TensorJob& j : RandomJobs(c, r)) {
    NamedTensor t{j.spec.name, j.spec.shape, std::vector<float>(static_cast<size_t>(j.spec.numel()))};
    j.produce(0, j.rows(), t.data.data());
    out.push_back(std::move(t));
  }
  return out;
}

StatusOr<std::unique_ptr<FileSink>> FileSink::Create(const std::string& path) {
  std::unique_ptr<FileSink> s(new FileSink());
  s->path_ = path;
  s->tmp_ = path + ".partial";
  s->fd_ = ::open(s->tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (s->fd_ < 0) return UnavailableError("cannot create '" + s->tmp_ + "': " + std::strerror(errno));
  return s;
}

FileSink::~FileSink() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

Status FileSink::Write(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return UnavailableError("cannot write '" + tmp_ + "': " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
  return OkStatus();
}

Status FileSink::Commit(bool sync) {
  int fd = fd_;
  fd_ = -1;
  if ((sync && ::fdatasync(fd) != 0) || ::close(fd) != 0) {
    ::unlink(tmp_.c_str());
    return UnavailableError("cannot flush '" + tmp_ + "': " + std::strerror(errno));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp_.c_str());
    return UnavailableError("cannot rename to '" + path_ + "': " + std::strerror(errno));
  }
  return OkStatus();
}

Status StreamTensor(const TensorJob& job, DType dtype, int permute_head_dim, FileSink* out, WriteProgress* progress,
                    StreamBuffers* buffers) {
  const int64_t rows = job.rows(), cols = job.cols();
  if (rows == 0 || cols == 0) return OkStatus();
  if (cols % DTypeBlockSize(dtype) != 0) {
    return InvalidArgumentError("tensor '" + job.spec.name + "': rows of " + std::to_string(cols) +
                                " values are not whole " + DTypeName(dtype) + " blocks of " +
                                std::to_string(DTypeBlockSize(dtype)));
  }
  int64_t chunk_rows = std::max<int64_t>(1, kChunkElems / cols);
  if (permute_head_dim > 0) {
    if (rows % permute_head_dim != 0) {
      return InvalidArgumentError("tensor '" + job.spec.name + "': " + std::to_string(rows) +
                                  " rows are not whole heads of " + std::to_string(permute_head_dim));
    }
    chunk_rows = std::max<int64_t>(1, chunk_rows / permute_head_dim) * permute_head_dim;
  }
  chunk_rows = std::min(chunk_rows, rows);
  AlignedBuffer& f32 = buffers->f32;
  AlignedBuffer& permuted = buffers->permuted;
  AlignedBuffer& bytes = buffers->bytes;
  f32.Reserve(static_cast<size_t>(chunk_rows * cols) * sizeof(float));
  if (permute_head_dim > 0) permuted.Reserve(f32.size());
  bytes.Reserve(DTypeBytes(dtype, static_cast<size_t>(chunk_rows * cols)));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    job.produce(r0, n, f32.as<float>());
    const float* src = f32.as<float>();
    if (permute_head_dim > 0) {  // r0 is a multiple of head_dim: rows stay inside the chunk
      for (int64_t r = 0; r < n; ++r) {
        std::memcpy(permuted.as<float>() + HfRowToGgufRow(r, permute_head_dim) * cols, src + r * cols,
                    static_cast<size_t>(cols) * sizeof(float));
      }
      src = permuted.as<float>();
    }
    const size_t nbytes = DTypeBytes(dtype, static_cast<size_t>(n * cols));
    ConvertForStorage(dtype, src, bytes.data(), static_cast<size_t>(n * cols));
    ATTIC_RETURN_IF_ERROR(out->Write(bytes.data(), nbytes));
    progress->Add(nbytes);
  }
  return OkStatus();
}

}  // namespace attic::model
