#include "attic/core/hash.h"

#include <xxhash.h>

#include <cstdio>

namespace attic {

uint64_t Hash64(const void* data, size_t size, uint64_t seed) { return XXH3_64bits_withSeed(data, size, seed); }

struct Hasher::State {
  XXH3_state_t* st = nullptr;
};

Hasher::Hasher() : state_(new State) {
  state_->st = XXH3_createState();
  XXH3_128bits_reset(state_->st);
}

Hasher::~Hasher() { XXH3_freeState(state_->st); }

void Hasher::Update(const void* data, size_t size) { XXH3_128bits_update(state_->st, data, size); }

std::string Hasher::Hex() const {
  XXH128_hash_t h = XXH3_128bits_digest(state_->st);
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

}  // namespace attic
