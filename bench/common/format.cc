#include "bench/common/format.h"

#include <cstdarg>
#include <cstdio>

namespace attic::bench {

std::string Fmt(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  va_list again;
  va_copy(again, ap);
  const int n = std::vsnprintf(nullptr, 0, format, ap);
  va_end(ap);
  std::string out;
  if (n > 0) {
    out.resize(static_cast<size_t>(n) + 1);
    std::vsnprintf(out.data(), out.size(), format, again);
    out.resize(static_cast<size_t>(n));
  }
  va_end(again);
  return out;
}

std::string TableRow(const std::vector<std::string>& cells) {
  std::string row = "|";
  for (const std::string& c : cells) row += " " + c + " |";
  return row + "\n";
}

std::string TableHeader(const std::vector<std::string>& columns) {
  std::string rule = "|";
  for (size_t i = 0; i < columns.size(); ++i) rule += "---|";
  return TableRow(columns) + rule + "\n";
}

}  // namespace attic::bench
