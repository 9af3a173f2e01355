// Helpers for the store tests: small random entries and scratch directories.
#pragma once

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "attic/store/entry.h"
#include "attic/store/kv_store.h"

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

// An entry key of model fp-A named by `name` (the only keys an SSD tier's tests take).
inline std::string KeyNamed(const std::string& name) {
  EntryKey k;
  k.tenant = "default";
  k.fingerprint = "fp-A";
  k.token_hash = std::hash<std::string>()(name);
  k.session_id = name;
  return k.ToString();
}

// kivi4's K (entry.h): the largest distance a per-channel 4-bit group may put between x
// and its value read back, for a channel whose values over the group span [lo, hi]
// (float64, from the quantizer's arithmetic as entry.h states it): the minimum m = f16(lo)
// is within |lo| 2^-11 (+ 2^-25 below f16's normal range) of lo; the scale s =
// f16(f32(f32(hi - m) / 15)) is at most (hi - lo + |m - lo|) / 15 (1 + 2^-10) (+ 2^-25);
// rounding to the nearest code is within s / 2, the f32 quotient moves the code by at most
// 16 * 2^-23 steps, the cap at code 15 costs at most 15 * 2^-10 s, a value below a minimum
// rounded up at most |m - lo|; and the read-back m + s * code is one f32 rounding (2^-24
// relative).
inline double Kivi4KBound(double lo, double hi) {
  const double m_err = std::fabs(lo) * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
  const double s = (hi - lo + m_err) / 15 * (1 + std::ldexp(1.0, -10)) + std::ldexp(1.0, -25);
  return s * (0.5 + 16 * std::ldexp(1.0, -23) + 15 * std::ldexp(1.0, -10)) + m_err +
         std::ldexp(std::max(std::fabs(lo), std::fabs(hi)) + s, -23);
}

inline std::vector<int32_t> Range(int first, int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// The store options of the tests over caller-made tiers: model "fp-A", no TTL,
// 8-token prefix blocks, saves written to the tiers at once (no write buffer).
inline StoreOptions TierTestOptions(PolicyKind policy = PolicyKind::kLru) {
  StoreOptions o;
  o.fingerprint = "fp-A";
  o.policy = policy;
  o.default_ttl_ms = 0;
  o.prefix_block = 8;
  o.write_buffer_bytes = 0;
  return o;
}

// A store of `dtype` entries for model fp-A whose entries live on SSD in `dir` (no DRAM
// tier): what a restart over the directory finds.
inline StoreOptions SsdOnlyOptions(const std::string& dir, KvDtype dtype) {
  StoreOptions o;
  o.fingerprint = "fp-A";
  o.kv_dtype = dtype;
  o.dram_bytes = 0;
  o.ssd_dir = dir;
  o.ssd_bytes = 64 << 20;
  o.default_ttl_ms = 0;
  o.prefix_block = 8;
  return o;
}

// Reads the file at `path`, applies `edit` to its bytes and writes them back (a test's
// damage to a stored entry). False when the file cannot be read.
template <class Edit>
bool EditFile(const std::string& path, Edit edit) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in.good()) return false;
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  edit(bytes);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  return out.good();
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

// A gate threads pass through (Pass) unless it is held, recording each passing thread's
// nice value. Tests hold the store's writer before each queued save with it (install
// Hook() as StoreOptions::before_async_save), or a tier's writes. Declare the gate before
// the store (the hook refers to it) and a ReleaseAtExit after it (destroyed first), so
// that a failed assertion never leaves the writer held while the store's destructor
// joins it.
class Gate {
 public:
  void Pass() {
    const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
    std::unique_lock<std::mutex> lock(mu_);
    nice_seen_.push_back(nice);
    cv_.notify_all();
    cv_.wait(lock, [&] { return !held_; });
  }
  std::function<void()> Hook() {
    return [this] { Pass(); };
  }
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = true;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ = false;
    }
    cv_.notify_all();
  }
  // Blocks until threads have reached the gate `n` times in all.
  void WaitArrivals(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return nice_seen_.size() >= n; });
  }
  std::vector<int> nice_seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return nice_seen_;
  }
  struct ReleaseAtExit {
    Gate* gate;
    ~ReleaseAtExit() { gate->Release(); }
  };

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  std::vector<int> nice_seen_;
};

}  // namespace attic::store::testing
