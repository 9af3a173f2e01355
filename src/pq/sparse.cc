// Sparse decoding's options, names and budget (attic/pq/sparse.h); the selectors are in
// selectors.cc (full, oracle, streaming, h2o) and pq_selector.cc (pq).
#include "attic/pq/sparse.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "pq/sparse_internal.h"

namespace attic::pq {

const char* SparseMethodName(SparseMethod m) {
  switch (m) {
    case SparseMethod::kFull: return "full";
    case SparseMethod::kPq: return "pq";
    case SparseMethod::kOracle: return "oracle";
    case SparseMethod::kStreaming: return "streaming";
    case SparseMethod::kH2o: return "h2o";
  }
  return "?";
}

StatusOr<SparseMethod> ParseSparseMethod(std::string_view name) {
  for (SparseMethod m : kSparseMethods)
    if (name == SparseMethodName(m)) return m;
  return NotFoundError("unknown sparse method '" + std::string(name) + "'");
}

std::string SparseMethodNames() {
  std::string names;
  for (SparseMethod m : kSparseMethods) names += std::string(names.empty() ? "" : ", ") + SparseMethodName(m);
  return names;
}

namespace {

// The checks that need no model shape (ParseSparseOptions runs them too).
Status ValidateShapeFree(const SparseOptions& o) {
  if (!(o.ratio > 0 && o.ratio <= 1)) {
    return InvalidArgumentError("sparse ratio must be in (0, 1], got " + std::to_string(o.ratio));
  }
  if (o.count < 0) return InvalidArgumentError("sparse count must be >= 0, got " + std::to_string(o.count));
  if (o.n_initial < 0) return InvalidArgumentError("sparse initial must be >= 0, got " + std::to_string(o.n_initial));
  if (o.n_local < -1) {
    return InvalidArgumentError("sparse local must be >= 0 (or -1: a quarter of the budget), got " +
                                std::to_string(o.n_local));
  }
  if (o.min_slots < 0) return InvalidArgumentError("sparse min must be >= 0, got " + std::to_string(o.min_slots));
  if (!(o.cluster_share > 0 && o.cluster_share <= 1)) {
    return InvalidArgumentError("sparse share must be in (0, 1], got " + std::to_string(o.cluster_share));
  }
  if (o.pq.bits < 1 || o.pq.bits > 8) return InvalidArgumentError("pq bits must be in [1, 8], got " + std::to_string(o.pq.bits));
  if (o.pq.m < 1) return InvalidArgumentError("pq m must be >= 1, got " + std::to_string(o.pq.m));
  if (o.pq.iterations < 1) {
    return InvalidArgumentError("pq iterations must be >= 1, got " + std::to_string(o.pq.iterations));
  }
  if (o.offload_cache_blocks < -1) {
    return InvalidArgumentError("sparse offload cache blocks must be >= 0, got " + std::to_string(o.offload_cache_blocks));
  }
  if (o.offload() && o.method != SparseMethod::kPq && o.method != SparseMethod::kStreaming) {
    return InvalidArgumentError(std::string("sparse offload needs method pq or streaming (") + SparseMethodName(o.method) +
                                " reads every key at every step)");
  }
  return OkStatus();
}

std::string FormatDouble(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

// A ratio keeps its decimal point ("1.0", not "1"): that is what tells it from a count.
std::string FormatRatio(double x) {
  std::string s = FormatDouble(x);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

bool ParseInt(std::string_view s, int* out) {
  if (s.empty() || s.size() > 10) return false;
  std::string str(s);
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(str.c_str(), &end, 10);
  if (errno != 0 || end != str.c_str() + str.size() || v < -2147483647L || v > 2147483647L) return false;
  *out = static_cast<int>(v);
  return true;
}

bool ParseDouble(std::string_view s, double* out) {
  if (s.empty()) return false;
  std::string str(s);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(str.c_str(), &end);
  if (errno != 0 || end != str.c_str() + str.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace

Status SparseOptions::Validate(int head_dim) const {
  ATTIC_RETURN_IF_ERROR(ValidateShapeFree(*this));
  if (method == SparseMethod::kPq) ATTIC_RETURN_IF_ERROR(pq.Validate(head_dim));
  return OkStatus();
}

std::string SparseOptions::ToString() const {
  std::string s = SparseMethodName(method);
  if (method == SparseMethod::kFull) return s;
  s += "-" + (count > 0 ? std::to_string(count) : FormatRatio(ratio));
  const SparseOptions d;
  std::vector<std::string> kv;
  if (n_initial != d.n_initial) kv.push_back("initial=" + std::to_string(n_initial));
  if (n_local != d.n_local) kv.push_back("local=" + std::to_string(n_local));
  if (min_slots != d.min_slots) kv.push_back("min=" + std::to_string(min_slots));
  if (combine != d.combine) kv.push_back(std::string("combine=") + (combine == GqaCombine::kSum ? "sum" : "max"));
  if (pq.m != d.pq.m) kv.push_back("m=" + std::to_string(pq.m));
  if (pq.bits != d.pq.bits) kv.push_back("bits=" + std::to_string(pq.bits));
  if (fixed_iterations) kv.push_back("iters=" + std::to_string(pq.iterations));
  if (cluster_share != d.cluster_share) kv.push_back("share=" + FormatDouble(cluster_share));
  if (offload()) kv.push_back("offload=" + std::to_string(offload_cache_blocks));
  if (offload_policy != d.offload_policy) kv.push_back(std::string("cache=") + CachePolicyName(offload_policy));
  for (size_t i = 0; i < kv.size(); ++i) s += (i == 0 ? "@" : ",") + kv[i];
  return s;
}

StatusOr<SparseOptions> ParseSparseOptions(std::string_view text) {
  const std::string whole(text);
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("sparse method '" + whole + "': " + why +
                                " (METHOD[-RATIO|-COUNT][@key=value,...], methods full, pq, oracle, streaming, h2o;"
                                " keys initial, local, min, combine, m, bits, iters, share, offload, cache)");
  };
  SparseOptions o;
  std::string_view head = text, tail;
  if (const size_t at = text.find('@'); at != std::string_view::npos) {
    head = text.substr(0, at);
    tail = text.substr(at + 1);
    if (tail.empty()) return bad("nothing after '@'");
  }
  std::string_view name = head, budget;
  if (const size_t dash = head.find('-'); dash != std::string_view::npos) {
    name = head.substr(0, dash);
    budget = head.substr(dash + 1);
    if (budget.empty()) return bad("nothing after '-'");
  }
  StatusOr<SparseMethod> method = ParseSparseMethod(name);
  if (!method.ok()) return bad("unknown method '" + std::string(name) + "'");
  o.method = *method;
  if (o.method == SparseMethod::kFull && (!budget.empty() || !tail.empty())) return bad("full takes no budget or options");
  if (!budget.empty()) {
    if (budget.find_first_of(".eE") != std::string_view::npos) {
      if (!ParseDouble(budget, &o.ratio)) return bad("bad ratio '" + std::string(budget) + "'");
    } else {
      if (!ParseInt(budget, &o.count) || o.count < 1) return bad("bad count '" + std::string(budget) + "'");
    }
  }
  while (!tail.empty()) {
    const size_t comma = tail.find(',');
    const std::string_view item = tail.substr(0, comma);
    tail = comma == std::string_view::npos ? std::string_view() : tail.substr(comma + 1);
    if (comma != std::string_view::npos && tail.empty()) return bad("trailing ','");
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return bad("option '" + std::string(item) + "' is not key=value");
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    const std::string v(value);
    int* int_field = nullptr;
    if (key == "initial") int_field = &o.n_initial;
    else if (key == "local") int_field = &o.n_local;
    else if (key == "min") int_field = &o.min_slots;
    else if (key == "m") int_field = &o.pq.m;
    else if (key == "bits") int_field = &o.pq.bits;
    else if (key == "offload") int_field = &o.offload_cache_blocks;
    else if (key == "iters") {
      int_field = &o.pq.iterations;
      o.fixed_iterations = true;
    }
    if (int_field != nullptr) {
      if (!ParseInt(value, int_field)) return bad("bad integer '" + v + "' for " + std::string(key));
    } else if (key == "combine") {
      if (value == "sum") o.combine = GqaCombine::kSum;
      else if (value == "max") o.combine = GqaCombine::kMax;
      else return bad("combine must be sum or max, got '" + v + "'");
    } else if (key == "cache") {
      if (value == "lru") o.offload_policy = CachePolicy::kLru;
      else if (value == "lfu") o.offload_policy = CachePolicy::kLfu;
      else return bad("cache must be lru or lfu, got '" + v + "'");
    } else if (key == "share") {
      if (!ParseDouble(value, &o.cluster_share)) return bad("bad number '" + v + "' for share");
    } else {
      return bad("unknown key '" + std::string(key) + "'");
    }
  }
  if (Status s = ValidateShapeFree(o); !s.ok()) return bad(s.message());
  return o;
}

Budget SplitBudget(const SparseOptions& options, int n_slots) {
  Budget b;
  if (n_slots <= 0) return b;
  // Rounded to nearest: ratio * n_slots is inexact in binary (0.2 * 500 = 100.00000000000001),
  // and ceil would then take one slot more than asked.
  int64_t budget = options.method == SparseMethod::kFull ? n_slots
                   : options.count > 0                    ? options.count
                                                          : std::llround(options.ratio * n_slots);
  const int total = static_cast<int>(std::clamp<int64_t>(budget, 1, n_slots));
  // The decoding token's own slot is the last local one: it always attends to itself,
  // so local >= 1 and the initial slots give way first when the budget is tiny.
  b.initial = std::min(options.n_initial, total - 1);
  const int rest = total - b.initial;
  int local = options.method == SparseMethod::kStreaming ? rest
              : options.n_local < 0                     ? (total + 2) / 4  // a quarter, rounded
                                                        : options.n_local;
  b.local = std::clamp(local, 1, rest);
  b.top = rest - b.local;
  return b;
}

std::unique_ptr<SparseAttention> MakeSparseAttention(const SparseOptions& options, const attention::AttentionShape& shape,
                                                     int n_layers, backend::ThreadPool& pool) {
  ATTIC_CHECK(options.Validate(shape.head_dim).ok());
  ATTIC_CHECK(shape.n_kv_heads > 0 && shape.n_heads % shape.n_kv_heads == 0 && n_layers > 0);
  switch (options.method) {
    case SparseMethod::kPq: return internal::MakePqSelector(options, shape, n_layers, pool);
    case SparseMethod::kH2o: return internal::MakeH2oSelector(options, shape, n_layers, pool);
    case SparseMethod::kOracle: return internal::MakeOracleSelector(options, shape, n_layers, pool);
    case SparseMethod::kFull:
    case SparseMethod::kStreaming: return internal::MakeWindowSelector(options, shape, n_layers, pool);
  }
  return nullptr;
}

}  // namespace attic::pq
