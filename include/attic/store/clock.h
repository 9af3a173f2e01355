// Clock for TTLs: wall-clock milliseconds (expiry times are persisted with entries, so
// they must survive a restart), and a settable VirtualClock for tests and the policy
// simulator.
//
// Thread-safety: SystemClock is stateless; VirtualClock is atomic.
#pragma once

#include <atomic>
#include <cstdint>

namespace attic::store {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMs() const = 0;  // unix epoch milliseconds
};

class SystemClock final : public Clock {
 public:
  int64_t NowMs() const override;
  static SystemClock* Default();
};

class VirtualClock final : public Clock {
 public:
  explicit VirtualClock(int64_t now_ms = 1'000'000) : now_(now_ms) {}
  int64_t NowMs() const override { return now_.load(); }
  void Advance(int64_t ms) { now_ += ms; }
  void Set(int64_t ms) { now_ = ms; }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace attic::store
