// What the benchmark programs share about their outputs and inputs: a --json file is
// checked before the work starts (its folders made) and written whole at the end, or the
// program exits 1 with "<program>: error: ..."; the shared folder (models, datasets) is
// found from the executable's place ($ATTIC_SHARED_DIR overrides), not from the current
// directory. Functions that exit the process are meant for a program's main thread.
#pragma once

#include <string>

#include "attic/core/status.h"

namespace attic::bench {

// Prints "<program>: error: <message>" to stderr and exits 1 when `st` is not OK.
void DieOnError(const char* program, const Status& st);

// Call right after parsing the flags: makes the folders of `path` and fails early (exit
// 1) when it cannot be written. An empty path (no --json) does nothing.
void CheckOutput(const char* program, const std::string& path);

// Writes `text` to `path` atomically (whole or not at all), or exits 1. An empty path
// does nothing.
void WriteOutput(const char* program, const std::string& path, const std::string& text);

// <shared> beside the project the program was built in (<project>/build/<program>), or
// $ATTIC_SHARED_DIR when set.
std::string SharedDir();

}  // namespace attic::bench
