// `attic quantize IN OUT TYPE`: rewrites a llama GGUF file with its matrices quantized
// as `preset` says (attic/model/quant_preset.h), everything else copied.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "attic/core/status.h"
#include "attic/model/quant_preset.h"

namespace attic::model {

// Writes `out` (atomically: a partial file is never left under that name). Tensors whose
// preset type cannot hold their rows keep their type. `progress(bytes done, total)`.
Status QuantizeGgufFile(const std::string& in, const std::string& out, const QuantPreset& preset,
                        const std::function<void(uint64_t, uint64_t)>& progress = nullptr);

}  // namespace attic::model
