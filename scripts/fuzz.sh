#!/usr/bin/env bash
# Runs every fuzzer of a libFuzzer build (scripts/sanitize-build.sh asan) for a while:
#   scripts/fuzz.sh BUILD_DIR SECONDS [NAME...]
# Each fuzzer mutates BUILD_DIR/fuzz-corpus/NAME (new inputs are kept there) and reads
# fuzz/corpus/NAME (the seeds and every input that ever crashed it: copy a crash found
# here into fuzz/corpus/NAME/ with the fix). Its log is BUILD_DIR/fuzz-logs/NAME.log;
# a crash is written to BUILD_DIR/fuzz-crash-NAME-*. Prints one line per fuzzer:
# executions, coverage (cov: edges, ft: features) and the result. Exit 1 if any crashed.
set -uo pipefail
dir=${1:?build directory}
secs=${2:?seconds per fuzzer}
shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in "$here"/fuzz/*_fuzz.cc; do names+=("$(basename "$f" _fuzz.cc)"); done
fi
export ATTIC_SHARED_DIR=${ATTIC_SHARED_DIR:-$here/../shared}
mkdir -p "$dir/fuzz-logs"
failed=0
printf '%-18s %12s %8s %8s %s\n' fuzzer executions cov ft result
for n in "${names[@]}"; do
  mkdir -p "$dir/fuzz-corpus/$n"
  log="$dir/fuzz-logs/$n.log"
  "$dir/fuzz/${n}_fuzz" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=60 -print_final_stats=1 \
    -artifact_prefix="$dir/fuzz-crash-$n-" "$dir/fuzz-corpus/$n" "$here/fuzz/corpus/$n" > "$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*')
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*')
  result=ok
  if [ $rc -ne 0 ]; then result="CRASH (exit $rc, see $log)"; failed=1; fi
  printf '%-18s %12s %8s %8s %s\n' "$n" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$result"
done
exit $failed
