// Byte sizes as people write them on a command line: "512M", "16G", "4GiB", "1.5G",
// "1048576". K, M, G and T (alone, or followed by "iB" or "B", any case) are powers of
// 1024, as in free(1), docker and Kubernetes' Ki/Mi/Gi; a bare number counts
// `bare_unit` bytes (1 for the new flags; 2^20 for an old `...-mib` spelling).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "attic/core/status.h"

namespace attic {

// InvalidArgument for anything else (negative, empty, unknown unit, overflow, a
// fraction of a byte).
StatusOr<uint64_t> ParseByteSize(std::string_view text, uint64_t bare_unit = 1);
// The shortest exact spelling ParseByteSize reads back: "16G", "512M", "1536K", "1000".
std::string FormatByteSize(uint64_t bytes);

}  // namespace attic
