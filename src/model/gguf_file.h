// GGUF (v2/v3): parsing a memory-mapped file into its metadata and tensor table.
// Every length, count and offset is checked against the file size before it is used,
// so a corrupt or hostile file yields DataLoss (never an out-of-bounds read or an
// allocation larger than a constant times the file size).
//
// Layout (little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv,
//   n_kv x (string key, u32 type, value), n_tensors x (string name, u32 n_dims,
//   u64 ne[n_dims] (ne[0] innermost), u32 ggml_type, u64 offset), padding to
//   general.alignment (default 32), data section. Strings are u64 length + bytes.
//
// Thread-safety: a parsed GgufFile is immutable; share freely.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attic/core/status.h"
#include "attic/tensor/dtype.h"

namespace attic::model {

enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// ggml tensor types Attic reads (others are parsed, sized when known, and rejected at load).
constexpr uint32_t kGgmlF32 = 0;
constexpr uint32_t kGgmlF16 = 1;
constexpr uint32_t kGgmlQ8_0 = 8;
constexpr uint32_t kGgmlBF16 = 30;

// One metadata value. Scalars use one of i/u/f/b/str by type; arrays hold their
// elements in `strs` (strings), `ints` (integers and bools), `floats` or `arrays`.
struct GgufValue {
  GgufType type = GgufType::kU8;
  GgufType elem_type = GgufType::kU8;  // arrays only
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  bool b = false;
  std::string str;
  std::vector<std::string> strs;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<GgufValue> arrays;

  bool is_integer() const;  // any integer type (not bool)
  bool is_number() const;   // integer or float
  // Value as a signed integer; false when not an integer or out of int64 range.
  bool AsInt64(int64_t* out) const;
  double AsDouble() const;  // numbers only
  size_t array_size() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the innermost (contiguous) dimension
  uint32_t ggml_type = 0;
  uint64_t offset = 0;        // relative to the data section
  uint64_t nbytes = 0;        // 0 when the type is unknown to Attic
  const uint8_t* data = nullptr;  // into the mapped file; nullptr when the type is unknown
  std::optional<DType> dtype;     // a type Attic computes with (DTypeOfGgmlType), else nullopt
};

struct GgufFile {
  uint32_t version = 0;
  std::vector<std::pair<std::string, GgufValue>> kv;  // file order
  std::vector<std::pair<uint64_t, uint64_t>> kv_spans;  // each pair's [begin, end) bytes in the file
  std::map<std::string, size_t> kv_index;
  std::vector<GgufTensorInfo> tensors;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;  // absolute offset of the data section

  const GgufValue* Find(const std::string& key) const;
  const GgufTensorInfo* FindTensor(const std::string& name) const;
};

// Parses `size` bytes at `data` (a mapped file); tensor data pointers point into it.
StatusOr<GgufFile> ParseGguf(const uint8_t* data, size_t size, const std::string& path);

// The Attic dtype of a ggml type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K,
// IQ4_NL, IQ4_XS), or nullopt; and back.
std::optional<DType> DTypeOfGgmlType(uint32_t type);
uint32_t GgmlTypeOf(DType t);
// The ggml type names Attic computes with, for error messages: "F32, F16, BF16, Q4_0, ...".
std::string SupportedGgmlTypeNames();

// "F32", "Q4_K", ... or "type N".
std::string GgmlTypeName(uint32_t type);

}  // namespace attic::model
