// Helpers for the store tests: small random entries and scratch directories.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

#include "attic/store/entry.h"

namespace attic::store::testing {

inline KvEntry MakeEntry(const std::vector<int32_t>& tokens, const std::string& session = "",
                         const std::string& tenant = "default", int n_layers = 2, int kv_dim = 8,
                         const std::string& fingerprint = "fp-A", uint32_t seed = 1) {
  KvEntry e;
  e.tenant = tenant;
  e.session_id = session;
  e.fingerprint = fingerprint;
  e.n_layers = n_layers;
  e.kv_dim = kv_dim;
  e.tokens = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) e.positions.push_back(static_cast<int32_t>(i));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  e.k.resize(n_layers);
  e.v.resize(n_layers);
  for (int l = 0; l < n_layers; ++l)
    for (size_t i = 0; i < tokens.size() * kv_dim; ++i) {
      e.k[l].push_back(d(rng));
      e.v[l].push_back(d(rng));
    }
  return e;
}

inline std::vector<int32_t> Range(int first, int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// A fresh empty directory under the system temp dir, removed on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) {
    path_ = (std::filesystem::temp_directory_path() /
             ("attic-store-" + name + "-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace attic::store::testing
