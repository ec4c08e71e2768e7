#!/usr/bin/env bash
# Downloads (here, with apt) the Debian packages that scripts/gpu-check.sh unpacks on a
# GPU machine that has CUDA, CMake and a compiler but not our libraries and no network:
# copy the tree with .gpu-deps/ to that machine, then run scripts/gpu-check.sh there.
#   scripts/gpu-deps.sh [DIR]   (default .gpu-deps)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.gpu-deps}"
mkdir -p "$DIR"
cd "$DIR"
# Headers and libraries the build needs (cpp-httplib's header includes brotli and zlib),
# the runtime libraries they link to, and the test frameworks.
apt-get download nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libcpp-httplib0.11 \
  libbrotli-dev libbrotli1 zlib1g-dev libutf8proc-dev libutf8proc2 \
  libgtest-dev libgmock-dev googletest libbenchmark-dev libbenchmark1debian
ls -la
