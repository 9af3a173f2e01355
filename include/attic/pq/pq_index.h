// PqIndex: a PQ selector's index (sparse.h, method pq) as it leaves one request and
// enters a later one: per layer and KV head, the codebook and the codes of slots
// [0, n_coded). A conversation saved to the KV store keeps it beside its KV (an entry
// attachment, store/entry.h), so that its next turn decodes sparsely without clustering
// again (paper 004, section 3; issue "a session saved to the store keeps its PQ index").
//
// Positions: codes are those of keys as attention sees them (RoPE applied at each
// slot's position). The index is therefore valid for slots that hold the same tokens at
// the same positions as when it was built: a stored prefix reused as it is (slot s of
// the new sequence = row s of the entry, at the entry's position). A prefix of it stays
// valid (Truncate). Any other reuse -- truncation's re-embedded rows, linked chunks at
// new positions, a recomputed slot -- must drop it; the selector then clusters again.
// Slots after n_coded (the local window when it was built, and everything the new
// sequence adds) are coded by nearest centroid when they leave the local window, as new
// tokens always are.
//
// Serialized layout (little-endian; SerializePqIndex):
//   [0, 4)    magic "APQX"
//   [4]       version (kPqIndexVersion)
//   [5]       bits (1..8)
//   [6, 8)    m (u16)
//   [8, 12)   head_dim (u32)        m divides it
//   [12, 16)  n_layers (u32)
//   [16, 20)  n_kv_heads (u32)
//   per layer l:
//     u8 built (0: the layer has no index; nothing follows for it)
//     u32 n_coded
//     per KV head h: centroids [m][2^bits][head_dim / m] f32, codes [n_coded][m] u8
//   u64 xxh3 of every byte before it
// Codes of the initial slots are kept (the selector codes slots from 0) though they are
// never scored.
//
// Thread-safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attic/core/status.h"
#include "attic/pq/codebook.h"

namespace attic::pq {

inline constexpr uint8_t kPqIndexVersion = 1;
// The entry attachment's kind (store::EntryAttachment::kind) that carries it.
inline constexpr char kPqIndexAttachment[] = "pq-index";

struct PqIndex {
  struct Layer {
    bool built = false;
    int n_coded = 0;                          // slots [0, n_coded) are coded
    std::vector<PqCodebook> books;            // [kv_head]
    std::vector<std::vector<uint8_t>> codes;  // [kv_head][slot * m + s], n_coded * m bytes
  };
  int m = 0, bits = 0, head_dim = 0, n_kv_heads = 0;
  std::vector<Layer> layers;  // [n_layers]

  int n_layers() const { return static_cast<int>(layers.size()); }
  // Keeps the codes of slots [0, n) only (a reused prefix of n slots).
  void Truncate(int n);
  // Whether some layer is built.
  bool any_built() const;
};

// The serialized index. REQUIRES: shapes consistent (every built layer has n_kv_heads
// codebooks of m, bits, head_dim and n_coded * m codes per head).
std::string SerializePqIndex(const PqIndex& index);
// Parses and validates everything (magic, version, bounds, sizes, checksum, every code <
// 2^bits, finite centroids): DataLoss for anything malformed, never a partial index.
StatusOr<PqIndex> DeserializePqIndex(std::string_view bytes);

}  // namespace attic::pq
