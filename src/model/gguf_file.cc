#include "model/gguf_file.h"

#include <cstring>

namespace attic::model {

namespace {

constexpr int kMaxArrayDepth = 4;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS

struct GgmlTypeInfo {
  uint32_t type;
  const char* name;
  uint64_t block;  // elements per block
  uint64_t bytes;  // bytes per block
};

constexpr GgmlTypeInfo kGgmlTypes[] = {
    {0, "F32", 1, 4},       {1, "F16", 1, 2},      {2, "Q4_0", 32, 18},   {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},   {8, "Q8_0", 32, 34},   {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},  {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {15, "Q8_K", 256, 292},
    {16, "IQ2_XXS", 256, 66}, {20, "IQ4_NL", 32, 18}, {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},     {25, "I16", 1, 2},
    {26, "I32", 1, 4},      {27, "I64", 1, 8},     {28, "F64", 1, 8},     {30, "BF16", 1, 2},
};

const GgmlTypeInfo* FindGgmlType(uint32_t t) {
  for (const auto& g : kGgmlTypes) {
    if (g.type == t) return &g;
  }
  return nullptr;
}

// Bounds-checked little-endian cursor over the mapped file.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& path) : data_(data), size_(size), path_(path) {}
  size_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  Status Truncated(const char* what) const {
    return DataLossError(path_ + ": truncated GGUF: " + what + " at offset " + std::to_string(pos_) +
                         " runs past the end of the file (" + std::to_string(size_) + " bytes)");
  }
  Status Bytes(void* out, size_t n, const char* what) {
    if (remaining() < n) return Truncated(what);
    std::memcpy(out, data_ + pos_, n);
    pos_ += n;
    return OkStatus();
  }
  template <typename T>
  Status Pod(T* out, const char* what) {
    return Bytes(out, sizeof(T), what);
  }
  Status String(std::string* out, const char* what) {
    uint64_t n = 0;
    ATTIC_RETURN_IF_ERROR(Pod(&n, what));
    if (n > remaining()) {
      return DataLossError(path_ + ": GGUF " + what + " length " + std::to_string(n) + " at offset " +
                           std::to_string(pos_ - 8) + " runs past the end of the file (" + std::to_string(size_) +
                           " bytes)");
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return OkStatus();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

// Smallest encoded size of one element of `t`, to bound array counts by the bytes left.
uint64_t MinEncodedSize(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: case GgufType::kString: return 8;
    case GgufType::kArray: return 12;
  }
  return 1;
}

bool IsKnownType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kF64); }

Status ReadScalar(Reader& r, GgufType t, GgufValue* v) {
  v->type = t;
  switch (t) {
#define ATTIC_GGUF_INT(kind, ctype, field)             \
  case GgufType::kind: {                               \
    ctype x{};                                         \
    ATTIC_RETURN_IF_ERROR(r.Pod(&x, "metadata value")); \
    v->field = x;                                      \
    v->i = static_cast<int64_t>(x);                    \
    v->u = static_cast<uint64_t>(x);                   \
    return OkStatus();                                 \
  }
    ATTIC_GGUF_INT(kU8, uint8_t, u)
    ATTIC_GGUF_INT(kI8, int8_t, i)
    ATTIC_GGUF_INT(kU16, uint16_t, u)
    ATTIC_GGUF_INT(kI16, int16_t, i)
    ATTIC_GGUF_INT(kU32, uint32_t, u)
    ATTIC_GGUF_INT(kI32, int32_t, i)
    ATTIC_GGUF_INT(kU64, uint64_t, u)
    ATTIC_GGUF_INT(kI64, int64_t, i)
#undef ATTIC_GGUF_INT
    case GgufType::kF32: {
      float x = 0;
      ATTIC_RETURN_IF_ERROR(r.Pod(&x, "metadata value"));
      v->f = x;
      return OkStatus();
    }
    case GgufType::kF64:
      return r.Pod(&v->f, "metadata value");
    case GgufType::kBool: {
      uint8_t x = 0;
      ATTIC_RETURN_IF_ERROR(r.Pod(&x, "metadata value"));
      v->b = x != 0;
      v->i = v->b;
      v->u = v->b;
      return OkStatus();
    }
    case GgufType::kString:
      return r.String(&v->str, "metadata string");
    case GgufType::kArray:
      break;
  }
  return InternalError("ReadScalar on an array");
}

Status ReadValue(Reader& r, GgufType t, int depth, GgufValue* v, const std::string& path) {
  if (t != GgufType::kArray) return ReadScalar(r, t, v);
  if (depth >= kMaxArrayDepth) return DataLossError(path + ": GGUF arrays nested too deeply");
  v->type = t;
  uint32_t et = 0;
  uint64_t n = 0;
  ATTIC_RETURN_IF_ERROR(r.Pod(&et, "array type"));
  ATTIC_RETURN_IF_ERROR(r.Pod(&n, "array count"));
  if (!IsKnownType(et)) return DataLossError(path + ": GGUF array of unknown type " + std::to_string(et));
  v->elem_type = static_cast<GgufType>(et);
  if (n > r.remaining() / MinEncodedSize(v->elem_type)) {
    return DataLossError(path + ": GGUF array count " + std::to_string(n) + " at offset " + std::to_string(r.pos() - 8) +
                         " runs past the end of the file");
  }
  GgufValue e;
  switch (v->elem_type) {
    case GgufType::kString:
      v->strs.resize(n);
      for (uint64_t k = 0; k < n; ++k) ATTIC_RETURN_IF_ERROR(r.String(&v->strs[k], "array string"));
      return OkStatus();
    case GgufType::kF32:
    case GgufType::kF64:
      v->floats.reserve(n);
      for (uint64_t k = 0; k < n; ++k) {
        ATTIC_RETURN_IF_ERROR(ReadScalar(r, v->elem_type, &e));
        v->floats.push_back(e.f);
      }
      return OkStatus();
    case GgufType::kArray:
      v->arrays.resize(n);
      for (uint64_t k = 0; k < n; ++k) {
        ATTIC_RETURN_IF_ERROR(ReadValue(r, GgufType::kArray, depth + 1, &v->arrays[k], path));
      }
      return OkStatus();
    default:
      v->ints.reserve(n);
      for (uint64_t k = 0; k < n; ++k) {
        ATTIC_RETURN_IF_ERROR(ReadScalar(r, v->elem_type, &e));
        v->ints.push_back(e.i);
      }
      return OkStatus();
  }
}

Status ReadTensorInfo(Reader& r, GgufTensorInfo* t, const std::string& path) {
  ATTIC_RETURN_IF_ERROR(r.String(&t->name, "tensor name"));
  uint32_t n_dims = 0;
  ATTIC_RETURN_IF_ERROR(r.Pod(&n_dims, "tensor n_dims"));
  if (n_dims > kMaxDims) {
    return DataLossError(path + ": tensor '" + t->name + "' has " + std::to_string(n_dims) + " dimensions (max 4)");
  }
  t->ne.resize(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) ATTIC_RETURN_IF_ERROR(r.Pod(&t->ne[d], "tensor dims"));
  ATTIC_RETURN_IF_ERROR(r.Pod(&t->ggml_type, "tensor type"));
  return r.Pod(&t->offset, "tensor offset");
}

// Sizes a tensor and checks that it lies inside the file.
Status PlaceTensor(GgufTensorInfo* t, const uint8_t* data, size_t size, uint64_t data_offset, uint64_t alignment,
                   const std::string& path) {
  auto bad = [&](const std::string& m) { return DataLossError(path + ": tensor '" + t->name + "': " + m); };
  // The GGUF spec (and llama.cpp's reader): a tensor's offset is a multiple of the
  // alignment; a misaligned one would hand out misaligned element pointers.
  if (t->offset % alignment != 0)
    return bad("offset " + std::to_string(t->offset) + " is not a multiple of the alignment " + std::to_string(alignment));
  uint64_t numel = 1;
  for (uint64_t n : t->ne) {
    if (n > (uint64_t{1} << 40) || (n != 0 && numel > UINT64_MAX / n)) return bad("dimensions are too large");
    numel *= n;
  }
  const GgmlTypeInfo* info = FindGgmlType(t->ggml_type);
  if (info == nullptr) return OkStatus();  // unknown type: rejected if the loader needs it
  uint64_t ne0 = t->ne.empty() ? 1 : t->ne[0];
  if (ne0 % info->block != 0) {
    return bad("innermost dimension " + std::to_string(ne0) + " is not a multiple of the " + info->name +
               " block size " + std::to_string(info->block));
  }
  if (numel / info->block > UINT64_MAX / info->bytes) return bad("size overflows");
  t->nbytes = numel / info->block * info->bytes;
  if (data_offset > size || t->offset > size - data_offset || t->nbytes > size - data_offset - t->offset) {
    return bad("data [" + std::to_string(t->offset) + ", +" + std::to_string(t->nbytes) +
               ") runs past the end of the file (truncated?)");
  }
  t->data = data + data_offset + t->offset;
  t->dtype = DTypeOfGgmlType(t->ggml_type);
  return OkStatus();
}

}  // namespace

std::optional<DType> DTypeOfGgmlType(uint32_t type) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (GgmlTypeOf(static_cast<DType>(i)) == type) return static_cast<DType>(i);
  }
  return std::nullopt;
}

