#include "model/model_builder.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "attic/core/hash.h"
#include "attic/model/tensor_specs.h"

namespace attic::model {

namespace {

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Fingerprint input: one tensor as compute sees it.
struct HashItem {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  uint64_t nbytes;
};

// Tensors are hashed in pieces of this size, in parallel, and progress is reported
// after each piece.
constexpr uint64_t kHashPiece = 64u << 20;
constexpr unsigned kMaxHashThreads = 4;

// XXH3-128 over the canonical config, then per tensor its name, dtype, shape and the
// XXH3-128 digests of its kHashPiece pieces (hashed by up to kMaxHashThreads threads:
// at ~3-10 GB/s per core, a 2 GB model is a fraction of a second).
std::string Fingerprint(const std::string& config, const std::vector<HashItem>& items, const LoadOptions& opts) {
  struct Piece {
    const uint8_t* data;
    uint64_t n;
    std::string digest;
  };
  std::vector<std::vector<Piece>> pieces(items.size());
  std::vector<Piece*> work;
  uint64_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const uint8_t* p = static_cast<const uint8_t*>(items[i].data);
    for (uint64_t off = 0; off == 0 || off < items[i].nbytes; off += kHashPiece) {
      pieces[i].push_back({p + off, std::min(kHashPiece, items[i].nbytes - off), {}});
    }
    total += items[i].nbytes;
  }
  for (auto& v : pieces) {
    for (Piece& p : v) work.push_back(&p);
  }
  std::atomic<size_t> next{0};
  std::mutex mu;  // serialises progress calls
  uint64_t done = 0;
  if (opts.progress) opts.progress(0, total);
  auto worker = [&] {
    for (size_t k; (k = next.fetch_add(1)) < work.size();) {
      Hasher h;
      h.Update(work[k]->data, work[k]->n);
      work[k]->digest = h.Hex();
      std::lock_guard<std::mutex> lock(mu);
      done += work[k]->n;
      if (opts.progress) opts.progress(done, total);
    }
  };
  unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, kMaxHashThreads);
  if (total < 2 * kHashPiece) n_threads = 1;
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < n_threads; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();

  Hasher hasher;
  hasher.UpdatePod(static_cast<uint64_t>(config.size()));
  hasher.Update(config);
  for (size_t i = 0; i < items.size(); ++i) {
    const HashItem& h = items[i];
    hasher.UpdatePod(static_cast<uint64_t>(h.name.size()));
    hasher.Update(h.name);
    hasher.Update(std::string(DTypeName(h.dtype)) + ";");
    hasher.UpdatePod(static_cast<uint64_t>(h.shape.size()));
    for (int64_t d : h.shape) hasher.UpdatePod(d);
    hasher.UpdatePod(h.nbytes);
    for (const Piece& p : pieces[i]) hasher.Update(p.digest);
  }
  return hasher.Hex();
}

}  // namespace

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path, const LoadOptions& opts) {
  if (IsDirectory(path)) return LoadHfDirectory(path, opts);
  if (!FileExists(path)) return NotFoundError("model path '" + path + "' does not exist");
  return LoadGgufFile(path, opts);
}

ModelBuilder::ModelBuilder(std::string path, bool is_gguf) : model_(new Model()) {
  model_->path_ = std::move(path);
  model_->is_gguf_ = is_gguf;
}

StatusOr<uint8_t*> ModelBuilder::OwnRaw(size_t bytes) {
  if (bytes == 0) return static_cast<uint8_t*>(nullptr);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return ResourceExhaustedError("cannot allocate " + std::to_string(bytes) + " bytes");
  ::madvise(p, bytes, MADV_HUGEPAGE);  // advisory: ignored where unsupported
  model_->owned_maps_.emplace_back(p, [bytes](void* q) { ::munmap(q, bytes); });
  return static_cast<uint8_t*>(p);
}

const uint8_t* ModelBuilder::Own(AlignedBuffer buf) {
  model_->owned_.push_back(std::move(buf));
  return model_->owned_.back().data();
}

StatusOr<WeightTensor> ModelBuilder::BindMatrix(const std::string& name, const SourceTensor& t) {
  WeightTensor w;
  w.dtype = t.dtype;
  w.shape = t.shape;
  const size_t elem_align = t.dtype == DType::kF32 ? 4 : 2;
  if (DTypeIsBlock(t.dtype) && t.shape.size() == 2 && t.shape[1] % DTypeBlockSize(t.dtype) != 0) {
    return DataLossError("tensor '" + name + "': " + DTypeName(t.dtype) + " rows of " + std::to_string(t.shape[1]) +
                         " are not whole blocks of " + std::to_string(DTypeBlockSize(t.dtype)));
  }
  if (reinterpret_cast<uintptr_t>(t.data) % elem_align == 0) {
    w.data = t.data;  // zero-copy: points into the mapped file
  } else {
    AlignedBuffer copy(t.nbytes);  // misaligned in the file: compute needs aligned elements
    std::memcpy(copy.data(), t.data, t.nbytes);
    w.data = Own(std::move(copy));
  }
  model_->weight_bytes_ += t.nbytes;
  return w;
}

