// GGUF header, metadata and tensor table (src/model/gguf_file.cc), and the tokenizer
// read from that metadata (src/model/gguf_tokenizer.cc, Tokenizer::FromGguf).
//
// Invariants: no crash; on success every tensor whose type Attic knows lies inside the
// file, after the data section's start, at the file's alignment; a tokenizer built from
// the metadata only returns ids inside its vocabulary.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attic/tokenizer/tokenizer.h"
#include "fuzz_check.h"
#include "model/gguf_file.h"
#include "model/gguf_tokenizer.h"

using namespace attic;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy at its own address, as a mapped file would be (and so ASan sees its bounds).
  std::unique_ptr<uint8_t[]> file(new uint8_t[size == 0 ? 1 : size]);
  if (size > 0) std::memcpy(file.get(), data, size);
  auto f = model::ParseGguf(file.get(), size, "fuzz.gguf");
  if (!f.ok()) return 0;
  // (A file whose tensors hold no data Attic reads -- none, or only of unknown types --
  // may end before its aligned data section would start.)
  bool placed = false;
  for (const auto& t : f->tensors) placed = placed || t.data != nullptr;
  FUZZ_CHECK(!placed || f->data_offset <= size, "data section at %llu of %zu", (unsigned long long)f->data_offset,
             size);
  FUZZ_CHECK(f->alignment > 0);
  for (const auto& t : f->tensors) {
    if (t.data == nullptr) continue;
    const uint8_t* begin = file.get() + f->data_offset;
    FUZZ_CHECK(t.data >= begin && t.data <= file.get() + size, "tensor %s outside the file", t.name.c_str());
    FUZZ_CHECK(t.nbytes <= static_cast<uint64_t>(file.get() + size - t.data), "tensor %s runs past the end",
               t.name.c_str());
    FUZZ_CHECK(t.offset % f->alignment == 0, "tensor %s misaligned", t.name.c_str());
  }
  for (const auto& [key, value] : f->kv) FUZZ_CHECK(f->Find(key) != nullptr);
  auto data_tok = model::ReadGgufTokenizer(*f);
  if (!data_tok.ok() || *data_tok == nullptr) return 0;  // nullptr: the file has no tokenizer
  auto tok = tokenizer::Tokenizer::FromGguf(**data_tok);
  if (!tok.ok()) return 0;
  const int n = (*tok)->vocab_size();
  FUZZ_CHECK(n > 0);
  for (const char* text : {"Hello world", "  a\tb\n", "\xC3\xA9t\xC3\xA9 \xF0\x9F\x98\x80"}) {
    auto ids = (*tok)->Encode(text);
    if (!ids.ok()) continue;
    for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < n, "id %d of %d", id, n);
    (void)(*tok)->Decode(*ids);
  }
  return 0;
}
