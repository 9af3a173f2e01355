// Text formatting the benchmark programs share: printf into a std::string, and the
// Markdown tables they print ("| a | b |" rows under a "|---|---|" rule), so that a table
// pasted into docs/ renders. Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace attic::bench {

// printf-style formatting into a string (any length).
std::string Fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));

// "| a | b |\n": one row of a Markdown table.
std::string TableRow(const std::vector<std::string>& cells);
// The header row and its rule: "| a | b |\n|---|---|\n".
std::string TableHeader(const std::vector<std::string>& columns);

}  // namespace attic::bench
