// Safetensors: parsing the header of a memory-mapped file into a tensor table, with
// every offset and size checked against the file so that a corrupt file yields DataLoss
// and never an out-of-bounds read.
//
// Layout: u64 little-endian header length N, N bytes of JSON
//   {"__metadata__": {...}, "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
// then the data section; offsets are relative to its start (8 + N).
//
// Thread-safety: stateless free functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attic/core/status.h"
#include "attic/tensor/dtype.h"

namespace attic::model {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;      // as written, e.g. "BF16"
  std::optional<DType> dtype;  // F32/F16/BF16; nullopt for dtypes Attic cannot compute with
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapped file
  uint64_t nbytes = 0;
};

// The header may not exceed this (the safetensors format's own limit).
constexpr uint64_t kMaxSafetensorsHeader = 100u << 20;

// Parses the header of `size` bytes at `data`. `path` names the file in messages.
StatusOr<std::vector<SafetensorsEntry>> ParseSafetensors(const uint8_t* data, size_t size, const std::string& path);

// "F32"/"F16"/"BF16" for the dtypes Attic writes.
const char* SafetensorsDTypeName(DType t);

}  // namespace attic::model
