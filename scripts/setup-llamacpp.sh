#!/usr/bin/env bash
# Builds llama.cpp's harness in out/anchor (once): the reference the GGUF tests compare
# Attic against (tests/engine/llamacpp_quant_test.cc, src/model/quant_formats_test.cc) and
# the other engine of bench/compare_llamacpp.sh. llama.cpp is the prebuilt library of the
# npm package node-llama-cpp; the harness (cbench, quantize, calib) comes from
# ../shared/tools/llamacpp-anchor. Needs node/npm and the npm registry.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-$(cd .. && pwd)/shared}
ANCHOR=out/anchor
[ -x $ANCHOR/out/cbench ] && [ -x $ANCHOR/out/quantize ] && exit 0
echo "setting up llama.cpp's harness in $ANCHOR" >&2
rm -rf $ANCHOR && mkdir -p out && cp -r "$SHARED/tools/llamacpp-anchor" $ANCHOR && chmod -R u+w $ANCHOR
(cd $ANCHOR && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --ignore-scripts --no-audit --no-fund >&2 &&
  ./build_cbench.sh >&2)
