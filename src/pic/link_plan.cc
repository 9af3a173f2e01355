// Planning a linked prompt against the KV store (link_plan.h).
#include "attic/pic/link_plan.h"

#include <algorithm>

namespace attic::pic {

LinkedLoad OpenLinkedChunks(store::KvStore& store, const LinkSpec& spec, const std::string& tenant,
                            const std::vector<int32_t>& prompt, int from, const kv::KvShape& shape) {
  LinkedLoad load;
  for (const LinkedChunk& c : spec.chunks) {
    if (c.slot + c.n <= from) continue;  // in the stored prefix already (a conversation's next turn)
    const int cut = std::max(0, from - c.slot);
    store::StoreHit hit;
    hit.key = c.store_key;
    hit.n_tokens = hit.entry_tokens = c.src_row + c.n;
    auto src = store.OpenForTurn(hit);
    if (!src.ok()) continue;  // gone (evicted, expired, bad): its tokens are computed
    const store::KvSource& s = **src;
    // A chunk is linked only into a request of the tenant that stored it (the key names
    // the tenant; the entry says it too), and only when it is of the store's type (a
    // chunk another store type saved is computed: docs/store.md "Which dtype is stored").
    if (s.meta().tenant != tenant || s.dtype() != store.kv_dtype() || s.n_layers() != shape.n_layers ||
        s.kv_dim() != shape.kv_dim() ||
        s.n_rows() < c.src_row + c.n ||
        !std::equal(s.meta().tokens.begin() + c.src_row + cut, s.meta().tokens.begin() + c.src_row + c.n,
                    prompt.begin() + c.slot + cut))
      continue;
    load.segments.push_back({*src, c.src_row + cut, c.n - cut, c.slot + cut});
    load.present.push_back({c.slot + cut, c.n - cut, c.store_key, c.src_row + cut});
  }
  return load;
}

int LinkedEnd(const LinkSpec& spec) {
  return spec.chunks.empty() ? 0 : spec.chunks.back().slot + spec.chunks.back().n;
}

std::shared_ptr<const LinkSpec> TruncateLinkSpec(const LinkSpec& spec, int keep, int drop) {
  auto out = std::make_shared<LinkSpec>(spec);
  out->chunks.clear();
  for (const LinkedChunk& c : spec.chunks) {
    if (c.slot < keep) out->chunks.push_back({c.slot, std::min(c.n, keep - c.slot), c.store_key, c.src_row});
    const int from = std::max(c.slot, keep + drop);
    if (from < c.slot + c.n)
      out->chunks.push_back({from - drop, c.slot + c.n - from, c.store_key, c.src_row + (from - c.slot)});
  }
  if (out->chunks.empty()) return nullptr;
  return out;
}

void AppendLinkedJobs(const LinkSpec& spec, const std::string& tenant, std::vector<store::QueuedJob>* jobs) {
  if (spec.options.method == LinkMethod::kFull) return;
  for (const LinkedChunk& c : spec.chunks) jobs->push_back({tenant, "", {}, c.n, c.store_key});
}

}  // namespace attic::pic
