// A KV entry read from the remote tier (src/store/redis/redis_tier.cc): the manifest that
// says where each part of a stored value starts (read from the cluster, so untrusted),
// and the value the parts assemble into.
//
// Byte 0 is the mode: 0 parses the rest as a manifest; 1 plans the rest as a value
// (Plan), stores the plan's manifest text and parses it back; both modes then verify
// the value as an entry (VerifyEntry, which a read does before anything uses it).
// Invariants: no crash; a manifest that parses has strictly increasing part starts
// below its total, at most kMaxParts + 1 of them; Plan's manifest parses back to the
// same parts (round trip), covering the value exactly; Cover names the parts a range
// lies in, and no others.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "attic/store/entry.h"
#include "attic/store/redis_tier.h"
#include "fuzz_check.h"

using namespace attic;
using namespace attic::store;
using Manifest = RedisTier::Manifest;

namespace {

void CheckManifest(const Manifest& m) {
  FUZZ_CHECK(!m.starts.empty() && m.starts[0] == 0);
  for (size_t i = 1; i < m.starts.size(); ++i)
    FUZZ_CHECK(m.starts[i] > m.starts[i - 1] && m.starts[i] < m.total, "part %zu starts at %llu", i,
               (unsigned long long)m.starts[i]);
  // Cover over a few ranges: [first, last] are exactly the parts the range touches.
  const uint64_t probes[][2] = {{0, 1}, {0, m.total}, {m.total / 3, m.total / 3 + 1}, {m.total / 2, m.total / 4 + 1}};
  for (const auto& p : probes) {
    const uint64_t off = p[0], len = p[1];
    if (len == 0 || off + len > m.total) continue;
    size_t first = 0, last = 0;
    m.Cover(off, len, &first, &last);
    FUZZ_CHECK(first <= last && last < m.starts.size());
    FUZZ_CHECK(m.starts[first] <= off && off < m.end(first), "first part does not hold the range's start");
    FUZZ_CHECK(m.starts[last] < off + len && off + len <= m.end(last), "last part does not hold the range's end");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto m = RedisTier::ParseManifest(rest);
    if (m.ok()) CheckManifest(*m);
    else FUZZ_CHECK(m.status().code() == StatusCode::kDataLoss);
  } else {
    int64_t expires = 0;
    EntryKey key;
    const Manifest plan = RedisTier::Plan(rest, &expires, &key);
    FUZZ_CHECK(plan.total == rest.size());
    auto back = RedisTier::ParseManifest(plan.text);
    if (rest.empty()) {
      FUZZ_CHECK(plan.starts.size() == 1);
    } else {
      FUZZ_CHECK(back.ok(), "Plan's own manifest does not parse: %s", plan.text.c_str());
      FUZZ_CHECK(back->total == plan.total && back->starts == plan.starts, "manifest round trip differs");
      CheckManifest(*back);
    }
  }
  auto h = VerifyEntry(rest);
  if (h.ok()) FUZZ_CHECK(h->total_bytes == rest.size());
  return 0;
}
