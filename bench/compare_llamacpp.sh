#!/usr/bin/env bash
# Attic vs llama.cpp on the same GGUF files, interleaved rep by rep in one window (this
# VM's speed drifts, so only same-window ratios mean anything).
#
#   bench/compare_llamacpp.sh [-r REPS] [-t THREADS] MODEL.gguf [MODEL.gguf ...]
#
# llama.cpp is the prebuilt library from the npm package node-llama-cpp, driven by the
# llama-bench-like harness in ../shared/tools/llamacpp-anchor (copied to out/anchor and
# built there on first use by scripts/setup-llamacpp.sh: needs node/npm and the npm
# registry). Models come from
#   build/attic make-model --config ../shared/models/smollm2-135m-instruct-tokenizer/config.json \
#       --tokenizer ../shared/models/smollm2-135m-instruct-tokenizer --dtype bf16 --out-gguf out/models/smollm2-135m-bf16.gguf
#   build/attic make-model --shape llama-1b --tokenizer ../shared/models/smollm2-135m-instruct-tokenizer \
#       --dtype bf16 --out-gguf out/models/llama-1b-bf16.gguf
# Output: a table and out/bench/compare.json (ratios, and each figure against the roofs).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=3
THREADS=2
while getopts "r:t:" o; do
  case $o in r) REPS=$OPTARG ;; t) THREADS=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n 2,15p "$0"; exit 2; }
SHARED=${SHARED:-$(cd .. && pwd)/shared}
ANCHOR=out/anchor
SHARED=$SHARED scripts/setup-llamacpp.sh
export LLAMA_BIN_DIR=$(pwd)/$ANCHOR/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
[ -x build/attic ] || { echo "build attic first (make build)" >&2; exit 1; }
OUT=out/bench/compare
mkdir -p $OUT
rm -f $OUT/*.json
for m in "$@"; do
  name=$(basename "$m" .gguf)
  for r in $(seq 1 "$REPS"); do
    echo "[$(date +%H:%M:%S)] $name rep $r/$REPS: attic" >&2
    build/attic bench -m "$m" -t "$THREADS" -r 1 --json $OUT/$name.attic.$r.json > /dev/null
    echo "[$(date +%H:%M:%S)] $name rep $r/$REPS: llama.cpp" >&2
    $ANCHOR/out/cbench bench -m "$m" -t "$THREADS" -r 1 -o $OUT/$name.llamacpp.$r.json 2> /dev/null
  done
done
python3 bench/compare_report.py $OUT "$@"
