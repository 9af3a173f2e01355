#include "attic/core/byte_size.h"

#include <cctype>
#include <cmath>
#include <string>

namespace attic {

namespace {

constexpr char kUnits[] = "KMGT";

Status Bad(std::string_view text, const std::string& why) {
  return InvalidArgumentError("invalid size '" + std::string(text) + "': " + why +
                              " (write e.g. 512M, 16G, 4GiB or a number of bytes)");
}

}  // namespace

StatusOr<uint64_t> ParseByteSize(std::string_view text, uint64_t bare_unit) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number(text.substr(0, i));
  if (number.empty() || number == "." || number.find('.') != number.rfind('.')) return Bad(text, "no number");
  std::string unit(text.substr(i));
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  uint64_t scale = bare_unit;
  if (!unit.empty()) {
    if (unit == "B") {
      scale = 1;
    } else {
      const char* at = std::char_traits<char>::find(kUnits, 4, unit[0]);
      const std::string rest = unit.substr(1);
      if (at == nullptr || !(rest.empty() || rest == "B" || rest == "IB")) return Bad(text, "unknown unit");
      scale = uint64_t{1} << (10 * (at - kUnits + 1));
    }
  }
  const long double value = std::stold(number) * static_cast<long double>(scale);
  if (value >= 18446744073709551615.0L) return Bad(text, "too large");
  if (value != std::floor(value)) return Bad(text, "not a whole number of bytes");
  return static_cast<uint64_t>(value);
}

std::string FormatByteSize(uint64_t bytes) {
  int u = 0;
  while (u < 4 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return std::to_string(bytes) + (u == 0 ? "" : std::string(1, kUnits[u - 1]));
}

}  // namespace attic
