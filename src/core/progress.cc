#include "attic/core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace attic {

bool StderrIsTerminal() { return ::isatty(2) == 1; }

ProgressBar::ProgressBar(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)), total_(total == 0 ? 1 : total), enabled_(enabled) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(uint64_t done) {
  if (!enabled_ || finished_) return;
  auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  double frac = static_cast<double>(done) / static_cast<double>(total_);
  if (frac > 1) frac = 1;
  const int width = 30;
  int filled = static_cast<int>(frac * width);
  char bar[width + 1];
  for (int i = 0; i < width; ++i) bar[i] = i < filled ? '#' : '.';
  bar[width] = 0;
  double secs = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %.1fs", label_.c_str(), bar, frac * 100.0, secs);
  std::fflush(stderr);
}

void ProgressBar::Finish() {
  if (!enabled_ || finished_) return;
  Update(total_);
  finished_ = true;
  std::fprintf(stderr, "\n");
}

std::function<void(uint64_t, uint64_t)> ProgressReporter::Callback() {
  return [this](uint64_t done, uint64_t total) {
    if (!bar_ && total >= min_total_) bar_ = std::make_unique<ProgressBar>(label_, total, StderrIsTerminal());
    if (bar_) bar_->Update(done);
  };
}

void ProgressReporter::Finish() {
  if (bar_) bar_->Finish();
}

}  // namespace attic
