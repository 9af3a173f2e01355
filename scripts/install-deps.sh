#!/usr/bin/env bash
# Installs the Debian (bookworm) packages Attic builds and tests with, if any is missing.
set -euo pipefail
pkgs=(build-essential cmake pkg-config git curl
      libopenblas-dev libdnnl-dev ocl-icd-opencl-dev nlohmann-json3-dev libcpp-httplib-dev libcli11-dev
      libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev liburing-dev libxxhash-dev libzstd-dev libfaiss-dev
      libhiredis-dev redis-server redis-tools nginx
      python3 python3-numpy
      clang-14 libclang-rt-14-dev libomp-14-dev)  # the sanitizer builds and the fuzzers (make test, make fuzz)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm (integration tests drive the server with the official `openai` client).
# Some machines have a Node.js build that bundles npm; only install what is missing.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
