// The safetensors header (src/model/safetensors.cc): an 8-byte length, a JSON object
// of tensors {dtype, shape, data_offsets}, then the data.
//
// Invariants: no crash; on success every tensor's bytes lie inside the file's data
// section and their count is the product of its shape times its element size.
#include <cstdint>
#include <cstring>
#include <memory>

#include "fuzz_check.h"
#include "attic/tensor/dtype.h"
#include "model/safetensors.h"

using namespace attic;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<uint8_t[]> file(new uint8_t[size == 0 ? 1 : size]);
  if (size > 0) std::memcpy(file.get(), data, size);
  auto entries = model::ParseSafetensors(file.get(), size, "fuzz.safetensors");
  if (!entries.ok()) return 0;
  FUZZ_CHECK(size >= 8);
  uint64_t header = 0;
  std::memcpy(&header, file.get(), 8);
  for (const auto& e : *entries) {
    FUZZ_CHECK(e.data >= file.get() + 8 + header && e.data + e.nbytes <= file.get() + size,
               "tensor %s outside the data section", e.name.c_str());
    if (!e.dtype || *e.dtype == DType::kQ8_0) continue;
    // Independent of the parser: the element count from the shape, in 128 bits.
    unsigned __int128 n = 1;
    for (int64_t d : e.shape) {
      FUZZ_CHECK(d >= 0, "negative dimension in %s", e.name.c_str());
      n *= static_cast<uint64_t>(d);
      if (n > (static_cast<unsigned __int128>(1) << 64)) break;
    }
    FUZZ_CHECK(n <= size && DTypeBytes(*e.dtype, static_cast<size_t>(n)) == e.nbytes,
               "tensor %s: %llu bytes for its shape", e.name.c_str(), (unsigned long long)e.nbytes);
  }
  return 0;
}
