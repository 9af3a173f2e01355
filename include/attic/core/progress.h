// A terminal progress bar for long work (model loading, benchmarks). Writes to stderr,
// redraws at most every 100 ms, and stays silent when stderr is not a terminal unless
// forced.
//
// Thread-safety: Update() may be called from one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace attic {

class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total, bool enabled);
  ~ProgressBar();
  void Update(uint64_t done);
  void Finish();

 private:
  std::string label_;
  uint64_t total_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// True when stderr is an interactive terminal.
bool StderrIsTerminal();

}  // namespace attic
