// KV entry: one stored conversation state (paper 001 sections 3.1, 3.4; DESIGN.md
// decisions 1 and 4). K is kept BEFORE RoPE so the entry can re-enter the compute
// buffer at any positions (truncation, restart); V as computed.
//
// The key is self-describing (tenant, model fingerprint, dtype, token hash, session),
// so any tier -- DRAM, a directory, later a remote server -- can hold it by name alone.
//
// Serialized layout (little-endian, one byte buffer / one file):
//   [0, 4096)   header: magic "ATTICKV1", version, dtype, n_layers, kv_dim, n_tokens,
//               [quantized dtypes only: group (u32), the values per scale],
//               [kivi4 only: n_k_groups (u32), the end token of each K group (u32
//               each, ascending, the last n_tokens)],
//               expires_at_ms, tenant, session_id, fingerprint,
//               [version 2: n_attachments (u32), per attachment: kind (u32 length +
//               bytes), size (u64), checksum (u64)]
//               tokens[n_tokens], positions[n_tokens], layer_checksum[n_layers],
//               header_checksum
//               (the header grows past 4096 in 4096-byte steps when it must)
//   then per layer l: K [n_tokens rows], V [n_tokens rows], each row the kv_dim values
//               of one token in the entry's dtype (f32: 4 bytes an element; f16: IEEE
//               half, 2 bytes an element; the f32 layout is the one version 1 always had;
//               q8_0: kv_dim int8 values, then the row's kv_dim / group f16 scales, scale
//               j for values [j * group, (j + 1) * group), value = scale * int8 --
//               attention/kv_q8.h's formula applied to each group of the row, so a row is
//               kv_dim + 2 * kv_dim / group bytes, KvRowBytes;
//               q4_0: kv_dim / 2 bytes of 4-bit codes, then the row's kv_dim / group f16
//               scales -- attention/kv_q4.h's formula and nibble order applied to each
//               group of the row (group j's codes at bytes [j * group / 2, (j + 1) *
//               group / 2)), so a row is kv_dim / 2 + 2 * kv_dim / group bytes;
//               q8_0/q4_0: K's rows in q8_0, V's in q4_0, each as above;
//               kivi4: K's n_tokens rows of kv_dim / 2 bytes of 4-bit codes (channel 2c
//               in the low nibble of byte c, 2c + 1 in the high one), then per K group g
//               (the header's group ends: groups of consecutive tokens) kv_dim f16
//               scales and kv_dim f16 minimums, value = min[c] + scale[c] * code
//               (KIVI's per-channel keys, K before RoPE); then V's rows in q4_0)
//   then (version 2) each attachment's bytes, in header order, unaligned
// Each layer's K+V carries its own xxh3 checksum, so a layer can be verified as soon as
// it is read (layer-wise loading). Data starts 4096-aligned for direct/aligned I/O.
//
// Versions: an entry without attachments is written as version 1 (byte for byte what
// version 1 always was); one with attachments as version 2. Both are read. The layers
// lie where version 1 puts them in both, so layer-wise reads do not care.
//
// Attachments: named blobs saved with the entry that describe its slots (a PQ index,
// pq/pq_index.h), in the same buffer / file (so the same atomic write), counted in its
// bytes. Each has its own xxh3 checksum, checked whenever it is read
// (EntryAttachmentBytes), whatever the tier: a bad attachment is dropped on its own (its
// user rebuilds what it held) while the KV, verified by its layer checksums, is still
// served. The attachment table is part of the header (header checksum); a file cut short
// anywhere is a bad entry as before (size mismatch).
//
// Thread-safety: value types.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attic/core/status.h"
#include "attic/store/bytes.h"

