// Reading a stored entry one layer at a time through Tier::GetRange: the header first,
// then each layer's K and V as one range, verified against that layer's checksum as
// soon as it arrives (entry.h's layout). This is what lets a tier that delivers values
// per layer (a remote one) feed layer-wise preloading: layer 0 can enter the compute
// buffer while later layers are still in flight. The local tiers are read whole today
// (KvStore::Fetch): one read of a DRAM value or an SSD file is cheaper than many.
//
// Thread-safety: stateless; as safe as the tier.
#pragma once

#include <string>

#include "attic/core/status.h"
#include "attic/store/entry.h"
#include "attic/store/tier.h"

namespace attic::store {

// The header of `key`'s entry in `tier` (read by ranges: 4096 bytes, more when the
// header is longer), checked like VerifyEntry's header: DataLoss when it is not a
// well-formed header, FailedPrecondition when `expected_fingerprint` is non-empty and
// the entry is another model's; the tier's NotFound and transient errors as they are.
// With `raw`: the bytes read, at least [0, data_offset) of the value (the header and its
// padding, as stored).
StatusOr<EntryHeader> ReadEntryHeader(Tier& tier, const std::string& key, const std::string& expected_fingerprint,
                                      ByteRange* raw = nullptr);

// Layer `layer` of the entry: K and V, [n_tokens, kv_dim] f32 each, kept alive by `bytes`.
struct EntryLayerRead {
  ByteRange bytes;
  const float* k = nullptr;
  const float* v = nullptr;
};

// Reads layer `layer` of `key`'s entry (header `h`, from ReadEntryHeader) and verifies
// its checksum: DataLoss on a mismatch or when the value ends before the layer.
StatusOr<EntryLayerRead> ReadEntryLayer(Tier& tier, const std::string& key, const EntryHeader& h, int layer);
// The same, received into `dst` (h.layer_bytes of room) through Tier::ReadInto: where the
// serialized entry holds the layer in a buffer of the entry's size (a streamed load).
Status ReadEntryLayerInto(Tier& tier, const std::string& key, const EntryHeader& h, int layer, char* dst);

}  // namespace attic::store
