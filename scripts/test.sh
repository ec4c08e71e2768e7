#!/usr/bin/env bash
# Runs the whole test suite (builds first if needed). CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="$(nproc)"
# 1. Release build (CUDA code is compiled when nvcc is present), all tests.
bash scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$JOBS" --timeout 600
# 1b. Windows: MinGW cross build, then the same outputs under wine (skipped without wine).
bash scripts/windows-check.sh
# 2. Input-facing code (GGUF reader, tokenizer, quant) again under AddressSanitizer + UBSan.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQINFER_SANITIZE=ON -DQINFER_CUDA=OFF -DQINFER_BENCH=OFF >/dev/null
ASAN_TARGETS=$(cd tests && ls *_test.cpp | grep -E '^(gguf|tokenizer|quant)' | sed 's/\.cpp$//' | tr '\n' ' ')
cmake --build build-asan -j"$JOBS" --target $ASAN_TARGETS
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$JOBS" --timeout 600 -R "$(echo $ASAN_TARGETS | sed 's/ /|/g' | sed 's/_test//g')"
# 3. Bounded fuzzing of the GGUF reader (libFuzzer, clang).
if [ -f scripts/fuzz.sh ]; then bash scripts/fuzz.sh; fi
