#include "attic/store/entry.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "attic/attention/kv_q4.h"
#include "attic/attention/kv_q8.h"
#include "attic/core/hash.h"
#include "attic/tensor/dtype.h"

namespace attic::store {

namespace {

constexpr char kMagic[8] = {'A', 'T', 'T', 'I', 'C', 'K', 'V', '1'};
constexpr uint32_t kVersion1 = 1;  // no attachments
constexpr uint32_t kVersion2 = 2;  // an attachment table in the header, blobs after the layers
constexpr uint32_t kMaxKind = 64;
constexpr uint64_t kAlign = 4096;
// Bounds that keep a corrupt header from asking for absurd allocations.
constexpr uint32_t kMaxLayers = 1024;
constexpr uint32_t kMaxKvDim = 1 << 16;
constexpr uint32_t kMaxTokens = 1 << 22;
constexpr uint32_t kMaxString = 1 << 12;
constexpr uint32_t kMaxGroup = 32;  // attention::KvQ8Group / KvQ4Group: 32, or a smaller head_dim

uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Whether `code` is a KvDtype this build reads and writes.
bool KnownKvDtype(uint32_t code) {
  return std::any_of(std::begin(kKvDtypes), std::end(kKvDtypes),
                     [code](KvDtype t) { return static_cast<uint32_t>(t) == code; });
}

// Whether `group` suits rows of kv_dim values of `dtype`: values per scale of a quantized
// type (attention::KvQ8Group: 32, or a smaller head_dim, dividing the row; even where
// rows are q4_0, whose bytes hold two values), 0 otherwise.
bool GroupFits(KvDtype dtype, uint32_t kv_dim, uint32_t group) {
  if (!KvDtypeQuantized(dtype)) return group == 0;
  if (KvTensorDtype(dtype, true) == KvDtype::kQ4_0 && group % 2 != 0) return false;  // V's codes two a byte
  return group > 0 && group <= kMaxGroup && kv_dim % group == 0;
}

char HexDigit(int v) { return "0123456789abcdef"[v & 15]; }
std::string Hex16(uint64_t v) {
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = HexDigit(static_cast<int>(v & 15));
  return s;
}

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  template <typename T>
  void Pod(const T& v) { out_->append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  void Str(const std::string& s) {
    Pod(static_cast<uint32_t>(s.size()));
    out_->append(s);
  }
  void Raw(const void* p, size_t n) { out_->append(static_cast<const char*>(p), n); }

 private:
  std::string* out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Pod(T* v) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Str(std::string* s) {
    uint32_t n;
    if (!Pod(&n) || n > kMaxString || in_.size() - pos_ < n) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Raw(void* p, size_t n) {
    if (in_.size() - pos_ < n) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Skip(size_t n) {
    if (in_.size() - pos_ < n) return false;
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

// nk, nv: bytes of K and of V.
uint64_t LayerChecksum(const void* k, size_t nk, const void* v, size_t nv) {
  uint64_t h = Hash64(k, nk);
  return Hash64(v, nv, h);
}

// Whether an f16 is finite and, when `unsigned_only`, not negative.
bool GoodScale(uint16_t h, bool unsigned_only) { return (h & 0x7c00) != 0x7c00 && !(unsigned_only && (h & 0x8000)); }

// A quantized layer's scales (K then V: `bytes`, the layer of header `h`) as the quantizer
// writes them: finite f16, and for q8_0 not negative (attention::QuantizeKvRowQ8 stores
// min(max|x| / 127, 65504); q4_0's scale is the group's signed largest-magnitude value
// over -8, either sign; kivi4's K scales are not negative, its minimums finite). A layer
// whose checksum holds but whose scales do not (a writer's fault) is rejected like a
// corrupt one: its values would be NaN or Inf.
Status CheckLayerScales(const char* bytes, const EntryHeader& h) {
  const KvEntry& meta = h.meta;
  if (!KvDtypeQuantized(meta.dtype)) return OkStatus();
  const size_t n_scales = static_cast<size_t>(meta.kv_dim / meta.group), n = meta.n_tokens();
  for (bool v : {false, true}) {  // K's rows, then V's
    const KvDtype type = KvTensorDtype(meta.dtype, v);
    if (type == KvDtype::kKivi4) {  // the groups' scales and minimums, after the codes
      const char* params = bytes + n * meta.k_row_size();
      for (size_t g = 0; g < h.k_group_ends.size(); ++g)
        for (int j = 0; j < 2 * meta.kv_dim; ++j) {
          uint16_t x;
          std::memcpy(&x, params + (g * 2 * meta.kv_dim + j) * 2, sizeof(x));
          if (!GoodScale(x, j < meta.kv_dim))
            return DataLossError("KV entry K group " + std::to_string(g) + " has a bad " +
                                 (j < meta.kv_dim ? "scale" : "minimum"));
        }
      continue;
    }
    const size_t row = v ? meta.v_row_size() : meta.k_row_size(), at = KvRowScalesOffset(type, meta.kv_dim);
    const char* rows = bytes + (v ? h.layer_k_bytes : 0);
    const uint16_t bad_sign = type == KvDtype::kQ8_0 ? 0x8000 : 0;
    for (size_t r = 0; r < n; ++r) {
      const char* scales = rows + r * row + at;
      for (size_t j = 0; j < n_scales; ++j) {
        uint16_t x;
        std::memcpy(&x, scales + 2 * j, sizeof(x));
        // A sign bit the type never sets, or exponent all ones (Inf, NaN).
        if (!GoodScale(x, bad_sign != 0))
          return DataLossError("KV entry " + std::string(v ? "V" : "K") + " row " + std::to_string(r) + " has a bad " +
                               KvDtypeName(type) + " scale");
      }
    }
  }
  return OkStatus();
}

uint64_t AttachmentChecksum(std::string_view bytes) { return Hash64(bytes.data(), bytes.size(), 0x6174); }

uint32_t VersionOf(const KvEntry& e) { return e.attachments.empty() ? kVersion1 : kVersion2; }

// Header bytes up to (excluding) the header checksum (k_group_ends: kivi4's, KGroupEnds).
std::string HeaderBody(const KvEntry& e, const std::vector<int32_t>& k_group_ends,
                       const std::vector<uint64_t>& checksums) {
  std::string out;
  Writer w(&out);
  w.Raw(kMagic, sizeof(kMagic));
  w.Pod(VersionOf(e));
  w.Pod(static_cast<uint32_t>(e.dtype));
  w.Pod(static_cast<uint32_t>(e.n_layers));
  w.Pod(static_cast<uint32_t>(e.kv_dim));
  w.Pod(static_cast<uint32_t>(e.n_tokens()));
  if (KvDtypeQuantized(e.dtype)) w.Pod(static_cast<uint32_t>(e.group));
  if (KvDtypeGroupedK(e.dtype)) {
    w.Pod(static_cast<uint32_t>(k_group_ends.size()));
    w.Raw(k_group_ends.data(), k_group_ends.size() * sizeof(int32_t));
  }
  w.Pod(e.expires_at_ms);
  w.Str(e.tenant);
  w.Str(e.session_id);
  w.Str(e.fingerprint);
  if (VersionOf(e) == kVersion2) {
    w.Pod(static_cast<uint32_t>(e.attachments.size()));
    for (const EntryAttachment& a : e.attachments) {
      w.Str(a.kind);
      w.Pod(static_cast<uint64_t>(a.bytes->size()));
      w.Pod(AttachmentChecksum(*a.bytes));
    }
  }
  w.Raw(e.tokens.data(), e.tokens.size() * sizeof(int32_t));
  w.Raw(e.positions.data(), e.positions.size() * sizeof(int32_t));
  w.Raw(checksums.data(), checksums.size() * sizeof(uint64_t));
  return out;
}

}  // namespace

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32: return "f32";
    case KvDtype::kF16: return "f16";
    case KvDtype::kQ8_0: return "q8_0";
    case KvDtype::kQ4_0: return "q4_0";
    case KvDtype::kQ8_0Q4_0: return "q8_0/q4_0";
    case KvDtype::kKivi4: return "kivi4";
  }
  return "unknown";
}

std::string KvDtypeKeyName(KvDtype dtype) {
  std::string name = KvDtypeName(dtype);
  std::replace(name.begin(), name.end(), '/', '+');
  return name;
}

std::string KvDtypeChoices() {
  constexpr size_t n = std::size(kKvDtypes);
  std::string list;
  for (size_t i = 0; i < n; ++i) list += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + KvDtypeName(kKvDtypes[i]);
  return list;
}

bool ParseKvDtype(std::string_view name, KvDtype* dtype) {
  for (KvDtype t : kKvDtypes) {
    if (name != KvDtypeName(t) && name != KvDtypeKeyName(t)) continue;
    *dtype = t;
    return true;
  }
  return false;
}

void QuantizeRow(KvDtype dtype, const float* x, int kv_dim, int group, uint8_t* row) {
  uint8_t* scales = row + KvRowScalesOffset(dtype, kv_dim);
  for (int j = 0; j * group < kv_dim; ++j) {
    uint16_t scale;
    // head_dim = group: KvQ8Group(group) == KvQ4Group(group) == group for every group
    // <= 32, so this is the compute buffer's quantization of that group of values.
    if (dtype == KvDtype::kQ4_0) {
      attention::QuantizeKvRowQ4(x + j * group, group, row + j * group / 2, &scale);
    } else {
      attention::QuantizeKvRowQ8(x + j * group, group, reinterpret_cast<int8_t*>(row) + j * group, &scale);
    }
    std::memcpy(scales + 2 * j, &scale, sizeof(scale));
  }
}

void DequantizeRow(KvDtype dtype, const uint8_t* row, int kv_dim, int group, float* y) {
  DequantizeRowRange(dtype, row, kv_dim, group, 0, kv_dim, y);
}

void DequantizeRowRange(KvDtype dtype, const uint8_t* row, int kv_dim, int group, int first, int n, float* y) {
  const uint8_t* scales = row + KvRowScalesOffset(dtype, kv_dim) + 2 * (first / group);
  if (dtype == KvDtype::kQ8_0) {
    attention::DequantizeQ8(reinterpret_cast<const int8_t*>(row) + first, scales, n, group, y);
    return;
  }
  for (int j = 0; j * group < n; ++j)
    attention::DequantizeKvRowQ4(row + (first + j * group) / 2, scales + 2 * j, group, y + j * group);
}

void QuantizeKGroup(const float* x, int n, int kv_dim, uint8_t* codes, uint16_t* params) {
  constexpr float kF16Max = 65504.0f;
  std::vector<float> lo(x, x + kv_dim), hi(x, x + kv_dim), s(kv_dim), m(kv_dim);
  for (int r = 1; r < n; ++r)
    for (int c = 0; c < kv_dim; ++c) {
      lo[c] = std::min(lo[c], x[static_cast<size_t>(r) * kv_dim + c]);
      hi[c] = std::max(hi[c], x[static_cast<size_t>(r) * kv_dim + c]);
    }
  for (int c = 0; c < kv_dim; ++c) {
    params[kv_dim + c] = F32ToF16(std::clamp(lo[c], -kF16Max, kF16Max));
    m[c] = F16ToF32(params[kv_dim + c]);
    // Not below 0: a minimum rounded up past the channel's largest value (a group of
    // one token, or of equal values f16 does not hold) leaves a zero scale, every value m.
    params[c] = F32ToF16(std::clamp((hi[c] - m[c]) / 15.0f, 0.0f, kF16Max));
    s[c] = F16ToF32(params[c]);
  }
  std::memset(codes, 0, static_cast<size_t>(n) * kv_dim / 2);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < kv_dim; ++c) {
      const float t = s[c] > 0 ? (x[static_cast<size_t>(r) * kv_dim + c] - m[c]) / s[c] : 0.0f;
      // Clamped to [0, 15] (NaN: 0), then rounded half to even by adding and taking away
      // 2^23 (exact below 2^23 in the default rounding mode): round_half_even(t) clamped,
      // without a libm call per value.
      const float tc = t > 0.0f ? std::min(t, 15.0f) : 0.0f;
      const int code = static_cast<int>((tc + 8388608.0f) - 8388608.0f);
      codes[(static_cast<size_t>(r) * kv_dim + c) / 2] |= static_cast<uint8_t>(code << (c % 2 * 4));
    }
}

void DequantizeKGroupRowF32(const uint8_t* codes, const float* scales, const float* mins, int kv_dim, float* y) {
  // scale * code is exact in f32, so the sum is one rounding whether or not it is fused,
  // four lanes at a time or one.
  int c = 0;
#if defined(__SSE2__)
  const __m128i low = _mm_set1_epi8(15), zero = _mm_setzero_si128();
  for (; c + 8 <= kv_dim; c += 8) {  // 4 bytes of codes: channels c .. c + 7
    uint32_t word;
    std::memcpy(&word, codes + c / 2, sizeof(word));
    const __m128i b = _mm_cvtsi32_si128(static_cast<int>(word));
    const __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
    const __m128i q8 = _mm_unpacklo_epi8(lo, hi);  // channel order: byte j's low, then high nibble
    const __m128i q16 = _mm_unpacklo_epi8(q8, zero);
    const __m128 q0 = _mm_cvtepi32_ps(_mm_unpacklo_epi16(q16, zero));
    const __m128 q1 = _mm_cvtepi32_ps(_mm_unpackhi_epi16(q16, zero));
    _mm_storeu_ps(y + c, _mm_add_ps(_mm_loadu_ps(mins + c), _mm_mul_ps(_mm_loadu_ps(scales + c), q0)));
    _mm_storeu_ps(y + c + 4, _mm_add_ps(_mm_loadu_ps(mins + c + 4), _mm_mul_ps(_mm_loadu_ps(scales + c + 4), q1)));
  }
#endif
  for (; c < kv_dim; c += 2) {
    const uint8_t b = codes[c / 2];
    y[c] = mins[c] + scales[c] * static_cast<float>(b & 15);
    y[c + 1] = mins[c + 1] + scales[c + 1] * static_cast<float>(b >> 4);
  }
}

void DequantizeKGroupRow(const uint8_t* codes, const uint16_t* params, int kv_dim, float* y) {
  thread_local std::vector<float> wide;
  wide.resize(2 * static_cast<size_t>(kv_dim));
  // The scalar conversion (bit for bit the bulk one's): this row-at-a-time path serves a queued entry's
  // rows and the tests; the loader widens a layer's parameters once, in bulk (GroupedKRows). The
  // format's own files, fuzzed alone, stay free of the compute kernels.
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = F16ToF32(params[i]);
  DequantizeKGroupRowF32(codes, wide.data(), wide.data() + kv_dim, kv_dim, y);
}

void RoundTripRows(KvDtype dtype, bool v, int n, int kv_dim, int group, float* x) {
  const KvDtype t = KvTensorDtype(dtype, v);
  if (t == KvDtype::kF32) return;
  if (t == KvDtype::kF16) {
    for (size_t i = 0; i < static_cast<size_t>(n) * kv_dim; ++i) x[i] = F16ToF32(F32ToF16(x[i]));
    return;
  }
  if (t == KvDtype::kKivi4) {
    std::vector<uint8_t> codes(static_cast<size_t>(kKivi4GroupTokens) * kv_dim / 2);
    std::vector<uint16_t> params(2 * static_cast<size_t>(kv_dim));
    std::vector<float> wide(params.size());  // the group's scales, then minimums, widened once
    for (int t0 = 0; t0 < n; t0 += kKivi4GroupTokens) {
      const int m = std::min(kKivi4GroupTokens, n - t0);
      float* g = x + static_cast<size_t>(t0) * kv_dim;
      QuantizeKGroup(g, m, kv_dim, codes.data(), params.data());
      for (size_t i = 0; i < wide.size(); ++i) wide[i] = F16ToF32(params[i]);
      for (int r = 0; r < m; ++r)
        DequantizeKGroupRowF32(codes.data() + static_cast<size_t>(r) * kv_dim / 2, wide.data(), wide.data() + kv_dim,
                               kv_dim, g + static_cast<size_t>(r) * kv_dim);
    }
    return;
  }
  std::vector<uint8_t> row(KvRowBytes(t, kv_dim, group));
  for (int r = 0; r < n; ++r) {
    float* y = x + static_cast<size_t>(r) * kv_dim;
    QuantizeRow(t, y, kv_dim, group, row.data());
    DequantizeRow(t, row.data(), kv_dim, group, y);
  }
}

void DequantizeEntryKRow(const char* layer_k, int n_tokens, const std::vector<int32_t>& group_ends, int kv_dim,
                         int row, float* y) {
  const size_t g = static_cast<size_t>(std::upper_bound(group_ends.begin(), group_ends.end(), row) - group_ends.begin());
  // The layer's bytes are aligned to 16, a group's parameters only to 2: copied out first.
  thread_local std::vector<uint16_t> params;
  params.resize(2 * static_cast<size_t>(kv_dim));
  std::memcpy(params.data(), layer_k + static_cast<size_t>(n_tokens) * kv_dim / 2 + g * KGroupParamBytes(kv_dim),
              KGroupParamBytes(kv_dim));
  DequantizeKGroupRow(reinterpret_cast<const uint8_t*>(layer_k) + static_cast<size_t>(row) * kv_dim / 2,
                      params.data(), kv_dim, y);
}

uint64_t TokenHash(const int32_t* tokens, size_t n) { return Hash64(tokens, n * sizeof(int32_t), 0x6b76); }

std::string EntryKey::ToString() const {
  return Hex16(Hash64(tenant, 1)) + "-" + FingerprintTag(fingerprint) + "-" + KvDtypeKeyName(dtype) + "-" +
         Hex16(token_hash) + "-" + Hex16(Hash64(session_id, 3));
}

std::string FingerprintTag(const std::string& fingerprint) { return Hex16(Hash64(fingerprint, 2)); }

bool ParseEntryKeyName(std::string_view name, std::string* fingerprint_tag) {
  auto hex16 = [](std::string_view f) {
    return f.size() == 16 && std::all_of(f.begin(), f.end(), [](char c) {
             return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
           });
  };
  std::string_view field[5];
  for (int i = 0; i < 5; ++i) {
    const size_t dash = i < 4 ? name.find('-') : name.size();
    if (dash == std::string_view::npos) return false;
    field[i] = name.substr(0, dash);
    name.remove_prefix(i < 4 ? dash + 1 : dash);
  }
  if (!hex16(field[0]) || !hex16(field[1]) || !hex16(field[3]) || !hex16(field[4])) return false;
  KvDtype dtype;
  if (!ParseKvDtype(field[2], &dtype) || field[2] != KvDtypeKeyName(dtype)) return false;
  if (fingerprint_tag != nullptr) fingerprint_tag->assign(field[1]);
  return true;
}

bool EntryKeyHasDtype(std::string_view key, KvDtype dtype) {
  // "<16 hex>-<16 hex>-<dtype>-...": the third field.
  constexpr size_t kAt = 2 * 17;
  const std::string name = KvDtypeKeyName(dtype);
  return key.size() > kAt + name.size() && key.substr(kAt, name.size()) == name && key[kAt + name.size()] == '-';
}

EntryKey KvEntry::key() const {
  EntryKey k;
  k.tenant = tenant;
  k.fingerprint = fingerprint;
  k.dtype = dtype;
  k.token_hash = TokenHash(tokens.data(), tokens.size());
  k.session_id = session_id;
  return k;
}

uint64_t KvEntry::SerializedBytes() const {
  uint64_t header = 8 + 4 * 5 + 8 + 12 + tenant.size() + session_id.size() + fingerprint.size() +
                    8ull * tokens.size() + 8ull * n_layers + 8 + (KvDtypeQuantized(dtype) ? 4 : 0);
  if (!attachments.empty()) {
    header += 4;
    for (const EntryAttachment& a : attachments) header += 4 + a.kind.size() + 16;
  }
  uint64_t k_params = 0;  // kivi4's K group scales, per layer
  if (KvDtypeGroupedK(dtype)) {
    const size_t groups = KGroupEnds().size();
    header += 4 + 4 * groups;
    k_params = groups * KGroupParamBytes(kv_dim);
  }
  return AlignUp(header) + n_layers * (tokens.size() * (k_row_size() + v_row_size()) + k_params) + attachment_bytes();
}

const EntryAttachment* KvEntry::attachment(std::string_view kind) const {
  for (const EntryAttachment& a : attachments)
    if (a.kind == kind) return &a;
  return nullptr;
}

uint64_t KvEntry::attachment_bytes() const {
  uint64_t n = 0;
  for (const EntryAttachment& a : attachments) n += a.bytes ? a.bytes->size() : 0;
  return n;
}

void KvEntry::TruncateTo(int n) {
  if (n >= n_tokens()) return;
  attachments.clear();
  tokens.resize(n);
  positions.resize(n);
  base.n_rows = std::min(base.n_rows, n);
  const size_t own = static_cast<size_t>(n - base.n_rows) * kv_dim;
  if (KvDtypeGroupedK(dtype)) {  // own K in f32 until serialized
    for (auto& x : k) x.resize(own);
    for (auto& x : vq) x.resize(static_cast<size_t>(n - base.n_rows) * v_row_size());
  } else if (KvDtypeQuantized(dtype)) {
    for (auto& x : kq) x.resize(static_cast<size_t>(n - base.n_rows) * k_row_size());
    for (auto& x : vq) x.resize(static_cast<size_t>(n - base.n_rows) * v_row_size());
  } else if (dtype == KvDtype::kF16) {
    for (auto& x : k16) x.resize(own);
    for (auto& x : v16) x.resize(own);
  } else {
    for (auto& x : k) x.resize(own);
    for (auto& x : v) x.resize(own);
  }
}

const char* KvEntry::own_k(int layer) const {
  if (KvDtypeGroupedK(dtype)) return reinterpret_cast<const char*>(k[layer].data());
  if (KvDtypeQuantized(dtype)) return reinterpret_cast<const char*>(kq[layer].data());
  return dtype == KvDtype::kF16 ? reinterpret_cast<const char*>(k16[layer].data())
                                : reinterpret_cast<const char*>(k[layer].data());
}

const char* KvEntry::own_v(int layer) const {
  if (KvDtypeQuantized(dtype)) return reinterpret_cast<const char*>(vq[layer].data());
  return dtype == KvDtype::kF16 ? reinterpret_cast<const char*>(v16[layer].data())
                                : reinterpret_cast<const char*>(v[layer].data());
}

uint64_t KvEntry::own_kv_bytes() const { return OwnRowBytes(*this); }

Status ValidateEntry(const KvEntry& e) {
  if (e.n_layers <= 0 || static_cast<uint32_t>(e.n_layers) > kMaxLayers) return InvalidArgumentError("bad n_layers");
  if (e.kv_dim <= 0 || static_cast<uint32_t>(e.kv_dim) > kMaxKvDim) return InvalidArgumentError("bad kv_dim");
  if (e.tokens.empty() || e.tokens.size() > kMaxTokens) return InvalidArgumentError("bad token count");
  if (e.positions.size() != e.tokens.size()) return InvalidArgumentError("positions/tokens size mismatch");
  if (e.tenant.size() > kMaxString || e.session_id.size() > kMaxString || e.fingerprint.size() > kMaxString)
    return InvalidArgumentError("tenant/session/fingerprint too long");
  const KvRowsBase& b = e.base;
  bool base_ok = b.n_rows >= 0 && b.n_rows <= e.n_tokens();
  if (b.entry != nullptr) {  // an unserialized entry of the same shape, holding the rows
    base_ok = base_ok && b.bytes == nullptr && b.n_rows <= b.entry->n_tokens() && b.entry->n_layers == e.n_layers &&
              b.entry->kv_dim == e.kv_dim && b.entry->dtype == e.dtype && b.entry->group == e.group &&
              ValidateEntry(*b.entry).ok();
    // kivi4 entries are serialized with their base's groups: their base is serialized.
    base_ok = base_ok && !KvDtypeGroupedK(e.dtype);
  } else if (b.bytes != nullptr) {  // a serialized entry's layers, inside its bytes
    const bool grouped = KvDtypeGroupedK(e.dtype);
    const uint64_t k_bytes = b.base_tokens * e.k_row_size() +
                             (grouped && b.k_group_ends ? b.k_group_ends->size() * KGroupParamBytes(e.kv_dim) : 0);
    base_ok = base_ok && b.n_rows <= b.base_tokens && b.data_offset + e.n_layers * b.layer_bytes <= b.bytes->size() &&
              b.dtype == e.dtype && b.kv_dim == e.kv_dim && b.group == e.group && b.layer_k_bytes == k_bytes &&
              b.layer_bytes == k_bytes + b.base_tokens * e.v_row_size() && (grouped == (b.k_group_ends != nullptr)) &&
              (!grouped || (!b.k_group_ends->empty() && b.k_group_ends->back() == b.base_tokens));
  } else {
    base_ok = base_ok && b.n_rows == 0;
  }
  if (!base_ok) return InvalidArgumentError("bad KV row base");
  if (e.attachments.size() > static_cast<size_t>(kMaxEntryAttachments)) return InvalidArgumentError("too many attachments");
  for (size_t i = 0; i < e.attachments.size(); ++i) {
    const EntryAttachment& a = e.attachments[i];
    if (a.kind.empty() || a.kind.size() > kMaxKind || a.bytes == nullptr || a.bytes->size() > kMaxAttachmentBytes)
      return InvalidArgumentError("bad attachment");
    for (size_t j = 0; j < i; ++j)
      if (e.attachments[j].kind == a.kind) return InvalidArgumentError("duplicate attachment kind " + a.kind);
  }
  if (!KnownKvDtype(static_cast<uint32_t>(e.dtype))) return InvalidArgumentError("bad KV dtype");
  if (e.group < 0 || !GroupFits(e.dtype, static_cast<uint32_t>(e.kv_dim), static_cast<uint32_t>(e.group)))
    return InvalidArgumentError("bad KV group for " + std::string(KvDtypeName(e.dtype)));
  const size_t own_rows = static_cast<size_t>(e.n_tokens() - b.n_rows);
  const bool grouped = KvDtypeGroupedK(e.dtype);
  const bool q = KvDtypeQuantized(e.dtype) && !grouped;  // own K rows in kq (kivi4's: f32, in k)
  const size_t own_k = q ? own_rows * e.k_row_size() : own_rows * e.kv_dim;
  const size_t own_v = KvDtypeQuantized(e.dtype) ? own_rows * e.v_row_size() : own_rows * e.kv_dim;
  auto check = [&](const auto& k, const auto& v) {
    if (k.size() != static_cast<size_t>(e.n_layers) || v.size() != static_cast<size_t>(e.n_layers))
      return InvalidArgumentError("k/v layer count mismatch");
    for (int l = 0; l < e.n_layers; ++l)
      if (k[l].size() != own_k || v[l].size() != own_v) return InvalidArgumentError("k/v layer size mismatch");
    return OkStatus();
  };
  // The other dtype's rows: none (no layers, or empty ones).
  auto unused = [](const auto& rows) {
    return std::all_of(rows.begin(), rows.end(), [](const auto& x) { return x.empty(); });
  };
  const bool f32 = e.dtype == KvDtype::kF32, f16 = e.dtype == KvDtype::kF16;
  if ((!(f32 || grouped) && !unused(e.k)) || (!f32 && !unused(e.v)) || (!f16 && (!unused(e.k16) || !unused(e.v16))) ||
      (!q && !unused(e.kq)) || (!(q || grouped) && !unused(e.vq)))
    return InvalidArgumentError(std::string("rows of another type in a ") + KvDtypeName(e.dtype) + " entry");
  if (grouped) return check(e.k, e.vq);
  if (q) return check(e.kq, e.vq);
  return f16 ? check(e.k16, e.v16) : check(e.k, e.v);
}

const char* KvRowsBase::k_row_bytes(int layer, int row) const {
  if (entry != nullptr) return entry->k_row_bytes(layer, row);
  return bytes->data() + data_offset + layer * layer_bytes + static_cast<size_t>(row) * k_row_size();
}

const char* KvRowsBase::v_row_bytes(int layer, int row) const {
  if (entry != nullptr) return entry->v_row_bytes(layer, row);
  return bytes->data() + data_offset + layer * layer_bytes + layer_k_bytes + static_cast<size_t>(row) * v_row_size();
}

void KvRowsBase::KRowF32(int layer, int row, float* y) const {
  if (entry != nullptr) return entry->KRowF32(layer, row, y);
  const char* layer_bytes_at = bytes->data() + data_offset + layer * layer_bytes;
  if (dtype == KvDtype::kKivi4) {
    DequantizeEntryKRow(layer_bytes_at, static_cast<int>(base_tokens), *k_group_ends, kv_dim, row, y);
  } else if (KvDtypeQuantized(dtype)) {
    DequantizeRow(KvTensorDtype(dtype, false), reinterpret_cast<const uint8_t*>(k_row_bytes(layer, row)), kv_dim,
                  group, y);
  } else if (dtype == KvDtype::kF16) {
    const char* r = k_row_bytes(layer, row);
    for (int c = 0; c < kv_dim; ++c) {
      uint16_t h;
      std::memcpy(&h, r + 2 * c, sizeof(h));
      y[c] = F16ToF32(h);
    }
  } else {
    std::memcpy(y, k_row_bytes(layer, row), static_cast<size_t>(kv_dim) * sizeof(float));
  }
}

void KvRowsBase::CopyRows(int layer, int first, int n, void* k_out, void* v_out) const {
  if (n <= 0) return;
  // Bytes a K / V row (an unserialized entry's are its types').
  const size_t krow = entry != nullptr ? entry->k_row_size() : k_row_size();
  const size_t vrow = entry != nullptr ? entry->v_row_size() : v_row_size();
  char* ko = static_cast<char*>(k_out);
  char* vo = static_cast<char*>(v_out);
  if (entry == nullptr) {  // serialized: contiguous
    std::memcpy(ko, k_row_bytes(layer, first), n * krow);
    std::memcpy(vo, v_row_bytes(layer, first), n * vrow);
    return;
  }
  // The unserialized entry's own base first, then its own rows.
  const KvEntry& e = *entry;
  const int from_base = std::max(0, std::min(first + n, e.base.n_rows) - first);
  e.base.CopyRows(layer, first, from_base, ko, vo);
  const int own_first = first + from_base - e.base.n_rows, rest = n - from_base;
  if (rest == 0) return;
  std::memcpy(ko + from_base * krow, e.own_k(layer) + own_first * krow, rest * krow);
  std::memcpy(vo + from_base * vrow, e.own_v(layer) + own_first * vrow, rest * vrow);
}

int KvRowsBase::unserialized_depth() const {
  int depth = 0;
  for (const KvRowsBase* b = this; b->entry != nullptr; b = &b->entry->base) ++depth;
  return depth;
}

const char* KvEntry::k_row_bytes(int layer, int row) const {
  if (row < base.n_rows) return base.k_row_bytes(layer, row);
  return own_k(layer) + static_cast<size_t>(row - base.n_rows) * k_row_size();
}

void KvEntry::KRowF32(int layer, int row, float* y) const {
  if (row < base.n_rows) return base.KRowF32(layer, row, y);
  const size_t own = static_cast<size_t>(row - base.n_rows);
  if (KvDtypeGroupedK(dtype) || dtype == KvDtype::kF32) {
    std::memcpy(y, k[layer].data() + own * kv_dim, static_cast<size_t>(kv_dim) * sizeof(float));
  } else if (dtype == KvDtype::kF16) {
    for (int c = 0; c < kv_dim; ++c) y[c] = F16ToF32(k16[layer][own * kv_dim + c]);
  } else {
    DequantizeRow(KvTensorDtype(dtype, false), kq[layer].data() + own * k_row_size(), kv_dim, group, y);
  }
}

std::vector<int32_t> KvEntry::KGroupEnds() const {
  std::vector<int32_t> ends;
  if (!KvDtypeGroupedK(dtype)) return ends;
  if (base.n_rows > 0 && base.k_group_ends) {
    for (int32_t end : *base.k_group_ends) {
      ends.push_back(std::min(end, base.n_rows));
      if (end >= base.n_rows) break;
    }
  }
  for (int at = base.n_rows; at < n_tokens(); at += kKivi4GroupTokens)
    ends.push_back(std::min(at + kKivi4GroupTokens, n_tokens()));
  return ends;
}

const char* KvEntry::v_row_bytes(int layer, int row) const {
  if (row < base.n_rows) return base.v_row_bytes(layer, row);
  return own_v(layer) + static_cast<size_t>(row - base.n_rows) * v_row_size();
}

KvRowsBase EntryRowsBase(SharedBytes bytes, const EntryHeader& h, int n_rows) {
  KvRowsBase b;
  b.bytes = std::move(bytes);
  b.data_offset = h.data_offset;
  b.layer_bytes = h.layer_bytes;
  b.base_tokens = h.meta.n_tokens();
  b.n_rows = n_rows;
  b.layer_k_bytes = h.layer_k_bytes;
  b.dtype = h.meta.dtype;
  b.kv_dim = h.meta.kv_dim;
  b.group = h.meta.group;
  if (KvDtypeGroupedK(h.meta.dtype)) b.k_group_ends = std::make_shared<const std::vector<int32_t>>(h.k_group_ends);
  return b;
}

namespace {

// A kivi4 layer's K section (codes, then each group's scales and minimums) at `k`: the
// base's codes and groups copied as they are (a group the base's rows end inside keeps
// its scales: its rows' values do not change), the own f32 rows quantized group by group.
void WriteGroupedK(const KvEntry& e, const std::vector<int32_t>& ends, int layer, char* k) {
  const int kvd = e.kv_dim, nb = e.base.n_rows;
  const size_t code_row = static_cast<size_t>(kvd) / 2, params = KGroupParamBytes(kvd);
  char* group_params = k + e.tokens.size() * code_row;
  std::vector<uint16_t> p(2 * static_cast<size_t>(kvd));  // a group's params, aligned
  int first = 0;
  for (size_t g = 0; g < ends.size(); first = ends[g++]) {
    if (first < nb) {  // a base group (ends inside the base's rows: ends[g] <= nb)
      const KvRowsBase& b = e.base;
      const char* bk = b.bytes->data() + b.data_offset + layer * b.layer_bytes;
      std::memcpy(k + first * code_row, bk + first * code_row, (ends[g] - first) * code_row);
      std::memcpy(group_params + g * params, bk + b.base_tokens * code_row + g * params, params);
      continue;
    }
    QuantizeKGroup(e.k[layer].data() + static_cast<size_t>(first - nb) * kvd, ends[g] - first, kvd,
                   reinterpret_cast<uint8_t*>(k + first * code_row), p.data());
    std::memcpy(group_params + g * params, p.data(), params);
  }
}

}  // namespace

StatusOr<std::unique_ptr<Bytes>> SerializeEntryBytes(const KvEntry& e) {
  ATTIC_RETURN_IF_ERROR(ValidateEntry(e));
  const bool grouped = KvDtypeGroupedK(e.dtype);
  const std::vector<int32_t> ends = e.KGroupEnds();
  const size_t k_layer = e.tokens.size() * e.k_row_size() + ends.size() * KGroupParamBytes(e.kv_dim);
  const size_t v_layer = e.tokens.size() * e.v_row_size();
  const size_t k_base = static_cast<size_t>(e.base.n_rows) * e.k_row_size();
  const size_t v_base = static_cast<size_t>(e.base.n_rows) * e.v_row_size();
  // The header's size does not depend on the checksums: lay out the layers (base rows,
  // then own rows), checksum each as it is written, then write the header.
  std::vector<uint64_t> checksums(e.n_layers, 0);
  const size_t body = HeaderBody(e, ends, checksums).size();
  const size_t data = AlignUp(body + sizeof(uint64_t));
  std::unique_ptr<Bytes> out = Bytes::Allocate(e.SerializedBytes());
  ATTIC_CHECK(data + e.n_layers * (k_layer + v_layer) + e.attachment_bytes() == out->size());
  char* p = out->data();
  std::memset(p + body, 0, data - body);
  for (int l = 0; l < e.n_layers; ++l) {
    char* k = p + data + l * (k_layer + v_layer);
    char* v = k + k_layer;
    // (An entry whose rows are all its base's has empty own rows, whose data() may be
    // null: nothing is copied from them.)
    if (grouped) {
      WriteGroupedK(e, ends, l, k);
      for (int r = 0; r < e.base.n_rows; ++r) std::memcpy(v + r * e.v_row_size(), e.base.v_row_bytes(l, r), e.v_row_size());
    } else {
      e.base.CopyRows(l, 0, e.base.n_rows, k, v);
      if (k_layer > k_base) std::memcpy(k + k_base, e.own_k(l), k_layer - k_base);
    }
    if (v_layer > v_base) std::memcpy(v + v_base, e.own_v(l), v_layer - v_base);
    checksums[l] = LayerChecksum(k, k_layer, v, v_layer);
  }
  char* at = p + data + e.n_layers * (k_layer + v_layer);
  for (const EntryAttachment& a : e.attachments) {
    std::memcpy(at, a.bytes->data(), a.bytes->size());
    at += a.bytes->size();
  }
  const std::string header = HeaderBody(e, ends, checksums);
  ATTIC_CHECK(header.size() == body);
  std::memcpy(p, header.data(), body);
  const uint64_t hc = Hash64(p, body, 0x68);
  std::memcpy(p + body, &hc, sizeof(hc));
  return out;
}

StatusOr<std::string> SerializeEntry(const KvEntry& e) {
  ATTIC_ASSIGN_OR_RETURN(std::unique_ptr<Bytes> bytes, SerializeEntryBytes(e));
  return std::string(bytes->view());
}

StatusOr<EntryHeader> ParseEntryHeader(std::string_view bytes) {
  Reader r(bytes);
  char magic[8];
  if (!r.Raw(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return DataLossError("not a KV entry (bad magic)");
  uint32_t version, dtype, n_layers, kv_dim, n_tokens, group = 0;
  EntryHeader h;
  KvEntry& e = h.meta;
  if (!r.Pod(&version) || !r.Pod(&dtype) || !r.Pod(&n_layers) || !r.Pod(&kv_dim) || !r.Pod(&n_tokens))
    return DataLossError("truncated KV entry header");
  if (version != kVersion1 && version != kVersion2)
    return DataLossError("unsupported KV entry version " + std::to_string(version));
  if (!KnownKvDtype(dtype)) return DataLossError("unsupported KV entry dtype");
  if (KvDtypeQuantized(static_cast<KvDtype>(dtype)) && !r.Pod(&group)) return DataLossError("truncated KV entry header");
  if (KvDtypeGroupedK(static_cast<KvDtype>(dtype))) {  // K's groups: 1..n_tokens ends, ascending, the last n_tokens
    uint32_t n_groups;
    if (!r.Pod(&n_groups)) return DataLossError("truncated KV entry header");
    if (n_groups == 0 || n_groups > n_tokens || n_tokens > kMaxTokens)
      return DataLossError("KV entry header out of bounds (K groups)");
    if (bytes.size() - r.pos() < n_groups * 4ull) return DataLossError("truncated KV entry header");
    h.k_group_ends.resize(n_groups);
    r.Raw(h.k_group_ends.data(), n_groups * 4ull);
    for (uint32_t g = 0; g < n_groups; ++g)
      if (h.k_group_ends[g] <= (g == 0 ? 0 : h.k_group_ends[g - 1]))
        return DataLossError("KV entry header out of bounds (K groups)");
    if (h.k_group_ends.back() != static_cast<int32_t>(n_tokens))
      return DataLossError("KV entry header out of bounds (K groups)");
  }
  if (!r.Pod(&e.expires_at_ms)) return DataLossError("truncated KV entry header");
  if (!GroupFits(static_cast<KvDtype>(dtype), kv_dim, group))
    return DataLossError("KV entry header out of bounds (group)");
  if (n_layers == 0 || n_layers > kMaxLayers || kv_dim == 0 || kv_dim > kMaxKvDim || n_tokens == 0 ||
      n_tokens > kMaxTokens)
    return DataLossError("KV entry header out of bounds");
  e.dtype = static_cast<KvDtype>(dtype);
  e.group = static_cast<int>(group);
  e.n_layers = static_cast<int>(n_layers);
  e.kv_dim = static_cast<int>(kv_dim);
  if (!r.Str(&e.tenant) || !r.Str(&e.session_id) || !r.Str(&e.fingerprint)) return DataLossError("truncated KV entry header");
  if (version == kVersion2) {
    uint32_t n_att;
    if (!r.Pod(&n_att)) return DataLossError("truncated KV entry header");
    if (n_att == 0 || n_att > static_cast<uint32_t>(kMaxEntryAttachments))
      return DataLossError("KV entry header out of bounds");
    for (uint32_t i = 0; i < n_att; ++i) {
      AttachmentInfo a;
      if (!r.Str(&a.kind) || !r.Pod(&a.size) || !r.Pod(&a.checksum)) return DataLossError("truncated KV entry header");
      if (a.kind.empty() || a.kind.size() > kMaxKind || a.size > kMaxAttachmentBytes)
        return DataLossError("KV entry header out of bounds");
      h.attachments.push_back(std::move(a));
    }
  }
  // Sized by the header's counts only once the bytes are there: a short, hostile file
  // must not make the reader allocate what it claims (found by ssd_entry_fuzz: 160 bytes
  // asked for 32 MB).
  if (bytes.size() - r.pos() < n_tokens * 8ull + n_layers * 8ull + sizeof(uint64_t))
    return DataLossError("truncated KV entry header");
  e.tokens.resize(n_tokens);
  e.positions.resize(n_tokens);
  h.layer_checksums.resize(n_layers);
  if (!r.Raw(e.tokens.data(), n_tokens * 4ull) || !r.Raw(e.positions.data(), n_tokens * 4ull) ||
      !r.Raw(h.layer_checksums.data(), n_layers * 8ull))
    return DataLossError("truncated KV entry header");
  size_t body = r.pos();
  uint64_t hc;
  if (!r.Pod(&hc)) return DataLossError("truncated KV entry header");
  if (Hash64(bytes.data(), body, 0x68) != hc) return DataLossError("KV entry header checksum mismatch");
  h.data_offset = AlignUp(r.pos());
  h.layer_k_bytes = uint64_t{n_tokens} * e.k_row_size() + h.k_group_ends.size() * KGroupParamBytes(e.kv_dim);
  h.layer_bytes = h.layer_k_bytes + uint64_t{n_tokens} * e.v_row_size();
  h.total_bytes = h.data_offset + h.layer_bytes * n_layers;
  for (AttachmentInfo& a : h.attachments) {
    a.offset = h.total_bytes;
    h.total_bytes += a.size;
  }
  return h;
}

const char* EntryLayerKBytes(std::string_view bytes, const EntryHeader& h, int layer) {
  return bytes.data() + h.data_offset + layer * h.layer_bytes;
}

const char* EntryLayerVBytes(std::string_view bytes, const EntryHeader& h, int layer) {
  return EntryLayerKBytes(bytes, h, layer) + h.layer_k_bytes;
}

Status VerifyEntryLayer(std::string_view bytes, const EntryHeader& h, int layer) {
  if (bytes.size() != h.total_bytes || layer < 0 || layer >= h.meta.n_layers)
    return DataLossError("KV entry size " + std::to_string(bytes.size()) + " != " + std::to_string(h.total_bytes));
  if (LayerChecksum(EntryLayerKBytes(bytes, h, layer), h.layer_k_bytes, EntryLayerVBytes(bytes, h, layer),
                    h.layer_bytes - h.layer_k_bytes) != h.layer_checksums[layer])
    return DataLossError("KV entry layer " + std::to_string(layer) + " checksum mismatch");
  return CheckLayerScales(EntryLayerKBytes(bytes, h, layer), h);
}

StatusOr<uint64_t> EntryHeaderBytes(std::string_view prefix) {
  Reader r(prefix);
  char magic[8];
  if (!r.Raw(magic, 8)) return OutOfRangeError("too short for a KV entry header");
  if (std::memcmp(magic, kMagic, 8) != 0) return DataLossError("not a KV entry (bad magic)");
  uint32_t version, dtype, n_layers, kv_dim, n_tokens;
  int64_t expires;
  if (!r.Pod(&version) || !r.Pod(&dtype) || !r.Pod(&n_layers) || !r.Pod(&kv_dim) || !r.Pod(&n_tokens))
    return OutOfRangeError("too short for a KV entry header");
  if (!KnownKvDtype(dtype)) return DataLossError("unsupported KV entry dtype");
  if (KvDtypeQuantized(static_cast<KvDtype>(dtype)) && !r.Skip(4)) return OutOfRangeError("too short for a KV entry header");
  if (KvDtypeGroupedK(static_cast<KvDtype>(dtype))) {  // K's group ends
    uint32_t n_groups;
    if (!r.Pod(&n_groups)) return OutOfRangeError("too short for a KV entry header");
    if (n_groups == 0 || n_groups > kMaxTokens) return DataLossError("KV entry header out of bounds");
    if (!r.Skip(n_groups * 4ull)) return OutOfRangeError("too short for a KV entry header");
  }
  if (!r.Pod(&expires)) return OutOfRangeError("too short for a KV entry header");
  if ((version != kVersion1 && version != kVersion2) || n_layers == 0 || n_layers > kMaxLayers || n_tokens == 0 ||
      n_tokens > kMaxTokens)
    return DataLossError("KV entry header out of bounds");
  auto skip_str = [&](uint32_t max) -> Status {
    uint32_t n;
    if (!r.Pod(&n)) return OutOfRangeError("too short for a KV entry header");
    if (n > max) return DataLossError("KV entry header out of bounds");
    if (!r.Skip(n)) return OutOfRangeError("too short for a KV entry header");
    return OkStatus();
  };
  for (int i = 0; i < 3; ++i) ATTIC_RETURN_IF_ERROR(skip_str(kMaxString));  // tenant, session id, fingerprint
  if (version == kVersion2) {  // the attachment table
    uint32_t n_att;
    if (!r.Pod(&n_att)) return OutOfRangeError("too short for a KV entry header");
    if (n_att == 0 || n_att > static_cast<uint32_t>(kMaxEntryAttachments))
      return DataLossError("KV entry header out of bounds");
    for (uint32_t i = 0; i < n_att; ++i) {
      ATTIC_RETURN_IF_ERROR(skip_str(kMaxKind));
      if (!r.Skip(16)) return OutOfRangeError("too short for a KV entry header");
    }
  }
  // tokens, positions, layer checksums, header checksum
  return AlignUp(r.pos() + n_tokens * 8ull + n_layers * 8ull + sizeof(uint64_t));
}

uint64_t EntryLayerOffset(const EntryHeader& h, int layer) { return h.data_offset + layer * h.layer_bytes; }

Status VerifyLayerBytes(std::string_view layer_bytes, const EntryHeader& h, int layer) {
  if (layer < 0 || layer >= h.meta.n_layers || layer_bytes.size() != h.layer_bytes)
    return DataLossError("KV entry layer of " + std::to_string(layer_bytes.size()) + " bytes, expected " +
                         std::to_string(h.layer_bytes));
  const size_t nk = h.layer_k_bytes;
  if (LayerChecksum(layer_bytes.data(), nk, layer_bytes.data() + nk, h.layer_bytes - nk) != h.layer_checksums[layer])
    return DataLossError("KV entry layer " + std::to_string(layer) + " checksum mismatch");
  return CheckLayerScales(layer_bytes.data(), h);
}

StatusOr<EntryHeader> VerifyEntry(std::string_view bytes, const std::string& expected_fingerprint,
                                  bool check_layers) {
  ATTIC_ASSIGN_OR_RETURN(EntryHeader h, ParseEntryHeader(bytes));
  if (!expected_fingerprint.empty() && h.meta.fingerprint != expected_fingerprint)
    return FailedPreconditionError("KV entry belongs to another model");
  if (bytes.size() != h.total_bytes)
    return DataLossError("KV entry size " + std::to_string(bytes.size()) + " != " + std::to_string(h.total_bytes));
  if (check_layers)
    for (int l = 0; l < h.meta.n_layers; ++l) ATTIC_RETURN_IF_ERROR(VerifyEntryLayer(bytes, h, l));
  return h;
}

StatusOr<std::string_view> EntryAttachmentBytes(std::string_view bytes, const EntryHeader& h, std::string_view kind) {
  for (const AttachmentInfo& a : h.attachments) {
    if (a.kind != kind) continue;
    if (bytes.size() != h.total_bytes || a.offset + a.size > bytes.size())
      return DataLossError("KV entry attachment " + a.kind + " out of bounds");
    const std::string_view view = bytes.substr(a.offset, a.size);
    if (AttachmentChecksum(view) != a.checksum) return DataLossError("KV entry attachment " + a.kind + " checksum mismatch");
    return view;
  }
  return NotFoundError("KV entry has no attachment " + std::string(kind));
}

KvEntry MaterializeEntry(std::string_view bytes, EntryHeader h) {
  KvEntry& e = h.meta;
  for (const AttachmentInfo& a : h.attachments) {
    auto view = EntryAttachmentBytes(bytes, h, a.kind);
    if (view.ok()) e.attachments.push_back({a.kind, std::make_shared<const std::string>(*view)});
  }
  const size_t per_layer = e.tokens.size() * static_cast<size_t>(e.kv_dim);
  if (KvDtypeGroupedK(e.dtype)) {
    // Its K rows are codes of their groups: the entry's rows are a copy of the bytes, its
    // base (serialized again, they come back byte for byte).
    std::unique_ptr<Bytes> copy = Bytes::Allocate(bytes.size());
    std::memcpy(copy->data(), bytes.data(), bytes.size());
    e.k.assign(e.n_layers, {});
    e.vq.assign(e.n_layers, {});
    e.base = EntryRowsBase(SharedBytes(std::move(copy)), h, e.n_tokens());
    return std::move(e);
  }
  if (KvDtypeQuantized(e.dtype)) {
    const size_t k_layer = e.tokens.size() * e.k_row_size(), v_layer = e.tokens.size() * e.v_row_size();
    e.kq.resize(e.n_layers);
    e.vq.resize(e.n_layers);
    for (int l = 0; l < e.n_layers; ++l) {
      const auto* k = reinterpret_cast<const uint8_t*>(EntryLayerKBytes(bytes, h, l));
      const auto* v = reinterpret_cast<const uint8_t*>(EntryLayerVBytes(bytes, h, l));
      e.kq[l].assign(k, k + k_layer);
      e.vq[l].assign(v, v + v_layer);
    }
    return std::move(e);
  }
  if (e.dtype == KvDtype::kF16) {
    e.k16.resize(e.n_layers);
    e.v16.resize(e.n_layers);
    for (int l = 0; l < e.n_layers; ++l) {
      e.k16[l].resize(per_layer);
      e.v16[l].resize(per_layer);
      std::memcpy(e.k16[l].data(), EntryLayerKBytes(bytes, h, l), per_layer * 2);
      std::memcpy(e.v16[l].data(), EntryLayerVBytes(bytes, h, l), per_layer * 2);
    }
    return std::move(e);
  }
  e.k.resize(e.n_layers);
  e.v.resize(e.n_layers);
  for (int l = 0; l < e.n_layers; ++l) {
    const float* k = EntryLayerK(bytes, h, l);
    const float* v = EntryLayerV(bytes, h, l);
    e.k[l].assign(k, k + per_layer);
    e.v[l].assign(v, v + per_layer);
  }
  return std::move(e);
}

StatusOr<KvEntry> DeserializeEntry(std::string_view bytes, const std::string& expected_fingerprint) {
  ATTIC_ASSIGN_OR_RETURN(EntryHeader h, VerifyEntry(bytes, expected_fingerprint));
  return MaterializeEntry(bytes, std::move(h));
}

}  // namespace attic::store
