// A plain SVG line chart for the benchmark programs' --plot files: one line per series
// over a shared x axis, both axes logarithmic (x in powers of two, labelled in k; y in
// decades). No plotting library: the file is a few hundred lines of SVG a browser shows.
// Thread-safe (pure function).
#pragma once

#include <string>
#include <vector>

namespace attic::bench {

// names[i] labels series y[i]; y[i][j] is its value at x[j] (nan: not measured, skipped).
// x ascending and positive; y values positive. `y_unit` follows each y tick ("s", "ms").
std::string LogLogPlotSvg(const std::vector<std::string>& names, const std::vector<double>& x,
                          const std::vector<std::vector<double>>& y, const std::string& title,
                          const std::string& x_label, const std::string& y_label, const std::string& y_unit);

}  // namespace attic::bench
