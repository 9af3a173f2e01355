#!/usr/bin/env bash
# Configures (and with targets, builds) one of the sanitizer builds with clang:
#   scripts/sanitize-build.sh asan|tsan BUILD_DIR [TARGET...]
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer (every check fatal) with
#         libFuzzer's coverage: the unit tests run under ASan+UBSan and fuzz/'s harnesses
#         are real fuzzers (ATTIC_FUZZ=ON).
#   tsan: ThreadSanitizer, for the store's, scheduler's and remote tier's tests.
# ccache is used when installed. -O1 -g: the sanitizers' usual trade between speed and
# readable reports.
set -euo pipefail
kind=${1:?asan or tsan}
dir=${2:?build directory}
shift 2
cc=clang-14
cxx=clang++-14
case "$kind" in
  asan) flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fsanitize=fuzzer-no-link"
        # The unrolled SIMD kernel files are built without ASan and UBSan (CMakeLists.txt,
        # ATTIC_KERNEL_FLAGS): clang 14 takes minutes per file with either. `make
        # test-asan` runs with ATTIC_ISA=generic, so the scalar kernels (instrumented)
        # compute there.
        extra=(-DATTIC_FUZZ=ON "-DATTIC_KERNEL_FLAGS=-fno-sanitize=address,undefined") ;;
  tsan) flags="-fsanitize=thread"
        extra=() ;;
  *) echo "usage: $0 asan|tsan BUILD_DIR [TARGET...]" >&2; exit 2 ;;
esac
# -Wno-unknown-warning-option: the sources silence GCC-only warnings by name.
flags="$flags -fno-omit-frame-pointer -g -O1 -Wno-unknown-warning-option"
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
here=$(cd "$(dirname "$0")/.." && pwd)
cmake -S "$here" -B "$dir" -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_C_COMPILER=$cc -DCMAKE_CXX_COMPILER=$cxx \
  -DCMAKE_C_FLAGS_SANITIZE="$flags" -DCMAKE_CXX_FLAGS_SANITIZE="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS_SANITIZE="$flags" -DATTIC_SANITIZER="$kind" -DATTIC_WITH_DNNL=OFF "${extra[@]}" "${launcher[@]}" > /dev/null
if [ $# -gt 0 ]; then
  cmake --build "$dir" -j"${JOBS:-$(nproc)}" --target "$@"
fi
