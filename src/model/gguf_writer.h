// GgufHeaderBuilder: assembles the header of a GGUF v3 file (metadata, tensor infos,
// padding to the alignment); the caller then writes each tensor's data in the order
// added, each padded to the alignment. Used by WriteGgufModel and by tests that craft
// (possibly corrupt) GGUF files.
//
// Thread-safety: none; one builder per file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/gguf_file.h"

namespace attic::model {

class GgufHeaderBuilder {
 public:
  explicit GgufHeaderBuilder(uint64_t alignment = 32) : alignment_(alignment) {}

  void Str(const std::string& key, const std::string& v);
  void U32(const std::string& key, uint32_t v);
  void I32(const std::string& key, int32_t v);
  void F32(const std::string& key, float v);
  void Bool(const std::string& key, bool v);
  void StrArray(const std::string& key, const std::vector<std::string>& v);
  void I32Array(const std::string& key, const std::vector<int32_t>& v);
  void F32Array(const std::string& key, const std::vector<float>& v);
  // A metadata pair copied as encoded (key, type, value) from another GGUF file.
  void RawPair(const std::string& encoded) {
    kv_ += encoded;
    ++n_kv_;
  }
  // Adds a tensor info; its data offset is the next aligned slot. `ne` in ggml order.
  void Tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t ggml_type, uint64_t nbytes);

  // Magic, version 3, counts, metadata, tensor infos, zero padding to the alignment.
  std::string Build() const;
  uint64_t alignment() const { return alignment_; }
  // Bytes of the data section (every tensor padded).
  uint64_t data_bytes() const { return next_offset_; }
  static uint64_t Padding(uint64_t n, uint64_t alignment) { return (alignment - n % alignment) % alignment; }

 private:
  void Key(const std::string& key, GgufType type);
  uint64_t alignment_;
  std::string kv_, infos_;
  uint64_t n_kv_ = 0, n_tensors_ = 0, next_offset_ = 0;
};

// Appends a GGUF string (u64 length + bytes) / little-endian POD to `out`.
void AppendGgufString(std::string* out, const std::string& s);
template <typename T>
void AppendPod(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

}  // namespace attic::model
