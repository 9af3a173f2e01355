// Tokenizer data in GGUF form (tokenizer.ggml.* metadata): reading it from a parsed
// GGUF file, and building it from a Hugging Face tokenizer.json for the GGUF writer.
//
// Thread-safety: stateless free functions.
#pragma once

#include <memory>

#include "attic/model/model.h"
#include "model/gguf_file.h"

namespace attic::model {

// The embedded tokenizer; nullptr (not an error) when the file has no
// tokenizer.ggml.model / tokenizer.ggml.tokens. Ill-typed or inconsistent keys -> DataLoss.
StatusOr<std::unique_ptr<GgufTokenizerData>> ReadGgufTokenizer(const GgufFile& f);

}  // namespace attic::model
