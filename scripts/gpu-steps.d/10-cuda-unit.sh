#!/usr/bin/env bash
# CUDA tests: results of the cuda_* tests from the ctest run (failures with
# their output), then the model test again for its printed max differences.
#   bash 10-cuda-unit.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
BUILD=$1; REF=$2; OUT=$3
export QINFER_REFERENCE_DIR="$REF"
if [ -f "$OUT/ctest.log" ]; then
  echo "== cuda tests in ctest"
  grep -E "Test +#[0-9]+: [^ ]*Cuda" "$OUT/ctest.log" | grep -v -E " Passed " | head -40
  echo "passed: $(grep -E 'Test +#[0-9]+: [^ ]*Cuda' "$OUT/ctest.log" | grep -c ' Passed ')  not passed: $(grep -E 'Test +#[0-9]+: [^ ]*Cuda' "$OUT/ctest.log" | grep -vc ' Passed ')"
  grep -E "Failure|Expected|Which is|actual|max\|" "$OUT/ctest.log" | grep -i -E "cuda|max\||Which|Expected" | head -40
fi
bin="$BUILD/tests/cuda_model_test"
if [ -x "$bin" ]; then
  t0=$(date +%s)
  "$bin" > "$OUT/cuda_model_test.log" 2>&1
  rc=$?
  echo "== cuda_model_test rc=$rc ($(( $(date +%s) - t0 )) s)"
  grep -E "max\||greedy ids checked|FAILED|Failure|Expected|Which is" "$OUT/cuda_model_test.log" | head -60
fi
bin="$BUILD/tests/cuda_deltanet_test"
if [ -x "$bin" ]; then
  echo "== DeltaNet prefill kernels at model shapes (serial vs chunked, error and time)"
  "$bin" --gtest_filter='*Prefill*' > "$OUT/cuda_deltanet_prefill.log" 2>&1
  grep -vE "^\[|^Running|^Note|^$" "$OUT/cuda_deltanet_prefill.log" | head -30
fi
bin="$BUILD/tests/cuda_kernels_test"
if [ -x "$bin" ]; then
  echo "== kernel boundary cost in a captured graph"
  "$bin" --gtest_filter='CudaLaunchTiming.*' 2>&1 | grep -E "timing \]|FAILED|Failure" | head -5
fi
