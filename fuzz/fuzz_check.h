// What every fuzz harness shares: FUZZ_CHECK (an invariant that failed is a crash, which
// libFuzzer reports and the replay test fails on), and the shared data directory.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(cond, ...)                                                 \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: invariant failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, " " __VA_ARGS__);                                  \
      std::fprintf(stderr, "\n");                                             \
      std::abort();                                                           \
    }                                                                         \
  } while (0)

namespace attic::fuzz {
// ../shared (ATTIC_SHARED_DIR overrides): the models whose tokenizers some harnesses use.
inline std::string SharedDir() {
  const char* env = std::getenv("ATTIC_SHARED_DIR");
  return env != nullptr && *env != '\0' ? env : ATTIC_FUZZ_SHARED_DIR;
}
}  // namespace attic::fuzz
