// A terminal progress bar for long work (model loading, benchmarks). Writes to stderr,
// redraws at most every 100 ms, and stays silent when stderr is not a terminal unless
// forced.
//
// Thread-safety: Update() may be called from one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
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

// A ProgressBar for work that reports (done, total) through a callback and tells its
// total only then (loading, writing, allocating): the bar is made at the first report
// whose total is at least min_total (smaller work shows nothing), on a terminal only, and
// finished by Finish() or at the end of this object's scope.
class ProgressReporter {
 public:
  explicit ProgressReporter(std::string label, uint64_t min_total = 0)
      : label_(std::move(label)), min_total_(min_total) {}
  // Valid while this object lives.
  std::function<void(uint64_t, uint64_t)> Callback();
  void Finish();

 private:
  std::string label_;
  uint64_t min_total_;
  std::unique_ptr<ProgressBar> bar_;
};

// True when stderr is an interactive terminal.
bool StderrIsTerminal();

}  // namespace attic