namespace attic::store {

// Element type of an entry's K and V (the store type, StoreOptions::kv_dtype): any of
// them enters any compute-buffer type (kv_loader.h). The store writes entries of its
// type and uses only those (the key names the type).
// kQ8_0: 8-bit values with one f16 scale per `group` values of a row (the compute
// buffer's q8_0 grouping: attention::KvQ8Group(head_dim)); kQ4_0: 4-bit codes with the
// same groups (attention::KvQ4Group). A quantized type records its group in the header
// (KvEntry::group). An entry's type names the type of its K rows and of its V rows
// (KvTensorDtype): the same for the first four; kQ8_0Q4_0 ("q8_0/q4_0") holds K in q8_0
// and V in q4_0 (the compute buffer's K8/V4 pair).
// kKivi4 ("kivi4") holds K in 4 bits per channel (KIVI): a scale and a minimum per channel
// for each group of up to kKivi4GroupTokens consecutive tokens, the channel's values of
// the group quantized asymmetrically by them (docs/engine.md "The 4-bit grouping" measured
// it against per-token blocks); V in q4_0 (`group` is V's). Only the store holds it: K
// must be before RoPE, as entries keep it. Its K rows are not whole without their group's
// scales, so they are read as f32 (KvEntry::KRowF32 and the like), never copied as rows.
enum class KvDtype : uint32_t { kF32 = 0, kF16 = 1, kQ8_0 = 2, kQ4_0 = 3, kQ8_0Q4_0 = 4, kKivi4 = 5 };
inline constexpr KvDtype kKvDtypes[] = {KvDtype::kF32,  KvDtype::kF16,      KvDtype::kQ8_0,
                                        KvDtype::kQ4_0, KvDtype::kQ8_0Q4_0, KvDtype::kKivi4};
// Tokens of a kivi4 K group as written: a turn's own rows are cut into groups of this many
// from its first own row (the last one shorter); the rows of a stored entry a turn extends
// keep the groups they were written with.
inline constexpr int kKivi4GroupTokens = 128;
// "f32", "f16", "q8_0", "q4_0", "q8_0/q4_0" (K/V, as the compute buffer's pairs are
// written), "kivi4".
const char* KvDtypeName(KvDtype dtype);
// The type named `name` (KvDtypeName's, or an entry key's spelling, KvDtypeKeyName);
// false when there is none.
bool ParseKvDtype(std::string_view name, KvDtype* dtype);
// The type's name in entry keys and file names: KvDtypeName with '+' for '/'.
std::string KvDtypeKeyName(KvDtype dtype);
// Every type's KvDtypeName, in kKvDtypes' order, for a message: "f32, f16, q8_0, q4_0,
// q8_0/q4_0 or kivi4".
std::string KvDtypeChoices();
// The type of an entry's K rows (v = false) or V rows (v = true): f32, f16, q8_0 or q4_0
// (kivi4's K rows: kKivi4, codes whose scales are the group's).
inline KvDtype KvTensorDtype(KvDtype dtype, bool v) {
  if (dtype == KvDtype::kQ8_0Q4_0) return v ? KvDtype::kQ4_0 : KvDtype::kQ8_0;
  if (dtype == KvDtype::kKivi4) return v ? KvDtype::kQ4_0 : KvDtype::kKivi4;
  return dtype;
}
// Whether rows of the type (both K's and V's for an entry type) are blocks of small
// integers with scales (then a group > 0).
inline bool KvDtypeQuantized(KvDtype dtype) {
  return dtype == KvDtype::kQ8_0 || dtype == KvDtype::kQ4_0 || dtype == KvDtype::kQ8_0Q4_0 ||
         dtype == KvDtype::kKivi4;
}
// Whether the type's K is quantized per channel over groups of tokens (kivi4).
inline bool KvDtypeGroupedK(KvDtype dtype) { return dtype == KvDtype::kKivi4; }
// Bytes of one element of an unquantized type (f32 4, f16 2).
inline size_t KvDtypeBytes(KvDtype dtype) { return dtype == KvDtype::kF16 ? 2 : 4; }
// Where a quantized row's scales start: after its kv_dim values' codes. `dtype`: a row's
// type (KvTensorDtype), q8_0 or q4_0.
inline size_t KvRowScalesOffset(KvDtype dtype, int kv_dim) {
  return dtype == KvDtype::kQ4_0 ? static_cast<size_t>(kv_dim) / 2 : static_cast<size_t>(kv_dim);
}
// Bytes of one row of kv_dim values of a row type (KvTensorDtype: f32, f16, q8_0, q4_0;
// group: values per scale of a quantized one).
inline size_t KvRowBytes(KvDtype dtype, int kv_dim, int group) {
  if (dtype == KvDtype::kKivi4) return static_cast<size_t>(kv_dim) / 2;  // codes; scales per group
  if (KvDtypeQuantized(dtype)) return KvRowScalesOffset(dtype, kv_dim) + 2 * static_cast<size_t>(kv_dim / group);
  return static_cast<size_t>(kv_dim) * KvDtypeBytes(dtype);
}
// A quantized row of `dtype` (KvRowBytes bytes at `row`) from kv_dim f32 values, each
// group of `group` values quantized by the compute buffer's formula
// (attention::QuantizeKvRowQ8 / QuantizeKvRowQ4), and back (exact: a small integer times
// an f16 scale is an f32). QuantizeRowQ8 / DequantizeRowQ8: dtype kQ8_0.
void QuantizeRow(KvDtype dtype, const float* x, int kv_dim, int group, uint8_t* row);
void DequantizeRow(KvDtype dtype, const uint8_t* row, int kv_dim, int group, float* y);
// Values [first, first + n) of such a row (the same values DequantizeRow gives them):
// what a reader of some heads of a row decodes. REQUIRES: first and n multiples of group.
void DequantizeRowRange(KvDtype dtype, const uint8_t* row, int kv_dim, int group, int first, int n, float* y);
inline void QuantizeRowQ8(const float* x, int kv_dim, int group, uint8_t* row) {
  QuantizeRow(KvDtype::kQ8_0, x, kv_dim, group, row);
}
inline void DequantizeRowQ8(const uint8_t* row, int kv_dim, int group, float* y) {
  DequantizeRow(KvDtype::kQ8_0, row, kv_dim, group, y);
}

// The values an entry of type `dtype` gives back for n rows x [n][kv_dim] of its K (v =
// false) or V (v = true), f32 and pre-RoPE, replaced in place: each tensor's rows in its
// row type (KvTensorDtype) -- f16 rounded to half precision, q8_0 / q4_0 quantized per
// `group` values (the entry's group; 0 for f32 and f16) and read back, kivi4's K per
// channel over groups of kKivi4GroupTokens rows counted from the first, as an entry's own
// rows are grouped. What an entry written from these rows and read back gives (measuring
// what the store's type costs a method that reads its entries, e.g. linking).
void RoundTripRows(KvDtype dtype, bool v, int n, int kv_dim, int group, float* x);

// kivi4's K: bytes of one group's scales and minimums (kv_dim f16 each).
inline size_t KGroupParamBytes(int kv_dim) { return 4 * static_cast<size_t>(kv_dim); }
// Quantizes n rows x [n, kv_dim] f32 (a K group) per channel: codes [n, kv_dim / 2]
// (entry.h's nibble order) and params (kv_dim f16 scales, then kv_dim f16 minimums).
// Channel c: m = f16(min over the group), s = f16(clamp((max - m) / 15, 0, 65504)) (0
// when the channel is constant, or m rounded up past its max), code = clamp(round_half_even((x - m) / s), 0, 15) in f32
// arithmetic (0 when s = 0); minimums clamp to +-65504. Dequantized: m + s * code (s *
// code is exact in f32, so the value is one rounding of that sum). Each value is within
// s / 2 of x plus what f16 rounding moves m and s (a value at the group's maximum may be
// capped at code 15: (max - m) / s <= 15 (1 + 2^-11)), an error measured against the
// group's range, not the row's largest channel.
// REQUIRES: kv_dim even, n >= 1.
void QuantizeKGroup(const float* x, int n, int kv_dim, uint8_t* codes, uint16_t* params);
// One K row of kv_dim values from its codes and its group's params (exact).
void DequantizeKGroupRow(const uint8_t* codes, const uint16_t* params, int kv_dim, float* y);
// The same row from its group's scales and minimums already widened to f32 (kv_dim each;
// the same values: how a reader of many rows of a group decodes them, store::GroupedKRows;
// eight channels at a time where the CPU has SSE2).
void DequantizeKGroupRowF32(const uint8_t* codes, const float* scales, const float* mins, int kv_dim, float* y);
// Row `row` of a serialized kivi4 layer's K section (`layer_k`: n_tokens rows of codes,
// then one params block per group; group_ends: the header's) as f32.
void DequantizeEntryKRow(const char* layer_k, int n_tokens, const std::vector<int32_t>& group_ends, int kv_dim,
                         int row, float* y);

// Bytes of the own rows a holder of the per-type row vectors keeps (KvEntry,
// store::TurnRows: k, v f32; k16, v16 IEEE half; kq, vq quantized rows' bytes).
template <class Rows>
uint64_t OwnRowBytes(const Rows& r) {
  uint64_t n = 0;
  for (const auto* rows : {&r.k, &r.v})
    for (const auto& x : *rows) n += x.size() * sizeof(float);
  for (const auto* rows : {&r.k16, &r.v16})
    for (const auto& x : *rows) n += x.size() * sizeof(uint16_t);
  for (const auto* rows : {&r.kq, &r.vq})
    for (const auto& x : *rows) n += x.size();
  return n;
}

// The per-layer row vectors that hold a `dtype` holder's own K and V rows (KvEntry,
// store::TurnRows): f(k_rows, v_rows) with k / v for f32, k16 / v16 for f16, kq / vq for
// q8_0, q4_0 and q8_0/q4_0, and k / vq for kivi4 (its own K is f32 until serialized).
// The two-holder form passes the same vectors of `b` after `a`'s (holders of one type).
template <class A, class B, class F>
void WithOwnRows(KvDtype dtype, A& a, B& b, F&& f) {
  if (KvDtypeGroupedK(dtype)) return f(a.k, a.vq, b.k, b.vq);
  if (KvDtypeQuantized(dtype)) return f(a.kq, a.vq, b.kq, b.vq);
  if (dtype == KvDtype::kF16) return f(a.k16, a.v16, b.k16, b.v16);
  f(a.k, a.v, b.k, b.v);
}
template <class A, class F>
void WithOwnRows(KvDtype dtype, A& a, F&& f) {
  WithOwnRows(dtype, a, a, [&](auto& k, auto& v, auto&, auto&) { f(k, v); });
}

struct EntryKey {
  std::string tenant;
  std::string fingerprint;  // model fingerprint (model::Model::fingerprint())
  KvDtype dtype = KvDtype::kF32;
  uint64_t token_hash = 0;  // TokenHash(tokens)
  std::string session_id;   // may be empty