uint32_t GgmlTypeOf(DType t) {
  switch (t) {
    case DType::kF32: return kGgmlF32;
    case DType::kF16: return kGgmlF16;
    case DType::kBF16: return kGgmlBF16;
    case DType::kQ8_0: return kGgmlQ8_0;
    case DType::kQ4_0: return 2;
    case DType::kQ4_1: return 3;
    case DType::kQ5_0: return 6;
    case DType::kQ5_1: return 7;
    case DType::kQ2_K: return 10;
    case DType::kQ3_K: return 11;
    case DType::kQ4_K: return 12;
    case DType::kQ5_K: return 13;
    case DType::kQ6_K: return 14;
    case DType::kIQ4_NL: return 20;
    case DType::kIQ4_XS: return 23;
  }
  return kGgmlF32;
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kU16: case GgufType::kI16:
    case GgufType::kU32: case GgufType::kI32: case GgufType::kU64: case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

bool GgufValue::is_number() const { return is_integer() || type == GgufType::kF32 || type == GgufType::kF64; }

bool GgufValue::AsInt64(int64_t* out) const {
  if (!is_integer()) return false;
  if (type == GgufType::kU64 && u > static_cast<uint64_t>(INT64_MAX)) return false;
  *out = type == GgufType::kU64 ? static_cast<int64_t>(u) : i;
  return true;
}

double GgufValue::AsDouble() const {
  if (type == GgufType::kF32 || type == GgufType::kF64) return f;
  if (type == GgufType::kU64) return static_cast<double>(u);
  return static_cast<double>(i);
}

size_t GgufValue::array_size() const {
  return strs.size() + ints.size() + floats.size() + arrays.size();
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = kv_index.find(key);
  return it == kv_index.end() ? nullptr : &kv[it->second].second;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  for (const GgufTensorInfo& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string SupportedGgmlTypeNames() {
  std::string out;
  for (int i = 0; i < kNumDTypes; ++i) out += (i ? ", " : "") + GgmlTypeName(GgmlTypeOf(static_cast<DType>(i)));
  return out;
}

std::string GgmlTypeName(uint32_t type) {
  const GgmlTypeInfo* info = FindGgmlType(type);
  return info != nullptr ? info->name : "type " + std::to_string(type);
}

StatusOr<GgufFile> ParseGguf(const uint8_t* data, size_t size, const std::string& path) {
  Reader r(data, size, path);
  char magic[4];
  if (size < 4 || std::memcmp(data, "GGUF", 4) != 0) return DataLossError(path + ": not a GGUF file (bad magic)");
  ATTIC_RETURN_IF_ERROR(r.Bytes(magic, 4, "magic"));
  GgufFile f;
  ATTIC_RETURN_IF_ERROR(r.Pod(&f.version, "version"));
  if (f.version == 0x02000000u || f.version == 0x03000000u) {
    return UnimplementedError(path + ": big-endian GGUF files are not supported");
  }
  if (f.version != 2 && f.version != 3) {
    return UnimplementedError(path + ": GGUF version " + std::to_string(f.version) + " is not supported (2 or 3)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  ATTIC_RETURN_IF_ERROR(r.Pod(&n_tensors, "tensor count"));
  ATTIC_RETURN_IF_ERROR(r.Pod(&n_kv, "metadata count"));
  // Each metadata pair takes >= 13 bytes and each tensor info >= 24: counts beyond what
  // the file could hold are corrupt, and must not size an allocation.
  if (n_kv > r.remaining() / 13 || n_tensors > r.remaining() / 24) {
    return DataLossError(path + ": GGUF counts (" + std::to_string(n_kv) + " metadata, " + std::to_string(n_tensors) +
                         " tensors) exceed what the file can hold");
  }
  f.kv.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t kv_begin = r.pos();
    std::string key;
    uint32_t type = 0;
    ATTIC_RETURN_IF_ERROR(r.String(&key, "metadata key"));
    ATTIC_RETURN_IF_ERROR(r.Pod(&type, "metadata type"));
    if (!IsKnownType(type)) {
      return DataLossError(path + ": metadata '" + key + "' has unknown type " + std::to_string(type));
    }
    GgufValue v;
    Status st = ReadValue(r, static_cast<GgufType>(type), 0, &v, path);
    if (!st.ok()) return st.WithContext("metadata '" + key + "'");
    if (!f.kv_index.emplace(key, f.kv.size()).second) return DataLossError(path + ": duplicate metadata key '" + key + "'");
    f.kv.emplace_back(std::move(key), std::move(v));
    f.kv_spans.emplace_back(kv_begin, r.pos());
  }
  f.tensors.resize(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) ATTIC_RETURN_IF_ERROR(ReadTensorInfo(r, &f.tensors[k], path));

  if (const GgufValue* a = f.Find("general.alignment")) {
    int64_t align = 0;
    if (!a->AsInt64(&align) || align <= 0 || (align & (align - 1)) != 0 || align > (1 << 20)) {
      return DataLossError(path + ": general.alignment must be a power of two");
    }
    f.alignment = static_cast<uint64_t>(align);
  }
  f.data_offset = (r.pos() + f.alignment - 1) / f.alignment * f.alignment;
  for (GgufTensorInfo& t : f.tensors)
    ATTIC_RETURN_IF_ERROR(PlaceTensor(&t, data, size, f.data_offset, f.alignment, path));
  return f;
}

}  // namespace attic::model
