// Writing a Hugging Face checkpoint directory: config.json, model.safetensors (or
// model-0000i-of-0000n.safetensors + model.safetensors.index.json), tokenizer files.
#include <unistd.h>

#include "attic/core/file.h"
#include "model/json_util.h"
#include "model/safetensors.h"
#include "model/weight_source.h"

namespace attic::model {

namespace {

Status CheckStorageDType(DType d) {
  if (d == DType::kQ8_0) return InvalidArgumentError("checkpoints are written as f32, f16 or bf16, not q8_0");
  return OkStatus();
}

std::string ShardName(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// Header of one safetensors file holding `jobs`, padded with spaces to 8 bytes.
std::string SafetensorsHeader(const std::vector<const TensorJob*>& jobs, DType dtype) {
  nlohmann::ordered_json h;
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const TensorJob* j : jobs) {
    uint64_t n = DTypeBytes(dtype, static_cast<size_t>(j->spec.numel()));
    h[j->spec.name] = {{"dtype", SafetensorsDTypeName(dtype)}, {"shape", j->spec.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

Status WriteSafetensors(const std::string& path, const std::vector<const TensorJob*>& jobs, DType dtype, bool fsync,
                        WriteProgress* progress) {
  const std::string header = SafetensorsHeader(jobs, dtype);
  ATTIC_ASSIGN_OR_RETURN(auto sink, FileSink::Create(path));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  ATTIC_RETURN_IF_ERROR(sink->Write(len, 8));
  ATTIC_RETURN_IF_ERROR(sink->Write(header.data(), header.size()));
  StreamBuffers buffers;
  for (const TensorJob* j : jobs) ATTIC_RETURN_IF_ERROR(StreamTensor(*j, dtype, 0, sink.get(), progress, &buffers));
  return sink->Commit(fsync);
}

Status CopyFile(const std::string& from, const std::string& to) {
  ATTIC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(from));
  return WriteFileAtomic(to, text);
}

Status WriteHf(const std::string& dir, const ModelConfig& c, const std::vector<TensorJob>& jobs,
               const WriteOptions& opts) {
  ATTIC_RETURN_IF_ERROR(CheckStorageDType(opts.dtype));
  ATTIC_RETURN_IF_ERROR(MakeDirectories(dir));
  ModelConfig cfg = c;
  cfg.torch_dtype = opts.dtype;
  ATTIC_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(dir, "config.json"), HfConfigToJson(cfg)));

  // Group tensors into shards of at most max_shard_bytes (a larger tensor gets its own).
  std::vector<std::vector<const TensorJob*>> shards(1);
  uint64_t total = 0, in_shard = 0;
  for (const TensorJob& j : jobs) {
    uint64_t n = DTypeBytes(opts.dtype, static_cast<size_t>(j.spec.numel()));
    if (opts.max_shard_bytes > 0 && in_shard > 0 && in_shard + n > opts.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&j);
    in_shard += n;
    total += n;
  }
  WriteProgress progress{opts.progress, 0, total};
  const std::string single = JoinPath(dir, "model.safetensors");
  const std::string index = JoinPath(dir, "model.safetensors.index.json");
  if (shards.size() == 1) {
    ATTIC_RETURN_IF_ERROR(WriteSafetensors(single, shards[0], opts.dtype, opts.fsync, &progress));
    ::unlink(index.c_str());  // a stale index from an earlier sharded write
  } else {
    nlohmann::ordered_json idx;
    idx["metadata"] = {{"total_size", total}};
    idx["weight_map"] = nlohmann::ordered_json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string name = ShardName(s, shards.size());
      ATTIC_RETURN_IF_ERROR(WriteSafetensors(JoinPath(dir, name), shards[s], opts.dtype, opts.fsync, &progress));
      for (const TensorJob* j : shards[s]) idx["weight_map"][j->spec.name] = name;
    }
    ATTIC_RETURN_IF_ERROR(WriteFileAtomic(index, idx.dump(2) + "\n"));
    ::unlink(single.c_str());  // the loader prefers model.safetensors: drop a stale one
  }

  const TokenizerSource& tok = opts.tokenizer;
  if (!tok.tokenizer_json_path.empty()) {
    ATTIC_RETURN_IF_ERROR(CopyFile(tok.tokenizer_json_path, JoinPath(dir, "tokenizer.json")));
  }
  if (!tok.tokenizer_config_json_path.empty()) {
    ATTIC_RETURN_IF_ERROR(CopyFile(tok.tokenizer_config_json_path, JoinPath(dir, "tokenizer_config.json")));
  }
  if (!tok.chat_template.empty()) {
    ATTIC_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(dir, "chat_template.jinja"), tok.chat_template));
  }
  return OkStatus();
}

}  // namespace

Status WriteHfModel(const std::string& dir, const ModelConfig& c, const std::vector<NamedTensor>& tensors,
                    const WriteOptions& opts) {
  ATTIC_ASSIGN_OR_RETURN(std::vector<TensorJob> jobs, ExplicitJobs(tensors));
  return WriteHf(dir, c, jobs, opts);
}

Status WriteRandomHfModel(const std::string& dir, const ModelConfig& c, const RandomWeights& r,
                          const WriteOptions& opts) {
  ATTIC_RETURN_IF_ERROR(c.Validate());
  return WriteHf(dir, c, RandomJobs(c, r), opts);
}

}  // namespace attic::model
