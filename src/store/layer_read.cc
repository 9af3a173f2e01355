#include "attic/store/layer_read.h"

namespace attic::store {

namespace {
constexpr uint64_t kFirstRead = 4096;  // the header's usual size (it is padded to 4096)

// A layer read's error: a value that ends before the layer is a truncated entry.
Status LayerReadError(const Status& st, const std::string& key, int layer) {
  if (st.code() == StatusCode::kOutOfRange)
    return DataLossError("KV entry " + key + " ends before layer " + std::to_string(layer));
  return st;
}
}  // namespace

StatusOr<EntryHeader> ReadEntryHeader(Tier& tier, const std::string& key, const std::string& expected_fingerprint,
                                      ByteRange* raw) {
  // A value shorter than what is asked is a truncated entry (DataLoss), not a caller's
  // out-of-range request.
  auto read = [&](uint64_t n) -> StatusOr<ByteRange> {
    StatusOr<ByteRange> r = tier.GetRange(key, 0, n);
    if (!r.ok() && r.status().code() == StatusCode::kOutOfRange) return DataLossError("truncated KV entry " + key);
    return r;
  };
  ATTIC_ASSIGN_OR_RETURN(ByteRange head, read(kFirstRead));
  StatusOr<uint64_t> size = EntryHeaderBytes(head.view());
  for (uint64_t n = kFirstRead; !size.ok() && size.status().code() == StatusCode::kOutOfRange;) {
    n *= 2;  // only a header with long strings does not tell its size from 4096 bytes
    ATTIC_ASSIGN_OR_RETURN(head, read(n));
    size = EntryHeaderBytes(head.view());
  }
  if (!size.ok()) return size.status();
  if (*size > head.size) {
    ATTIC_ASSIGN_OR_RETURN(head, read(*size));
  }
  ATTIC_ASSIGN_OR_RETURN(EntryHeader h, ParseEntryHeader(head.view()));
  if (!expected_fingerprint.empty() && h.meta.fingerprint != expected_fingerprint)
    return FailedPreconditionError("KV entry belongs to another model");
  if (raw != nullptr) {
    if (head.size < h.data_offset) {
      ATTIC_ASSIGN_OR_RETURN(head, read(h.data_offset));
    }
    *raw = std::move(head);
  }
  return h;
}

StatusOr<EntryLayerRead> ReadEntryLayer(Tier& tier, const std::string& key, const EntryHeader& h, int layer) {
  if (layer < 0 || layer >= h.meta.n_layers) return InvalidArgumentError("no layer " + std::to_string(layer));
  StatusOr<ByteRange> r = tier.GetRange(key, EntryLayerOffset(h, layer), h.layer_bytes);
  if (!r.ok()) return LayerReadError(r.status(), key, layer);
  ATTIC_RETURN_IF_ERROR(VerifyLayerBytes(r->view(), h, layer));
  EntryLayerRead out;
  out.k = reinterpret_cast<const float*>(r->data);
  out.v = out.k + h.meta.tokens.size() * static_cast<size_t>(h.meta.kv_dim);
  out.bytes = std::move(*r);
  return out;
}

Status ReadEntryLayerInto(Tier& tier, const std::string& key, const EntryHeader& h, int layer, char* dst) {
  if (layer < 0 || layer >= h.meta.n_layers) return InvalidArgumentError("no layer " + std::to_string(layer));
  if (Status st = tier.ReadInto(key, EntryLayerOffset(h, layer), h.layer_bytes, dst); !st.ok())
    return LayerReadError(st, key, layer);
  return VerifyLayerBytes(std::string_view(dst, h.layer_bytes), h, layer);
}

}  // namespace attic::store
