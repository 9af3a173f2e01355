#include "attic/pq/pq_index.h"

#include <algorithm>
#include <cstring>

#include "attic/core/hash.h"

namespace attic::pq {

namespace {

constexpr char kMagic[4] = {'A', 'P', 'Q', 'X'};
constexpr uint64_t kSeed = 0x7071;
// Bounds that keep a corrupt blob from asking for absurd allocations.
constexpr uint32_t kMaxLayers = 1024;
constexpr uint32_t kMaxKvHeads = 1024;
constexpr uint32_t kMaxHeadDim = 1 << 16;
constexpr uint32_t kMaxCoded = 1 << 24;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Pod(T* v) { return Raw(v, sizeof(T)); }
  bool Raw(void* p, size_t n) {
    if (in_.size() - pos_ < n) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t left() const { return in_.size() - pos_; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace

void PqIndex::Truncate(int n) {
  for (Layer& l : layers) {
    if (!l.built || l.n_coded <= n) continue;
    l.n_coded = std::max(0, n);
    for (auto& c : l.codes) c.resize(static_cast<size_t>(l.n_coded) * m);
  }
}

bool PqIndex::any_built() const {
  return std::any_of(layers.begin(), layers.end(), [](const Layer& l) { return l.built; });
}

std::string SerializePqIndex(const PqIndex& index) {
  std::string out;
  out.append(kMagic, sizeof(kMagic));
  Put<uint8_t>(&out, kPqIndexVersion);
  Put<uint8_t>(&out, static_cast<uint8_t>(index.bits));
  Put<uint16_t>(&out, static_cast<uint16_t>(index.m));
  Put<uint32_t>(&out, static_cast<uint32_t>(index.head_dim));
  Put<uint32_t>(&out, static_cast<uint32_t>(index.layers.size()));
  Put<uint32_t>(&out, static_cast<uint32_t>(index.n_kv_heads));
  for (const PqIndex::Layer& l : index.layers) {
    Put<uint8_t>(&out, l.built ? 1 : 0);
    if (!l.built) continue;
    ATTIC_CHECK(static_cast<int>(l.books.size()) == index.n_kv_heads &&
                static_cast<int>(l.codes.size()) == index.n_kv_heads);
    Put<uint32_t>(&out, static_cast<uint32_t>(l.n_coded));
    for (int h = 0; h < index.n_kv_heads; ++h) {
      const PqCodebook& b = l.books[h];
      ATTIC_CHECK(b.m() == index.m && b.bits() == index.bits && b.head_dim() == index.head_dim);
      ATTIC_CHECK(l.codes[h].size() == static_cast<size_t>(l.n_coded) * index.m);
      out.append(reinterpret_cast<const char*>(b.centroids().data()), b.centroids().size() * sizeof(float));
      out.append(reinterpret_cast<const char*>(l.codes[h].data()), l.codes[h].size());
    }
  }
  Put<uint64_t>(&out, Hash64(out.data(), out.size(), kSeed));
  return out;
}

StatusOr<PqIndex> DeserializePqIndex(std::string_view bytes) {
  auto bad = [](const std::string& why) { return DataLossError("pq index: " + why); };
  if (bytes.size() < sizeof(kMagic) + sizeof(uint64_t)) return bad("truncated");
  const size_t body = bytes.size() - sizeof(uint64_t);
  uint64_t sum;
  std::memcpy(&sum, bytes.data() + body, sizeof(sum));
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return bad("bad magic");
  if (Hash64(bytes.data(), body, kSeed) != sum) return bad("checksum mismatch");
  Reader r(bytes.substr(0, body));
  char magic[4];
  uint8_t version, bits;
  uint16_t m;
  uint32_t head_dim, n_layers, n_kv;
  if (!r.Raw(magic, 4) || !r.Pod(&version) || !r.Pod(&bits) || !r.Pod(&m) || !r.Pod(&head_dim) ||
      !r.Pod(&n_layers) || !r.Pod(&n_kv))
    return bad("truncated header");
  if (version != kPqIndexVersion) return bad("unsupported version " + std::to_string(version));
  if (bits < 1 || bits > 8 || m < 1 || head_dim < 1 || head_dim > kMaxHeadDim || head_dim % m != 0 ||
      n_layers < 1 || n_layers > kMaxLayers || n_kv < 1 || n_kv > kMaxKvHeads)
    return bad("header out of bounds");
  PqIndex index;
  index.m = m;
  index.bits = bits;
  index.head_dim = static_cast<int>(head_dim);
  index.n_kv_heads = static_cast<int>(n_kv);
  index.layers.resize(n_layers);
  const size_t n_centroid_floats = static_cast<size_t>(head_dim) << bits;
  for (PqIndex::Layer& l : index.layers) {
    uint8_t built;
    if (!r.Pod(&built) || built > 1) return bad("truncated or bad layer");
    if (built == 0) continue;
    uint32_t n_coded;
    if (!r.Pod(&n_coded) || n_coded > kMaxCoded) return bad("bad code count");
    const size_t n_codes = static_cast<size_t>(n_coded) * m;
    // What the layer says it holds must be there before anything is allocated for it.
    if (r.left() / n_kv < n_centroid_floats * sizeof(float) + n_codes) return bad("truncated layer");
    l.built = true;
    l.n_coded = static_cast<int>(n_coded);
    l.books.reserve(n_kv);
    l.codes.resize(n_kv);
    for (uint32_t h = 0; h < n_kv; ++h) {
      std::vector<float> centroids(n_centroid_floats);
      if (!r.Raw(centroids.data(), n_centroid_floats * sizeof(float))) return bad("truncated centroids");
      auto book = PqCodebook::FromCentroids(m, bits, static_cast<int>(head_dim), std::move(centroids));
      if (!book.ok()) return bad(book.status().message());
      l.books.push_back(std::move(*book));
      l.codes[h].resize(n_codes);
      if (!r.Raw(l.codes[h].data(), n_codes)) return bad("truncated codes");
      const uint8_t n_centroids_max = static_cast<uint8_t>((1u << bits) - 1);
      if (bits < 8 && std::any_of(l.codes[h].begin(), l.codes[h].end(), [&](uint8_t c) { return c > n_centroids_max; }))
        return bad("code out of range");
    }
  }
  if (r.left() != 0) return bad("trailing bytes");
  return index;
}

}  // namespace attic::pq
