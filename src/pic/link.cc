// KV linking: the methods' recompute sets and CacheBlend's selection (attic/pic/link.h).
#include "attic/pic/link.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>

namespace attic::pic {

const char* LinkMethodName(LinkMethod m) {
  switch (m) {
    case LinkMethod::kNaive: return "naive";
    case LinkMethod::kFull: return "full";
    case LinkMethod::kAttnLink: return "attnlink";
    case LinkMethod::kCacheBlend: return "cacheblend";
  }
  return "?";
}

StatusOr<LinkMethod> ParseLinkMethod(std::string_view name) {
  for (LinkMethod m : {LinkMethod::kNaive, LinkMethod::kFull, LinkMethod::kAttnLink, LinkMethod::kCacheBlend})
    if (name == LinkMethodName(m)) return m;
  return InvalidArgumentError("unknown link method '" + std::string(name) +
                              "' (expected one of: attnlink, cacheblend, naive, full)");
}

Status LinkOptions::Validate(int n_layers) const {
  if (method == LinkMethod::kAttnLink && (k < 0 || k > (1 << 20)))
    return InvalidArgumentError("link k must be between 0 and 1048576, got " + std::to_string(k));
  if (method == LinkMethod::kCacheBlend) {
    if (!(ratio >= 0 && ratio <= 1))
      return InvalidArgumentError("link ratio must be between 0 and 1, got " + std::to_string(ratio));
    if (check_layer < 0 || check_layer >= n_layers)
      return InvalidArgumentError("link check_layer must be between 0 and " + std::to_string(n_layers - 1) +
                                  " (the model's layers), got " + std::to_string(check_layer));
  }
  return OkStatus();
}

std::string LinkOptions::ToString() const {
  char buf[64];
  switch (method) {
    case LinkMethod::kAttnLink: std::snprintf(buf, sizeof buf, "attnlink-%d", k); return buf;
    case LinkMethod::kCacheBlend: std::snprintf(buf, sizeof buf, "cacheblend-%g@%d", ratio, check_layer); return buf;
    default: return LinkMethodName(method);
  }
}

StatusOr<LinkOptions> ParseLinkOptions(std::string_view text) {
  const size_t dash = text.find('-');
  LinkOptions o;
  ATTIC_ASSIGN_OR_RETURN(o.method, ParseLinkMethod(text.substr(0, dash)));
  if (dash == std::string_view::npos) return o;
  const std::string arg(text.substr(dash + 1));
  const auto bad = [&] {
    return InvalidArgumentError("bad link method '" + std::string(text) +
                                "' (expected naive, full, attnlink-K or cacheblend-RATIO[@LAYER])");
  };
  char* end = nullptr;
  if (o.method == LinkMethod::kAttnLink) {
    const long k = std::strtol(arg.c_str(), &end, 10);
    if (arg.empty() || *end != '\0' || k < 0 || k > (1 << 20)) return bad();
    o.k = static_cast<int>(k);
  } else if (o.method == LinkMethod::kCacheBlend) {
    o.ratio = std::strtod(arg.c_str(), &end);
    if (end == arg.c_str()) return bad();
    if (*end == '@') {
      const char* l = end + 1;
      const long layer = std::strtol(l, &end, 10);
      if (end == l || layer < 0) return bad();
      o.check_layer = static_cast<int>(layer);
    }
    if (*end != '\0' || !(o.ratio >= 0 && o.ratio <= 1)) return bad();
  } else {
    return bad();
  }
  return o;
}

Status LinkSpec::Validate(int n_prompt, int n_layers) const {
  ATTIC_RETURN_IF_ERROR(options.Validate(n_layers));
  int end = 0;
  for (const LinkedChunk& c : chunks) {
    if (c.n < 1 || c.slot < end || c.src_row < 0 || c.slot + c.n > n_prompt || c.store_key.empty())
      return InvalidArgumentError("linked chunks must be non-empty, ascending, disjoint and inside the prompt");
    end = c.slot + c.n;
  }
  return OkStatus();
}

std::vector<int32_t> LinkComputeSlots(const LinkOptions& options, const std::vector<LinkedChunk>& present, int from,
                                      int n_prompt) {
  std::vector<uint8_t> compute(static_cast<size_t>(std::max(0, n_prompt - from)), 0);
  auto mark = [&](int lo, int hi) {
    for (int s = std::max(lo, from); s < std::min(hi, n_prompt); ++s) compute[s - from] = 1;
  };
  const bool all = options.method == LinkMethod::kFull || options.method == LinkMethod::kCacheBlend;
  int covered_to = from;
  for (const LinkedChunk& c : present) {
    mark(covered_to, c.slot);  // uncached tokens before the chunk
    covered_to = c.slot + c.n;
    if (all) mark(c.slot, c.slot + c.n);
    if (options.method == LinkMethod::kAttnLink) {
      // The boundary in front of the chunk (its first k/2 tokens: the "initial" tokens
      // that would sink attention) and behind it (its last k/2, before whatever follows).
      const int head = (options.k + 1) / 2, tail = options.k / 2;
      mark(c.slot, c.slot + head);
      mark(c.slot + c.n - tail, c.slot + c.n);
    }
  }
  mark(covered_to, n_prompt);
  if (n_prompt > from) compute.back() = 1;
  std::vector<int32_t> slots;
  for (size_t i = 0; i < compute.size(); ++i)
    if (compute[i]) slots.push_back(from + static_cast<int32_t>(i));
  return slots;
}

CacheBlendHooks::CacheBlendHooks(const kv::SequenceKv* seq, std::vector<uint8_t> is_chunk_slot, int last_slot,
                                 double ratio, int check_layer)
    : seq_(seq), is_chunk_(std::move(is_chunk_slot)), last_slot_(last_slot), ratio_(ratio), check_layer_(check_layer) {}

void CacheBlendHooks::OnKv(int layer, const kv::EntryRows& rows, const kv::LayerKv& kv) {
  if (rows.entry != entry_ || layer != check_layer_) return;
  const int kvd = seq_->pool()->shape().kv_dim();
  keep_.assign(rows.n_rows, 1);
  // Deviation of each chunk row's fresh KV from the cached KV at the same slot (both
  // rotated to the slot's position), the quantity CacheBlend ranks tokens by.
  std::vector<std::pair<double, int>> dev;
  k_old_.resize(kvd);
  v_old_.resize(kvd);
  for (int i = 0; i < rows.n_rows; ++i) {
    const int s = rows.slots[i];
    if (s >= static_cast<int>(is_chunk_.size()) || !is_chunk_[s] || s == last_slot_) continue;
    seq_->ReadKv(layer, s, 1, k_old_.data(), v_old_.data());
    double d = 0;
    const float* k = kv.k + static_cast<size_t>(i) * kvd;
    const float* v = kv.v + static_cast<size_t>(i) * kvd;
    for (int j = 0; j < kvd; ++j) {
      const double dk = k[j] - k_old_[j], dv = v[j] - v_old_[j];
      d += dk * dk + dv * dv;
    }
    dev.push_back({d, i});
    keep_[i] = 0;
  }
  const int n_keep = static_cast<int>(std::ceil(ratio_ * static_cast<double>(dev.size()) - 1e-9));
  std::partial_sort(dev.begin(), dev.begin() + n_keep, dev.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  for (int j = 0; j < n_keep; ++j) keep_[dev[j].second] = 1;
  selected_ += n_keep;
}

void CacheBlendHooks::AfterLayer(int layer, const kv::EntryRows& rows, uint8_t* keep) {
  if (rows.entry != entry_ || layer != check_layer_ || static_cast<int>(keep_.size()) != rows.n_rows) return;
  std::copy(keep_.begin(), keep_.end(), keep);
}

LinkRun::LinkRun(const LinkOptions& options, const std::vector<LinkedChunk>& present, int from, int n_prompt,
                 const kv::SequenceKv* seq)
    : slots_(LinkComputeSlots(options, present, from, n_prompt)) {
  std::vector<uint8_t> is_chunk(static_cast<size_t>(n_prompt), 0);
  for (const LinkedChunk& c : present) std::fill(is_chunk.begin() + c.slot, is_chunk.begin() + c.slot + c.n, 1);
  if (options.method == LinkMethod::kCacheBlend) {
    blend_ = std::make_unique<CacheBlendHooks>(seq, std::move(is_chunk), n_prompt - 1, options.ratio,
                                               options.check_layer);
  } else {
    for (int32_t s : slots_) recomputed_ += is_chunk[s];
  }
}

}  // namespace attic::pic
