#!/usr/bin/env bash
# Runs every ```sh block of the given Markdown files from the project folder, as a user
# copying them from a fresh clone would, and fails if a block fails (any command's
# non-zero status, or an OpenAI error object in what it printed).
#
# The blocks run as written except for these substitutions, which keep `make test` short
# and safe beside other servers (each is printed when it applies):
#   - ports 8080 and 8090 become free ports;
#   - `make test` is skipped (this runs inside it); `make run` runs until its server
#     answers /health, then is stopped, with its SSD tier in a temporary folder instead
#     of out/kv-ssd (which a developer's own `make run` may be using);
#   - long benchmarks get short flags: `attic bench` -p 32 -n 8 --gen-after 32 -r 1,
#     `bench serve` --concurrency 1 2 -r 1 -n 8.
# Blocks run with stdin from /dev/null (so `attic chat` ends at once), under `bash -e -o
# pipefail`, each within 600 s; whatever a block leaves running (a server) is stopped.
#
# Usage: tests/docs/run_doc_commands.sh FILE.md...   (environment: ATTIC_SHARED_DIR)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/attic-doc-commands-XXXXXX")
[ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT

free_port() {
  node -e 'const s = require("net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });'
}

# The ```sh blocks of $1, each into $tmp/<n>.sh; prints their count.
extract() {
  awk -v dir="$tmp" -v base="$(basename "$1" .md)" '
    /^```sh[[:space:]]*$/ { n++; f = sprintf("%s/%s-%02d.sh", dir, base, n); inblock = 1; next }
    /^```/ && inblock { inblock = 0; close(f); next }
    inblock { print > f }
    END { print n + 0 }' "$1"
}

failed=0
total=0
for md in "$@"; do
  count=$(extract "$md")
  for ((i = 1; i <= count; i++)); do
    block="$tmp/$(basename "$md" .md)-$(printf %02d "$i").sh"
    p8080=$(free_port)
    p8090=$(free_port)
    p_run=$(free_port)
    sed -i -E \
      -e "s/\b8080\b/$p8080/g" -e "s/\b8090\b/$p8090/g" \
      -e 's/^make test\b.*/echo "skipped: make test (this check runs inside it)"/' \
      -e "s|^make run\b.*|run_until_healthy $p_run make run PORT=$p_run KV_SSD_DIR=$tmp/kv-ssd-$i|" \
      -e '/attic bench (serve|sessions)/! s/^(build\/attic bench .*[^\\])$/\1 -p 32 -n 8 --gen-after 32 -r 1/' \
      -e 's/--concurrency 1 2 4 8 16 -r 2 -n 128/--concurrency 1 2 -r 1 -n 8/' \
      "$block"
    total=$((total + 1))
    echo "== $md, block $i"
    sed 's/^/   | /' "$block"
    # The script a block runs in: its own process group, so that every server it starts
    # can be stopped, whatever it leaves behind.
    cat > "$tmp/run.sh" <<'HELPERS'
set -e -o pipefail
run_until_healthy() {  # PORT COMMAND...: runs COMMAND until http://127.0.0.1:PORT/health answers, then stops it
  local port=$1; shift
  "$@" > "$BLOCK_LOG.run" 2>&1 &
  local pid=$! t=0
  until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
    sleep 0.5; t=$((t + 1))
    if ! kill -0 $pid 2>/dev/null || [ $t -gt 600 ]; then cat "$BLOCK_LOG.run"; return 1; fi
  done
  echo "(server of '$*' answered /health; stopping it)"
  pkill -INT -P $pid 2>/dev/null || true; kill -INT $pid 2>/dev/null || true; wait $pid || true
}
HELPERS
    cat "$block" >> "$tmp/run.sh"
    log="$tmp/log"
    # In a session of its own (its id is the block's pid), so that whatever the block
    # leaves running -- a server whose `kill %1` a failing command skipped -- is stopped.
    BLOCK_LOG="$log" setsid bash "$tmp/run.sh" < /dev/null > "$log" 2>&1 &
    block=$!
    deadline=$((SECONDS + 600))
    while kill -0 "$block" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    pkill -KILL -s "$block" 2>/dev/null  # past the deadline, or what it left behind
    wait "$block"
    status=$?
    if [ $status -ne 0 ]; then
      echo "FAILED (exit $status):"; tail -n 40 "$log" | sed 's/^/   > /'
      failed=$((failed + 1))
    elif grep -qE '"error" *: *\{' "$log"; then
      echo "FAILED (an error object in the output):"; grep -E '"error" *: *\{' "$log" | head -5 | sed 's/^/   > /'
      failed=$((failed + 1))
    else
      echo "ok"
    fi
  done
done
echo "$((total - failed)) of $total blocks ran"
[ $failed -eq 0 ]