  // "<tenant hash>-<fingerprint hash>-<dtype>-<token hash>-<session hash>" (dtype
  // KvDtypeKeyName: "f32", "f16", "q8_0", "q4_0" or "q8_0+q4_0"), 16 hex digits
  // each: safe as a file name or a remote key, unique per (tenant, model, dtype,
  // tokens, session).
  std::string ToString() const;
};

uint64_t TokenHash(const int32_t* tokens, size_t n);

// The fingerprint's field of every key of that model (16 hex digits): also the name of
// the model's subdirectory in an SSD store (SsdTier).
std::string FingerprintTag(const std::string& fingerprint);
// Whether `name` has the exact shape of an EntryKey::ToString() (four fields of 16
// lowercase hex digits around a known dtype name); *fingerprint_tag (when given) = its
// second field. Nothing else is ever taken for an entry's name.
bool ParseEntryKeyName(std::string_view name, std::string* fingerprint_tag = nullptr);
// Whether the entry key `key` (EntryKey::ToString()) names dtype `dtype`.
bool EntryKeyHasDtype(std::string_view key, KvDtype dtype);

struct KvEntry;

// A named blob saved with an entry (see "Attachments" above). `kind` names what it is
// (e.g. pq::kPqIndexAttachment): 1..64 bytes; at most kMaxEntryAttachments of them, each
// at most kMaxAttachmentBytes.
struct EntryAttachment {
  std::string kind;
  std::shared_ptr<const std::string> bytes;
};
inline constexpr int kMaxEntryAttachments = 16;
inline constexpr uint64_t kMaxAttachmentBytes = 1ull << 30;

// The first `n_rows` rows of every layer's K and V, shared in place, not copied: either
// rows of another serialized entry (`bytes`), or rows of an entry not serialized yet
// (`entry`: a queued save, immutable once queued; its own first rows may in turn come
// from a base). A turn that extends a stored history keeps the history here instead of
// copying it, and saving writes it straight from there.
struct KvRowsBase {
  SharedBytes bytes;                         // a serialized entry, or null
  uint64_t data_offset = 0;                  // of the base entry (EntryHeader)
  uint64_t layer_bytes = 0;
  int64_t base_tokens = 0;                   // rows per layer in the base entry
  std::shared_ptr<const KvEntry> entry;      // or an entry not serialized yet, or null
  int n_rows = 0;                            // rows used, <= the base's rows
  uint64_t layer_k_bytes = 0;                // bytes of a layer's K in `bytes` (its V follows)
  KvDtype dtype = KvDtype::kF32;             // `bytes`' type, row width and group (EntryRowsBase)
  int kv_dim = 0;
  int group = 0;
  // A kivi4 base's K groups (the ends its header gives), else null.
  std::shared_ptr<const std::vector<int32_t>> k_group_ends;

