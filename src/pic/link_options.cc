// KV linking's options: method names, parsing and validation (attic/pic/link.h). Apart
// from link.cc's compute hooks so that what parses requests (the server, its fuzz
// harness) needs no compute code.
#include "attic/pic/link.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

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

}  // namespace attic::pic
