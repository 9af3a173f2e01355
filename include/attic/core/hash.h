// Hashing (xxHash3) for model fingerprints, KV entry keys and checksums.
//
// Thread-safety: Hasher is not thread-safe; the free functions are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace attic {

uint64_t Hash64(const void* data, size_t size, uint64_t seed = 0);
inline uint64_t Hash64(std::string_view s, uint64_t seed = 0) { return Hash64(s.data(), s.size(), seed); }

// Streaming 128-bit hash; Hex() gives 32 lowercase hex digits.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void Update(const void* data, size_t size);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  template <typename T>
  void UpdatePod(const T& v) { Update(&v, sizeof(v)); }
  std::string Hex() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace attic