  // Bytes of one K / V row of `bytes` (KvRowBytes of its K / V type).
  size_t k_row_size() const { return KvRowBytes(KvTensorDtype(dtype, false), kv_dim, group); }
  size_t v_row_size() const { return KvRowBytes(KvTensorDtype(dtype, true), kv_dim, group); }

  // Row `row` (< n_rows) of layer `layer`'s K / V: one row of the entry's K / V type
  // (KvRowBytes; k_row / v_row: f32 entries only).
  const char* k_row_bytes(int layer, int row) const;
  const char* v_row_bytes(int layer, int row) const;
  const float* k_row(int layer, int row) const { return reinterpret_cast<const float*>(k_row_bytes(layer, row)); }
  const float* v_row(int layer, int row) const { return reinterpret_cast<const float*>(v_row_bytes(layer, row)); }
  // Row `row` (< n_rows) of layer `layer`'s K as f32 (any type; kivi4's through its
  // group's scales).
  void KRowF32(int layer, int row, float* y) const;
  // Copies rows [first, first + n) of layer `layer`'s K and V to k_out / v_out
  // (rows of the entry's K and V types; not for kivi4's K).
  void CopyRows(int layer, int first, int n, void* k_out, void* v_out) const;
  // Entries not serialized yet between these rows and serialized bytes (0 = none).
  int unserialized_depth() const;
};

struct KvEntry {
  std::string tenant = "default";
  std::string session_id;
  std::string fingerprint;
  KvDtype dtype = KvDtype::kF32;
  int group = 0;                    // values per scale of a quantized dtype; 0 for f32 / f16
  int n_layers = 0;
  int kv_dim = 0;
  int64_t expires_at_ms = 0;        // unix ms; 0 = never
  std::vector<int32_t> tokens;      // [n_tokens]
  std::vector<int32_t> positions;   // [n_tokens] positions the KV was computed at
  // Per layer l: rows [0, base.n_rows) of K and V come from `base`; the rest,
  // [n_tokens - base.n_rows, kv_dim], are the entry's own: k[l], v[l] (f32) for an f32
  // entry, k16[l], v16[l] (IEEE half bits) for an f16 one, kq[l], vq[l] (the rows' bytes,
  // k_row_size() / v_row_size() each) for a quantized one (q8_0/q4_0 too: K's rows in
  // q8_0, V's in q4_0); the other pairs are empty (or hold empty layers). K is before
  // RoPE. A kivi4 entry's own K rows are f32 (k[l]; its groups are formed when it is
  // serialized) and its V rows q4_0 (vq[l]); its base is a serialized entry or none.
  KvRowsBase base;
  std::vector<std::vector<float>> k, v;
  std::vector<std::vector<uint16_t>> k16, v16;
  std::vector<std::vector<uint8_t>> kq, vq;
  // Blobs saved with the entry (distinct kinds). They describe all of its slots: an
  // entry cut (TruncateTo) drops them.
  std::vector<EntryAttachment> attachments;

