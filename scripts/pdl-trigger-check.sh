#!/usr/bin/env bash
# On a GPU machine: what keeps QINFER_CUDA_PDL_TRIGGER=1 (kernels let the next
# one be scheduled once their inputs are ready, +4.8% tg128 on an H200) from
# being the default. CudaStream.StreamedWeightsEqualUploaded failed with it
# (a read after products on streamed weights: cudaErrorInvalidValue). Builds,
# runs that test under probes (launch blocking, PDL off, mode 1 one source file
# at a time, compute-sanitizer's API error report), then every CUDA test with
# mode 1 and the tg128 A/B.
#   scripts/pdl-trigger-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/qinfer-gpu-out}"; mkdir -p "$OUT"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
export QINFER_GPU_STEPS="05" QINFER_SKIP_CTEST=1
export QINFER_BUILD_TARGETS="${QINFER_BUILD_TARGETS:-qinfer $(cd tests && ls cuda_*_test.cpp | sed 's/\.cpp$//' | tr '\n' ' ')}"
bash scripts/gpu-check.sh > "$OUT/check-build.txt" 2>&1; grep -E "build|gpu " "$OUT/summary.txt" | tail -3
echo "built at $(el) s"
B=build-gpu; T=$B/tests/cuda_stream_test
probe() { tag=$1; shift; env "$@" timeout 60 $T 2>&1 | grep -E "OK \]|FAILED \]|rror" | head -3 | sed "s/^/$tag: /"; }
probe "mode 1" QINFER_CUDA_PDL_TRIGGER=1
probe "mode 0" QINFER_CUDA_PDL_TRIGGER=0
probe "mode 1, launch blocking" QINFER_CUDA_PDL_TRIGGER=1 CUDA_LAUNCH_BLOCKING=1
probe "mode 1, PDL off" QINFER_CUDA_PDL_TRIGGER=1 QINFER_CUDA_PDL=0
probe "mode 1, modules loaded eagerly" QINFER_CUDA_PDL_TRIGGER=1 CUDA_MODULE_LOADING=EAGER
for f in matvec mma quantize ops attention deltanet sampling; do
  probe "mode 1 in $f only" QINFER_CUDA_PDL_TRIGGER=1 QINFER_CUDA_PDL_TRIGGER_FILES=$f
done
QINFER_CUDA_PDL_TRIGGER=1 timeout 120 compute-sanitizer --tool memcheck $T > "$OUT/stream-sanitizer.txt" 2>&1
grep -E "Program hit|ERROR SUMMARY|Host Frame" "$OUT/stream-sanitizer.txt" | head -24
echo "probes at $(el) s"
QINFER_CUDA_PDL_TRIGGER=1 ctest --test-dir $B -R "^cuda_" -j4 --timeout 300 > "$OUT/ctest-mode1.txt" 2>&1
grep -E "tests passed|tests failed|\((Failed|Timeout)" "$OUT/ctest-mode1.txt" | head -20
M=${QINFER_BENCH_MODELS:-/tmp/qinfer-models}
for i in 1 2; do for x in 0 1; do
  QINFER_CUDA_PDL_TRIGGER=$x timeout 60 $B/qinfer bench -m "$M/qwen35-4b-q4_k_m.gguf" -ngl all -p 0 -n 128 -r 2 -o md 2>&1 |
    grep -E "tg|rror" | sed "s/^/mode $x /"
done; done
echo "done at $(el) s"
