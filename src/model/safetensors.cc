#include "model/safetensors.h"

#include <cstring>

#include "model/json_util.h"

namespace attic::model {

namespace {

// Bytes per element of every safetensors dtype; 0 = unknown name.
uint64_t ElementSize(const std::string& name) {
  static const struct {
    const char* name;
    uint64_t size;
  } kSizes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
                {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},   {"BOOL", 1}, {"F8_E4M3", 1},
                {"F8_E5M2", 1}};
  for (const auto& s : kSizes) {
    if (name == s.name) return s.size;
  }
  return 0;
}

std::optional<DType> ComputeDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return std::nullopt;
}

Status ParseEntry(const std::string& name, const Json& v, const uint8_t* base, uint64_t data_size,
                  SafetensorsEntry* e) {
  auto bad = [&](const std::string& m) { return DataLossError("tensor '" + name + "': " + m); };
  if (!v.is_object()) return bad("header entry is not an object");
  e->name = name;
  const Json* dt = FindMember(v, "dtype");
  if (dt == nullptr || !dt->is_string()) return bad("missing 'dtype'");
  e->dtype_name = dt->get<std::string>();
  e->dtype = ComputeDType(e->dtype_name);

  const Json* shape = FindMember(v, "shape");
  if (shape == nullptr || !shape->is_array()) return bad("missing 'shape'");
  if (shape->size() > 8) return bad("more than 8 dimensions");
  uint64_t numel = 1;
  for (const Json& d : *shape) {
    if (!d.is_number_unsigned()) return bad("shape entries must be non-negative integers");
    uint64_t n = d.get<uint64_t>();
    if (n > (uint64_t{1} << 40) || (n != 0 && numel > UINT64_MAX / n)) return bad("shape is too large");
    numel *= n;
    e->shape.push_back(static_cast<int64_t>(n));
  }
  const Json* off = FindMember(v, "data_offsets");
  if (off == nullptr || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    return bad("'data_offsets' must be two non-negative integers");
  }
  uint64_t begin = (*off)[0].get<uint64_t>();
  uint64_t end = (*off)[1].get<uint64_t>();
  if (begin > end || end > data_size) {
    return bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
               "] lie outside the data section of " + std::to_string(data_size) + " bytes (truncated file?)");
  }
  uint64_t elem = ElementSize(e->dtype_name);
  if (elem != 0 && (numel > UINT64_MAX / elem || end - begin != numel * elem)) {
    return bad("data_offsets span " + std::to_string(end - begin) + " bytes but shape x " + e->dtype_name +
               " needs " + std::to_string(numel * elem));
  }
  e->data = base + begin;
  e->nbytes = end - begin;
  return OkStatus();
}

}  // namespace

const char* SafetensorsDTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    default: return "?";  // block types are not safetensors dtypes; never written
  }
  return "?";
}

StatusOr<std::vector<SafetensorsEntry>> ParseSafetensors(const uint8_t* data, size_t size, const std::string& path) {
  auto bad = [&](const std::string& m) { return DataLossError(path + ": " + m); };
  if (size < 8) return bad("file of " + std::to_string(size) + " bytes is too small for a safetensors header");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > size - 8) {
    return bad("header length " + std::to_string(header_len) + " runs past the end of the file (" +
               std::to_string(size) + " bytes)");
  }
  if (header_len > kMaxSafetensorsHeader) return bad("header length " + std::to_string(header_len) + " exceeds 100 MiB");
  std::string text(reinterpret_cast<const char*>(data + 8), header_len);
  auto parsed = ParseJson(text, path + " header");
  if (!parsed.ok()) return parsed.status();
  const Json& j = *parsed;
  if (!j.is_object()) return bad("header is not a JSON object");

  const uint8_t* base = data + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::vector<SafetensorsEntry> out;
  out.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    SafetensorsEntry e;
    Status st = ParseEntry(it.key(), it.value(), base, data_size, &e);
    if (!st.ok()) return st.WithContext(path);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace attic::model
