// A KV entry file as the SSD tier keeps it (src/store/entry.cc's format, read through
// src/store/ssd_tier.cc): the input's bytes are the file.
//
// Byte 0 is the mode: bit 0 set repairs the header checksum, bit 1 also the layers'
// checksums (with a layout walk written here from docs/store.md's format, not from
// entry.cc), so that mutations reach the code behind the checksums; bit 2 stores the
// bytes as an entry file of a real SsdTier and reads them back, whole and by a range
// the next 8 bytes choose.
// Invariants: no crash; VerifyEntry, the layer-wise read path (EntryHeaderBytes +
// VerifyLayerBytes) and DeserializeEntry agree; an entry that verifies survives
// Serialize -> Deserialize unchanged; the tier returns exactly the bytes stored, and a
// range outside them is an error, never bytes.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attic/core/file_env.h"
#include "attic/core/hash.h"
#include "attic/store/entry.h"
#include "attic/store/tier.h"
#include "fuzz_check.h"

using namespace attic;
using namespace attic::store;

namespace {

constexpr uint64_t kEntryAlign = 4096;  // layer data starts page-aligned (O_DIRECT reads)

uint32_t U32(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}

// Rewrites the header checksum (and with `layers` the layer checksums) of `b` if its
// header can be walked; the walk follows the documented layout.
void Repair(std::string& b, bool layers) {
  if (b.size() < 36) return;
  const uint32_t version = U32(b, 8), dtype = U32(b, 12), n_layers = U32(b, 16), kv_dim = U32(b, 20),
                 n_tokens = U32(b, 24);
  if (n_layers == 0 || n_layers > 1024 || n_tokens == 0 || n_tokens > (1u << 22) || kv_dim > (1u << 16)) return;
  // q8_0 (dtype 2), q4_0 (dtype 3), q8_0/q4_0 (dtype 4) and kivi4 (dtype 5): the group
  // (u32) follows n_tokens; kivi4's K groups (a count, then the end tokens) follow it.
  const bool quantized = dtype == 2 || dtype == 3 || dtype == 4 || dtype == 5;
  const uint32_t group = quantized && b.size() >= 40 ? U32(b, 28) : 0;
  if (quantized && (group == 0 || kv_dim % group != 0)) return;
  size_t pos = quantized ? 40 : 36;
  uint64_t k_groups = 0;
  if (dtype == 5) {
    if (b.size() < 36) return;
    k_groups = U32(b, 32);
    if (k_groups > n_tokens || 36 + 4 * k_groups + 8 > b.size()) return;
    pos = 36 + 4 * k_groups + 8;
  }
  auto skip_str = [&]() {
    if (pos + 4 > b.size()) return false;
    const uint32_t n = U32(b, pos);
    if (n > b.size() - pos - 4) return false;
    pos += 4 + n;
    return true;
  };
  for (int i = 0; i < 3; ++i)
    if (!skip_str()) return;
  if (version == 2) {
    if (pos + 4 > b.size()) return;
    const uint32_t n_att = U32(b, pos);
    pos += 4;
    if (n_att > 64) return;
    for (uint32_t i = 0; i < n_att; ++i) {
      if (!skip_str() || pos + 16 > b.size()) return;
      pos += 16;
    }
  }
  const uint64_t sums = pos + 8ull * n_tokens;
  const uint64_t body = sums + 8ull * n_layers;
  if (body + 8 > b.size()) return;
  if (layers) {
    const uint64_t data = (body + 8 + kEntryAlign - 1) / kEntryAlign * kEntryAlign;
    // q8_0: kv_dim int8 values, q4_0: kv_dim / 2 bytes of codes, then kv_dim / group f16
    // scales; q8_0/q4_0: K's rows q8_0, V's q4_0.
    const uint64_t scales = quantized ? 2ull * (kv_dim / group) : 0;
    // kivi4: K's rows kv_dim / 2 bytes of codes, then per K group kv_dim f16 scales and
    // kv_dim f16 minimums; V's rows q4_0.
    const uint64_t k_row = dtype == 2 || dtype == 4 ? kv_dim + scales
                           : dtype == 3             ? kv_dim / 2 + scales
                           : dtype == 5             ? kv_dim / 2
                                                    : uint64_t{kv_dim} * (dtype == 1 ? 2 : 4);
    const uint64_t v_row = dtype == 3 || dtype == 4 || dtype == 5 ? kv_dim / 2 + scales : k_row;
    const uint64_t nk = uint64_t{n_tokens} * k_row + k_groups * 4 * kv_dim, nv = uint64_t{n_tokens} * v_row;
    for (uint32_t l = 0; l < n_layers; ++l) {
      const uint64_t at = data + l * (nk + nv);
      if (at + nk + nv > b.size()) break;
      const uint64_t h = Hash64(b.data() + at + nk, nv, Hash64(b.data() + at, nk));
      std::memcpy(b.data() + sums + 8ull * l, &h, 8);
    }
  }
  const uint64_t hc = Hash64(b.data(), body, 0x68);
  std::memcpy(b.data() + body, &hc, 8);
}

void CheckSame(const KvEntry& a, const KvEntry& b) {
  FUZZ_CHECK(a.tenant == b.tenant && a.session_id == b.session_id && a.fingerprint == b.fingerprint);
  FUZZ_CHECK(a.dtype == b.dtype && a.group == b.group && a.n_layers == b.n_layers && a.kv_dim == b.kv_dim);
  FUZZ_CHECK(a.expires_at_ms == b.expires_at_ms && a.tokens == b.tokens && a.positions == b.positions);
  for (int l = 0; l < a.n_layers; ++l)
    for (int r = 0; r < a.n_tokens(); ++r)
      FUZZ_CHECK(std::memcmp(a.k_row_bytes(l, r), b.k_row_bytes(l, r), a.k_row_size()) == 0 &&
                     std::memcmp(a.v_row_bytes(l, r), b.v_row_bytes(l, r), a.v_row_size()) == 0,
                 "layer %d row %d differs after a round trip", l, r);
  if (KvDtypeGroupedK(a.dtype)) {  // kivi4's K rows are codes of their groups' scales: the values too
    FUZZ_CHECK(a.KGroupEnds() == b.KGroupEnds(), "kivi4 K groups differ after a round trip");
    std::vector<float> x(a.kv_dim), y(a.kv_dim);
    for (int l = 0; l < a.n_layers; ++l)
      for (int r = 0; r < a.n_tokens(); ++r) {
        a.KRowF32(l, r, x.data());
        b.KRowF32(l, r, y.data());
        FUZZ_CHECK(std::memcmp(x.data(), y.data(), sizeof(float) * a.kv_dim) == 0, "layer %d K row %d's values", l, r);
      }
  }
  FUZZ_CHECK(a.attachments.size() == b.attachments.size());
}

// The real file layer without fsync: the harness fuzzes reading and range arithmetic,
// not durability (ssd_faults_test.cc does that), and an fsync per input made it run at
// ~11 inputs/s.
class NoSyncEnv final : public FileEnv {
 public:
  int Open(const std::string& path, int flags, mode_t mode) override { return base_->Open(path, flags, mode); }
  ssize_t Pwrite(int fd, const void* buf, size_t n, off_t offset) override { return base_->Pwrite(fd, buf, n, offset); }
  ssize_t Pread(int fd, void* buf, size_t n, off_t offset) override { return base_->Pread(fd, buf, n, offset); }
  int Fsync(int) override { return 0; }
  int Close(int fd) override { return base_->Close(fd); }
  int Rename(const std::string& from, const std::string& to) override { return base_->Rename(from, to); }
  int Unlink(const std::string& path) override { return base_->Unlink(path); }

