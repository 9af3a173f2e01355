#!/usr/bin/env bash
# Runs the serving integration tests (node's built-in test runner + the official `openai`
# npm client) against `attic serve`. Installs the pinned client from package-lock.json
# when node_modules is missing. Usage: run.sh [test files...] (default: every *.test.mjs).
# Environment: ATTIC_BINARY (default ../../build/attic), ATTIC_SHARED_DIR, ATTIC_TEST_TMP.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -d node_modules/openai ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
if [ $# -eq 0 ]; then set -- *.test.mjs; fi
exec node --test --test-concurrency=1 "$@"
