// The --plot figure of `attic bench sessions`: an SVG with two panels, CA vs RE (one
// color each): the CDF of TTFT over all turns (log x axis) and the median (nearest-rank
// p50) TTFT by turn index of the session. Plain SVG text, no dependencies. Pure
// function; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "bench/sessions/replay.h"

namespace attic::bench::sessions {

// The figure of `runs` (one or two, labelled by their mode) under `title` (escaped).
std::string PlotSvg(const std::vector<const RunResult*>& runs, const std::string& title);

}  // namespace attic::bench::sessions