 private:
  FileEnv* base_ = FileEnv::Default();
};

std::unique_ptr<SsdTier>& FuzzTier() {
  static std::unique_ptr<SsdTier> tier = [] {
    char tmpl[] = "/tmp/attic-ssd-fuzz-XXXXXX";
    FUZZ_CHECK(mkdtemp(tmpl) != nullptr);
    static const std::string dir = tmpl;
    std::atexit([] { std::filesystem::remove_all(dir); });
    static NoSyncEnv env;
    auto t = SsdTier::Open(tmpl, "fuzz-fingerprint", 64ull << 20, &env);
    FUZZ_CHECK(t.ok(), "%s", t.status().ToString().c_str());
    return std::move(*t);
  }();
  return tier;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (mode & 1) Repair(bytes, (mode & 2) != 0);
  const std::string_view v(bytes);

  auto verified = VerifyEntry(v);
  auto full = DeserializeEntry(v);
  FUZZ_CHECK(verified.ok() == full.ok(), "VerifyEntry %s, DeserializeEntry %s", verified.status().ToString().c_str(),
             full.status().ToString().c_str());
  // The layer-wise path the tiers' range reads take.
  auto header_bytes = EntryHeaderBytes(v);
  if (verified.ok()) {
    const EntryHeader& h = *verified;
    FUZZ_CHECK(header_bytes.ok() && *header_bytes == h.data_offset, "EntryHeaderBytes disagrees with the header");
    for (int l = 0; l < h.meta.n_layers; ++l)
      FUZZ_CHECK(VerifyLayerBytes(v.substr(EntryLayerOffset(h, l), h.layer_bytes), h, l).ok(), "layer %d", l);
    for (const auto& a : h.attachments) (void)EntryAttachmentBytes(v, h, a.kind);
    // Round trip.
    auto again = SerializeEntry(*full);
    FUZZ_CHECK(again.ok(), "a verified entry does not serialize: %s", again.status().ToString().c_str());
    auto back = DeserializeEntry(*again);
    FUZZ_CHECK(back.ok(), "%s", back.status().ToString().c_str());
    CheckSame(*full, *back);
  } else if (auto h = ParseEntryHeader(v); h.ok() && h->total_bytes == v.size()) {
    // A header that parses and a size that fits: only a layer checksum can be wrong.
    FUZZ_CHECK(verified.status().code() == StatusCode::kDataLoss, "%s", verified.status().ToString().c_str());
  }

  if (mode & 4) {
    EntryKey key;
    key.tenant = "fuzz";
    key.fingerprint = "fuzz-fingerprint";
    key.token_hash = bytes.size();
    const std::string k = key.ToString();
    SsdTier& tier = *FuzzTier();
    if (!tier.Put(k, v).ok()) return 0;
    auto got = tier.GetShared(k);
    FUZZ_CHECK(got.ok() && (*got)->view() == v, "the tier did not return the bytes stored");
    uint64_t offset = 0, length = 0;
    if (bytes.size() >= 16) {
      std::memcpy(&offset, bytes.data(), 8);
      std::memcpy(&length, bytes.data() + 8, 8);
      offset %= bytes.size() + 2;
      length %= bytes.size() + 2;
    }
    auto range = tier.GetRange(k, offset, length);
    if (offset + length <= bytes.size()) {
      FUZZ_CHECK(range.ok(), "range %llu+%llu: %s", (unsigned long long)offset, (unsigned long long)length,
                 range.status().ToString().c_str());
      FUZZ_CHECK(range->view() == v.substr(offset, length), "range bytes differ");
    } else {
      FUZZ_CHECK(!range.ok(), "a range past the end returned bytes");
    }
    FUZZ_CHECK(tier.Erase(k).ok());
  }
  return 0;
}
