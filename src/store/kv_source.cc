#include "attic/store/kv_source.h"

namespace attic::store {

std::shared_ptr<const KvSource> KvSource::Stored(SharedBytes bytes, EntryHeader header, std::string key) {
  std::shared_ptr<KvSource> s(new KvSource());
  s->bytes_ = std::move(bytes);
  s->header_ = std::move(header);
  s->key_ = std::move(key);
  return s;
}

std::shared_ptr<const KvSource> KvSource::Queued(std::shared_ptr<const KvEntry> entry) {
  std::shared_ptr<KvSource> s(new KvSource());
  s->queued_ = std::move(entry);
  return s;
}

StatusOr<std::string_view> KvSource::attachment(std::string_view kind) const {
  if (queued_ != nullptr) {
    const EntryAttachment* a = queued_->attachment(kind);
    if (a == nullptr) return NotFoundError("KV entry has no attachment " + std::string(kind));
    return std::string_view(*a->bytes);
  }
  return EntryAttachmentBytes(*bytes_, header_, kind);
}

KvSource::Layer KvSource::layer(int l) const {
  const KvEntry& m = meta();
  const size_t kv_dim = static_cast<size_t>(m.kv_dim), elem_bytes = m.elem_bytes();
  if (queued_) return {queued_.get(), l, nullptr, nullptr, kv_dim, elem_bytes};
  return {nullptr, l, EntryLayerK(*bytes_, header_, l), EntryLayerV(*bytes_, header_, l), kv_dim, elem_bytes};
}

}  // namespace attic::store