  int n_tokens() const { return static_cast<int>(tokens.size()); }
  // Bytes of one K / V row (KvRowBytes of the K / V type).
  size_t k_row_size() const { return KvRowBytes(KvTensorDtype(dtype, false), kv_dim, group); }
  size_t v_row_size() const { return KvRowBytes(KvTensorDtype(dtype, true), kv_dim, group); }
  // Layer `layer`'s own rows (of the entry's K / V type).
  const char* own_k(int layer) const;
  const char* own_v(int layer) const;
  // Bytes of every layer's own K and V rows.
  uint64_t own_kv_bytes() const;
  // Row `row` of layer `layer`'s K / V, from the base or the entry's own rows: one row
  // of the entry's K / V type (k_row_size() / v_row_size(); k_row / v_row: f32 entries
  // only). kivi4's K: a stored base's codes, or an own f32 row -- read it with KRowF32.
  const char* k_row_bytes(int layer, int row) const;
  const char* v_row_bytes(int layer, int row) const;
  const float* k_row(int layer, int row) const { return reinterpret_cast<const float*>(k_row_bytes(layer, row)); }
  const float* v_row(int layer, int row) const { return reinterpret_cast<const float*>(v_row_bytes(layer, row)); }
  // Row `row` of layer `layer`'s K as f32, whatever the type (kivi4: the only way to
  // read its K).
  void KRowF32(int layer, int row, float* y) const;
  // A kivi4 entry's K groups as it serializes them (each group's end token): the base's
  // groups (the last one cut at the base's rows), then the own rows' in groups of
  // kKivi4GroupTokens. Empty for the other types.
  std::vector<int32_t> KGroupEnds() const;
  EntryKey key() const;
  // Size of Serialize()'s output.
  uint64_t SerializedBytes() const;
  // Keeps the first n tokens (and their KV); drops the attachments when it cuts.
  void TruncateTo(int n);
  // The attachment of that kind, or null.
  const EntryAttachment* attachment(std::string_view kind) const;
  // Bytes of the attachments' contents.
  uint64_t attachment_bytes() const;
};

// Checks shapes (k/v per layer, positions per token). InvalidArgument when inconsistent.
Status ValidateEntry(const KvEntry& entry);
// The serialized entry in a store buffer (aligned, for the tiers).
StatusOr<std::unique_ptr<Bytes>> SerializeEntryBytes(const KvEntry& entry);
// The same bytes as a string.
StatusOr<std::string> SerializeEntry(const KvEntry& entry);

// An attachment as the header describes it; its bytes lie at [offset, offset + size)
// of the serialized entry.
struct AttachmentInfo {
  std::string kind;
  uint64_t offset = 0, size = 0, checksum = 0;
};

struct EntryHeader {
  KvEntry meta;                            // everything but k/v and the attachments
  std::vector<uint64_t> layer_checksums;   // [n_layers]
  uint64_t data_offset = 0;                // where layer 0 starts
  uint64_t layer_bytes = 0;                // bytes of one layer's K+V
  uint64_t layer_k_bytes = 0;              // of which K's (its V follows)
  uint64_t total_bytes = 0;
  std::vector<int32_t> k_group_ends;       // kivi4's K groups (their end tokens); empty otherwise
  std::vector<AttachmentInfo> attachments; // version 2; none for version 1
};

// Parses and verifies the header only (magic, version, bounds, header checksum).
// DataLoss on anything malformed.
StatusOr<EntryHeader> ParseEntryHeader(std::string_view bytes);
// Rows [0, n_rows) of the serialized entry `bytes` (header `h`) as a KvEntry base.
KvRowsBase EntryRowsBase(SharedBytes bytes, const EntryHeader& h, int n_rows);

// Layer l's K and V inside a serialized entry whose header is `h` (bytes.size() must
// be h.total_bytes): n_tokens rows of the entry's dtype each, 16-byte aligned when
// `bytes` is. EntryLayerK / V: f32 entries.
const char* EntryLayerKBytes(std::string_view bytes, const EntryHeader& h, int layer);
const char* EntryLayerVBytes(std::string_view bytes, const EntryHeader& h, int layer);
inline const float* EntryLayerK(std::string_view bytes, const EntryHeader& h, int layer) {
  return reinterpret_cast<const float*>(EntryLayerKBytes(bytes, h, layer));
}
inline const float* EntryLayerV(std::string_view bytes, const EntryHeader& h, int layer) {
  return reinterpret_cast<const float*>(EntryLayerVBytes(bytes, h, layer));
}
// Checks layer l's checksum (and a quantized layer's scales as the quantizer writes them:
// every one finite, and for q8_0 not negative; q4_0's carry the sign of the group's
// largest-magnitude value). DataLoss on a mismatch or a bad scale.
Status VerifyEntryLayer(std::string_view bytes, const EntryHeader& h, int layer);

// Reading an entry a layer at a time (Tier::GetRange; layer_read.h):
// How many leading bytes the header of a serialized entry takes (its data_offset),
// from a prefix of the entry: OutOfRange when `prefix` is too short to tell, DataLoss
// when it is not an entry header.
StatusOr<uint64_t> EntryHeaderBytes(std::string_view prefix);
// Where layer l's K and V lie in the serialized entry: [offset, offset + h.layer_bytes).
uint64_t EntryLayerOffset(const EntryHeader& h, int layer);
// Checks `layer_bytes` (layer l's K then V, h.layer_bytes of them) against the layer's
// checksum (and a quantized layer's scales, as VerifyEntryLayer). DataLoss on a mismatch,
// a bad scale or a wrong size.
Status VerifyLayerBytes(std::string_view layer_bytes, const EntryHeader& h, int layer);

// The attachment `kind` of the serialized entry `bytes` (header `h`, size checked),
// verified against its checksum: NotFound when the entry has none, DataLoss when its
// bytes are bad (the KV may still be good: its layers have their own checksums).
StatusOr<std::string_view> EntryAttachmentBytes(std::string_view bytes, const EntryHeader& h, std::string_view kind);

// Parses the header and verifies the size and every layer's checksum (unless
// !check_layers), without copying the KV. Attachments are not verified here (a bad one
// does not make the entry bad): EntryAttachmentBytes checks each when it is read. `expected_fingerprint` non-empty: another
// model's entry is FailedPrecondition. A truncated buffer or a bad checksum is DataLoss.
StatusOr<EntryHeader> VerifyEntry(std::string_view bytes, const std::string& expected_fingerprint = "",
                                  bool check_layers = true);
// The entry VerifyEntry accepted, copied out of `bytes`, with the attachments whose
// checksums hold (a bad one is left out).
KvEntry MaterializeEntry(std::string_view bytes, EntryHeader header);

// Parses and verifies everything (VerifyEntry + MaterializeEntry).
StatusOr<KvEntry> DeserializeEntry(std::string_view bytes, const std::string& expected_fingerprint = "");

}  // namespace attic::store
