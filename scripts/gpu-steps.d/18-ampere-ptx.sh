#!/usr/bin/env bash
# The code Ampere / Ada cards run (RTX 30xx / 40xx: sm_86 / sm_89), on this GPU:
# a second build whose only CUDA target is compute_80 PTX, which the driver
# compiles for the GPU at hand. Its kernels take the pre-Hopper paths: no
# programmatic dependent launch, no thread-block clusters (the argmax's one-block
# form, the delta rule without the fused gated norm), no sm_90-only
# instructions. Runs the CUDA tests there, then a short decode benchmark.
#   bash 18-ampere-ptx.sh BUILD_DIR REF_DIR OUT_DIR
# The decode comparison uses the 4B-shaped model of 05-models.sh when it is
# there (run step 05 first), else the largest q4_k_m reference model.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh" "$@"
B80=build-gpu80
export QINFER_REFERENCE_DIR="$REF"
# JIT results of one test process serve the next ones.
export CUDA_CACHE_PATH="${CUDA_CACHE_PATH:-/tmp/qinfer-cuda-cache}" CUDA_CACHE_MAXSIZE=4294967296
t0=$(date +%s)
cmake -S . -B "$B80" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQINFER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=80-virtual \
  -DQINFER_REFERENCE_DIR="$REF" > "$OUT/ampere-build.log" 2>&1 ||
  cmake -S . -B "$B80" -DCMAKE_BUILD_TYPE=Release -DQINFER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=80-virtual \
    -DQINFER_REFERENCE_DIR="$REF" >> "$OUT/ampere-build.log" 2>&1
targets="qinfer $(cd tests && ls cuda_*_test.cpp | sed 's/\.cpp$//' | tr '\n' ' ')"
if ! cmake --build "$B80" -j"$(nproc)" --target $targets >> "$OUT/ampere-build.log" 2>&1; then
  echo "ampere (compute_80 PTX) build FAILED"; grep -E "error|FAILED:" "$OUT/ampere-build.log" | head -20; exit 0
fi
echo "ampere (compute_80 PTX) build ok in $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
ctest --test-dir "$B80" -R '^cuda_' --output-on-failure -j4 --timeout 300 > "$OUT/ampere-ctest.log" 2>&1
echo "ampere ctest ($(( $(date +%s) - t0 )) s): $(grep -E 'tests passed|tests failed' "$OUT/ampere-ctest.log" | tail -1)"
grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)" "$OUT/ampere-ctest.log" | head -30
grep -E "Failure|Which is|Expected" "$OUT/ampere-ctest.log" | head -20
model="$f"
[ -f "$model" ] || model="$(ls -S "$REF"/tiny-*q4_k_m*.gguf 2>/dev/null | head -1)"
if [ -n "$model" ] && [ -f "$model" ]; then
  echo "== tg64, $(basename "$model"), compute_80 PTX build vs the sm_90 build"
  for b in "$B80" "$BUILD"; do
    [ -x "$b/qinfer" ] || continue
    printf '%s: ' "$b"
    "$b/qinfer" bench -m "$model" -ngl all -p 0 -n 64 -r 3 2>&1 | grep -E "^\|.*tg" | awk -F'|' '{print $8}'
  done
fi
