#!/usr/bin/env bash
# Runs the serving integration tests (node's built-in test runner + the official `openai` and
# `@anthropic-ai/sdk` npm clients) against `attic serve`. Installs the pinned packages from package-lock.json
# when node_modules is missing or older than the lock file (a dependency added since). Usage: run.sh [test files...] (default: every *.test.mjs).
# Environment: ATTIC_BINARY (default ../../build/attic), ATTIC_SHARED_DIR, ATTIC_TEST_TMP.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
if [ $# -eq 0 ]; then set -- *.test.mjs; fi
exec node --test --test-concurrency=1 "$@"
