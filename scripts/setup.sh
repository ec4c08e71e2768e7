#!/usr/bin/env bash
# Fresh Debian machine -> built qinfer. Installs the Debian packages we use, then configures and builds.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
PKGS="build-essential cmake pkg-config git nlohmann-json3-dev libcli11-dev libcpp-httplib-dev \
libutf8proc-dev libssl-dev libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
# Windows cross build and its smoke test under wine (scripts/windows-check.sh);
# without recommends, which would pull in a desktop's worth of packages.
WIN_PKGS="mingw-w64 g++-mingw-w64-x86-64-posix wine64 wine"
missing=""
for p in $WIN_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing \
    || echo "setup: could not install$missing; the Windows check will fail or be skipped"
fi
# Node.js (for the OpenAI-client end-to-end tests) may come from Debian or elsewhere.
if ! command -v node >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm || echo "setup: Node.js not installed; server end-to-end tests will be skipped"
fi
# The openai npm client for tests/server_e2e, pinned by its package-lock.json
# (installed here so that tests never download anything).
if command -v npm >/dev/null 2>&1 && [ -f tests/server_e2e/package-lock.json ]; then
  (cd tests/server_e2e && npm ci --no-audit --no-fund --loglevel=error) || echo "setup: npm ci failed; server end-to-end tests will be skipped"
fi
BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${QINFER_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j"$(nproc)"
