#!/usr/bin/env bash
# On a GPU machine: build with CUDA, run the CUDA tests, compare CUDA with CPU
# logits on the reference models, and run the benchmarks. Ends with a short table.
#   scripts/gpu-check.sh
# Environment: QINFER_GPU_STEPS="10 20" runs only the step scripts whose names
# start with those numbers (default: all); QINFER_SKIP_CTEST=1 skips ctest;
# QINFER_BUILD_TARGETS="a b" builds only those targets.
# Optional inputs: .gpu-deps/*.deb (Debian packages to unpack when the machine lacks
# them; scripts/gpu-deps.sh downloads the set the build needs), .gpu-data/ (reference
# models and logits; defaults to ../shared/reference).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/qinfer-gpu-out}"; mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"; : > "$LOG"
SUMMARY="$OUT/summary.txt"; : > "$SUMMARY"
say() { echo "$@" | tee -a "$SUMMARY"; }
step() { echo "== $*" | tee -a "$LOG"; }

# Dependencies: unpack carried Debian packages into a private prefix.
PREFIX=/tmp/qinfer-deps
if ls .gpu-deps/*.deb >/dev/null 2>&1; then
  mkdir -p "$PREFIX"
  for f in .gpu-deps/*.deb; do dpkg-deb -x "$f" "$PREFIX" 2>>"$LOG" || dpkg -x "$f" "$PREFIX"; done
  export CMAKE_PREFIX_PATH="$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$PREFIX/usr/include${CPATH:+:$CPATH}"
  # Debian's cpp-httplib is a compiled library: a .pc file pointing at the
  # private prefix, without the static-only Requires.private (whose -dev
  # packages the machine may lack).
  if [ -f "$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig/cpp-httplib.pc" ]; then
    mkdir -p "$PREFIX/pc"
    sed -e "s|^prefix=.*|prefix=$PREFIX/usr|" -e '/^Requires.private/d' \
      "$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig/cpp-httplib.pc" > "$PREFIX/pc/cpp-httplib.pc"
    export PKG_CONFIG_PATH="$PREFIX/pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  fi
fi
REF="${QINFER_REFERENCE_DIR:-}"
[ -z "$REF" ] && { [ -d .gpu-data ] && REF="$PWD/.gpu-data" || REF="$PWD/../shared/reference"; }
export QINFER_REFERENCE_DIR="$REF"

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$LOG"
nvcc --version | tail -1 | tee -a "$LOG"; g++ --version | head -1 | tee -a "$LOG"; cmake --version | head -1 | tee -a "$LOG"
say "commit ${QINFER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}  $(date -u +%FT%TZ)"
say "gpu $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"

step "build"
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQINFER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="90-real;80-virtual" \
  -DQINFER_REFERENCE_DIR="$REF" >>"$LOG" 2>&1 || cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQINFER_CUDA=ON -DQINFER_REFERENCE_DIR="$REF" >>"$LOG" 2>&1
if [ -n "${QINFER_BUILD_TARGETS:-}" ]; then  # a quick check of a few targets only
  cmake --build build-gpu -j"$(nproc)" --target $QINFER_BUILD_TARGETS >>"$LOG" 2>&1 || { say "build FAILED"; exit 1; }
elif ! cmake --build build-gpu -j"$(nproc)" -- -k 0 >>"$LOG" 2>&1 && ! cmake --build build-gpu -j"$(nproc)" >>"$LOG" 2>&1; then
  # Keep going with what did build (a test that fails to compile should not
  # hide the others); stop only without the binary.
  grep -E "FAILED:|error:" "$LOG" | head -20 | tee -a "$SUMMARY"
  [ -x build-gpu/qinfer ] || { say "build FAILED"; exit 1; }
  say "build PARTIAL (see above)"
fi
say "build ok in $(( $(date +%s) - t0 )) s"

if [ -z "${QINFER_SKIP_CTEST:-}" ]; then
step "tests"
ctest --test-dir build-gpu --output-on-failure -j4 --timeout 300 ${CTEST_ARGS:-} >"$OUT/ctest.log" 2>&1
say "ctest: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)" "$OUT/ctest.log" | head -30 | tee -a "$SUMMARY"
fi

# Further steps (CUDA vs CPU logits, benchmarks) are added by scripts/gpu-steps.d/*.sh,
# run in the order QINFER_GPU_STEPS names them (default: all, by number).
steps=()
if [ -n "${QINFER_GPU_STEPS:-}" ]; then
  for n in $QINFER_GPU_STEPS; do
    for s in scripts/gpu-steps.d/"$n"-*.sh; do [ -f "$s" ] && steps+=("$s"); done
  done
else
  for s in scripts/gpu-steps.d/*.sh; do [ -f "$s" ] && steps+=("$s"); done
fi
for s in "${steps[@]}"; do
  step "$s"; bash "$s" build-gpu "$REF" "$OUT" 2>&1 | tee -a "$LOG" | tail -40 >> "$SUMMARY"
done
echo; echo "==== summary"; cat "$SUMMARY"