StatusOr<const float*> ModelBuilder::BindVector(const std::string& name, const SourceTensor& t) {
  const size_t n = static_cast<size_t>(t.shape[0]);
  if (DTypeIsBlock(t.dtype) && n % static_cast<size_t>(DTypeBlockSize(t.dtype)) != 0) {
    return DataLossError("tensor '" + name + "': " + DTypeName(t.dtype) + " size not whole blocks");
  }
  AlignedBuffer buf(n * sizeof(float));
  ConvertToF32(t.dtype, t.data, buf.as<float>(), n);
  model_->weight_bytes_ += n * sizeof(float);
  return reinterpret_cast<const float*>(Own(std::move(buf)));
}

StatusOr<std::unique_ptr<Model>> ModelBuilder::Finish(const std::map<std::string, SourceTensor>& tensors,
                                                       const LoadOptions& opts) {
  ModelConfig& c = model_->config_;
  ATTIC_RETURN_IF_ERROR(c.Validate());
  for (const auto& [name, t] : tensors) {
    if (name.find(".self_attn.o_proj.bias") != std::string::npos) {
      return UnimplementedError("tensor '" + name + "': o_proj biases are not supported");
    }
  }
  ModelWeights& w = model_->weights_;
  w.layers.assign(static_cast<size_t>(c.n_layers), LayerWeights());
  std::vector<HashItem> hash_items;

  for (const TensorSpec& spec : ModelTensorSpecs(c)) {
    auto it = tensors.find(spec.name);
    if (it == tensors.end()) {
      return NotFoundError("checkpoint '" + model_->path_ + "' has no tensor '" + spec.name + "'");
    }
    const SourceTensor& t = it->second;
    if (t.shape != spec.shape) {
      return DataLossError("tensor '" + spec.name + "' in " + t.origin + " has shape " + ShapeString(t.shape) +
                           ", the config needs " + ShapeString(spec.shape));
    }
    if (t.nbytes != DTypeBytes(t.dtype, static_cast<size_t>(spec.numel()))) {
      return DataLossError("tensor '" + spec.name + "' in " + t.origin + ": size does not match its shape and dtype");
    }
    const std::string& n = spec.name;
    auto ends = [&](const char* suffix) {
      size_t len = std::strlen(suffix);
      return n.size() >= len && n.compare(n.size() - len, len, suffix) == 0;
    };
    if (spec.kind == TensorKind::kMatrix) {
      ATTIC_ASSIGN_OR_RETURN(WeightTensor wt, BindMatrix(n, t));
      hash_items.push_back({n, wt.dtype, wt.shape, wt.data, t.nbytes});
      if (spec.layer < 0) {
        (n == "lm_head.weight" ? w.lm_head : w.tok_embeddings) = std::move(wt);
        continue;
      }
      LayerWeights& L = w.layers[static_cast<size_t>(spec.layer)];
      WeightTensor* dst = ends("q_proj.weight")  ? &L.wq
                          : ends("k_proj.weight") ? &L.wk
                          : ends("v_proj.weight") ? &L.wv
                          : ends("o_proj.weight") ? &L.wo
                          : ends("gate_proj.weight") ? &L.w_gate
                          : ends("up_proj.weight") ? &L.w_up
                                                   : &L.w_down;
      *dst = std::move(wt);
      continue;
    }
    ATTIC_ASSIGN_OR_RETURN(const float* v, BindVector(n, t));
    hash_items.push_back({n, DType::kF32, spec.shape, v, static_cast<uint64_t>(spec.numel()) * 4});
    if (spec.layer < 0) {
      w.final_norm = v;
      continue;
    }
    LayerWeights& L = w.layers[static_cast<size_t>(spec.layer)];
    const float** dst = ends("input_layernorm.weight") ? &L.attn_norm
                        : ends("post_attention_layernorm.weight") ? &L.ffn_norm
                        : ends("q_proj.bias") ? &L.bq
                        : ends("k_proj.bias") ? &L.bk
                                              : &L.bv;
    *dst = v;
  }
  if (c.tie_word_embeddings) {
    w.lm_head = w.tok_embeddings;
    // Hashed under its own name like an untied head, so that a tied and an untied
    // checkpoint that compute the same thing get the same fingerprint.
    hash_items.push_back({"lm_head.weight", w.lm_head.dtype, w.lm_head.shape, w.lm_head.data,
                          w.lm_head.stored_bytes()});
  }
  model_->weight_dtype_ = w.layers[0].wq.dtype;

  model_->fingerprint_ = Fingerprint(CanonicalConfigString(c), hash_items, opts);
  return std::move(model_);
}

}  // namespace attic::model
