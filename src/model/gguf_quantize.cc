// `attic quantize`: a GGUF file rewritten with its matrices in block types, as llama.cpp's
// quantizer does: metadata copied (general.file_type set to the preset's), tensors in the
// same order, each 2-D weight widened to f32 and quantized (QuantizeBlocks) to the type
// its preset gives it (f16 where its rows are not whole blocks of that type, as llama.cpp
// does), every other tensor copied as it is. Rows stay in GGUF order (the
// q/k permutation only moves whole rows).
#include "attic/model/gguf_quantize.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "attic/model/tensor_specs.h"

#include "attic/core/file.h"
#include "attic/tensor/quants.h"
#include "model/gguf_file.h"
#include "model/gguf_writer.h"
#include "model/weight_source.h"

namespace attic::model {

namespace {

// The HF tensor spec of a GGUF matrix (for the preset's rules), or kind != kMatrix.
TensorSpec SpecOf(const GgufTensorInfo& t) {
  TensorSpec s;
  s.name = GgufToHfName(t.name);
  s.kind = TensorKind::kNorm;
  for (auto it = t.ne.rbegin(); it != t.ne.rend(); ++it) s.shape.push_back(static_cast<int64_t>(*it));
  if (s.name.empty() || t.ne.size() != 2 || !t.dtype) return s;
  if (s.name.find("norm") != std::string::npos) return s;
  s.kind = TensorKind::kMatrix;
  const std::string prefix = "model.layers.";
  if (s.name.compare(0, prefix.size(), prefix) == 0) s.layer = std::stoi(s.name.substr(prefix.size()));
  return s;
}

}  // namespace

Status QuantizeGgufFile(const std::string& in, const std::string& out, const QuantPreset& preset,
                        const std::function<void(uint64_t, uint64_t)>& progress) {
  ATTIC_ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(in));
  ATTIC_ASSIGN_OR_RETURN(GgufFile f, ParseGguf(mapped->data(), mapped->size(), in));
  ModelConfig c;
  int64_t n_layers = 0;
  if (const GgufValue* v = f.Find("llama.block_count"); v == nullptr || !v->AsInt64(&n_layers) || n_layers <= 0) {
    return InvalidArgumentError(in + ": not a llama GGUF (no llama.block_count)");
  }
  c.n_layers = static_cast<int>(n_layers);
  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;

  GgufHeaderBuilder h(f.alignment);
  for (size_t i = 0; i < f.kv.size(); ++i) {
    if (f.kv[i].first == "general.file_type") continue;
    const auto [b, e] = f.kv_spans[i];
    h.RawPair(std::string(reinterpret_cast<const char*>(mapped->data() + b), e - b));
  }
  h.U32("general.file_type", preset.file_type);
  std::vector<std::optional<DType>> types(f.tensors.size());
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const GgufTensorInfo& t = f.tensors[i];
    const TensorSpec spec = SpecOf(t);
    if (spec.kind == TensorKind::kMatrix) types[i] = PresetMatrixType(preset, spec, c);
    uint64_t n = 1;
    for (uint64_t d : t.ne) n *= d;
    // Rows that are not whole blocks of the type take f16, as llama.cpp's quantizer does
    // (stories260K's 172-wide ffn_down).
    if (types[i] && t.ne[0] % static_cast<uint64_t>(DTypeBlockSize(*types[i])) != 0) types[i] = DType::kF16;
    if (types[i] && *types[i] == *t.dtype) types[i].reset();  // already that type: copied
    if (!types[i] && t.data == nullptr) {
      return UnimplementedError(in + ": tensor '" + t.name + "' has ggml type " + GgmlTypeName(t.ggml_type) +
                                ", which cannot be copied");
    }
    h.Tensor(t.name, t.ne, types[i] ? GgmlTypeOf(*types[i]) : t.ggml_type,
             types[i] ? DTypeBytes(*types[i], n) : t.nbytes);
  }
  const std::string header = h.Build();
  ATTIC_ASSIGN_OR_RETURN(auto sink, FileSink::Create(out));
  ATTIC_RETURN_IF_ERROR(sink->Write(header.data(), header.size()));
  const uint64_t total = h.data_bytes();
  uint64_t done = 0;
  static const char kZeros[256] = {};
  std::vector<float> f32;
  std::vector<uint8_t> q;
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const GgufTensorInfo& t = f.tensors[i];
    uint64_t written;
    if (!types[i]) {
      ATTIC_RETURN_IF_ERROR(sink->Write(t.data, t.nbytes));
      written = t.nbytes;
    } else {
      // Row by row chunks: the source's blocks are whole rows (ne[0] is a block multiple).
      const uint64_t cols = t.ne[0], rows = t.ne[1];
      const uint64_t src_row = t.nbytes / rows, dst_row = DTypeBytes(*types[i], cols);
      const uint64_t chunk = std::max<uint64_t>(1, (4u << 20) / (cols * 4));
      written = 0;
      for (uint64_t r0 = 0; r0 < rows; r0 += chunk) {
        const uint64_t nr = std::min(chunk, rows - r0);
        f32.resize(nr * cols);
        q.resize(nr * dst_row);
        ConvertToF32(*t.dtype, t.data + r0 * src_row, f32.data(), nr * cols);
        if (DTypeIsBlock(*types[i])) {
          QuantizeBlocks(*types[i], f32.data(), q.data(), nr * cols);
        } else {
          ConvertFromF32(*types[i], f32.data(), q.data(), nr * cols);
        }
        ATTIC_RETURN_IF_ERROR(sink->Write(q.data(), q.size()));
        written += q.size();
        if (progress) progress(done + written, total);
      }
    }
    const uint64_t pad = GgufHeaderBuilder::Padding(written, f.alignment);
    for (uint64_t p = pad; p > 0;) {
      const uint64_t step = std::min<uint64_t>(p, sizeof(kZeros));
      ATTIC_RETURN_IF_ERROR(sink->Write(kZeros, step));
      p -= step;
    }
    done += written + pad;
    if (progress) progress(done, total);
  }
  return sink->Commit(false);
}

}  // namespace attic::model
