#include "attic/store/kv_source.h"

#include <algorithm>
#include <cstring>

#include "attic/backend/convert.h"

namespace attic::store {

std::shared_ptr<const KvSource> KvSource::Stored(SharedBytes bytes, EntryHeader header, std::string key) {
  std::shared_ptr<KvSource> s(new KvSource());
  s->bytes_ = std::move(bytes);
  s->header_ = std::move(header);
  s->key_ = std::move(key);
  return s;
}

std::shared_ptr<const KvSource> KvSource::Streamed(SharedBytes bytes, EntryHeader header, std::string key,
                                                   std::shared_ptr<KvStream> stream) {
  std::shared_ptr<KvSource> s(new KvSource());
  s->bytes_ = std::move(bytes);
  s->header_ = std::move(header);
  s->key_ = std::move(key);
  s->stream_ = std::move(stream);
  return s;
}

Status KvSource::AwaitAll() const {
  if (!stream_) return Status();
  if (n_layers() > 0) ATTIC_RETURN_IF_ERROR(stream_->AwaitLayer(n_layers() - 1));
  return stream_->AwaitAttachments();
}

void KvStream::PublishLayers(int n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    layers_ = n;
  }
  cv_.notify_all();
}

void KvStream::PublishAttachments() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    attachments_ = true;
  }
  cv_.notify_all();
}

void KvStream::Fail(Status why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = why.ok() ? InternalError("KV read failed") : std::move(why);
  }
  cv_.notify_all();
}

Status KvStream::AwaitLayer(int l) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return layers_ > l || !error_.ok(); });
  return layers_ > l ? Status() : error_;
}

Status KvStream::AwaitAttachments() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return attachments_ || !error_.ok(); });
  return attachments_ ? Status() : error_;
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
  ATTIC_RETURN_IF_ERROR(AwaitAttachments());
  return EntryAttachmentBytes(*bytes_, header_, kind);
}

KvSource::Layer KvSource::layer(int l) const {
  const KvEntry& m = meta();
  const size_t k_row = m.k_row_size(), v_row = m.v_row_size();
  if (queued_) return {queued_.get(), l, nullptr, nullptr, k_row, v_row};
  return {nullptr, l, EntryLayerKBytes(*bytes_, header_, l), EntryLayerVBytes(*bytes_, header_, l), k_row, v_row,
          &header_.k_group_ends, m.n_tokens(), m.kv_dim};
}

GroupedKRows::GroupedKRows(const KvSource::Layer& src) : src_(src) {
  if (src_.k == nullptr) return;  // a queued save: KF32
  const size_t n_groups = src_.k_group_ends->size(), per_group = 2 * static_cast<size_t>(src_.kv_dim);
  params_.resize(n_groups * per_group);
  std::vector<uint16_t> bits(params_.size());
  // The layer's bytes are 16-byte aligned, the parameters only 2-byte: copied out first.
  std::memcpy(bits.data(), src_.k + static_cast<size_t>(src_.n_rows) * src_.kv_dim / 2, bits.size() * 2);
  backend::ConvertF16ToF32(bits.data(), params_.data(), static_cast<int64_t>(bits.size()));
}

void GroupedKRows::Row(int row, float* y) const {
  if (src_.k == nullptr) return src_.KF32(row, y);
  const std::vector<int32_t>& ends = *src_.k_group_ends;
  const size_t g = static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), row) - ends.begin());
  const int kvd = src_.kv_dim;
  const float* scales = params_.data() + g * 2 * kvd;
  DequantizeKGroupRowF32(reinterpret_cast<const uint8_t*>(src_.k) + static_cast<size_t>(row) * kvd / 2, scales,
                         scales + kvd, kvd, y);
}

}  // namespace attic::store
