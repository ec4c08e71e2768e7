#!/usr/bin/env bash
# On a GPU machine: where kernels let their dependents be scheduled
# (QINFER_CUDA_PDL_TRIGGER: 0 at their start, 1 after their wait, 2 at exit).
# Builds, checks CUDA-vs-CPU logits, runs tg128 and decode at 512 / 32k keys for
# each mode (runs alternating), mode 1 in one source file at a time
# (QINFER_CUDA_PDL_TRIGGER_FILES), then memcheck and the decode / model tests.
# LIM: seconds after which the remaining benchmark runs are skipped.
#   scripts/pdl-trigger-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/qinfer-gpu-out}"; mkdir -p "$OUT"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
LIM=${LIM:-300}
export QINFER_GPU_STEPS="05 20" QINFER_SKIP_CTEST=1
export QINFER_BUILD_TARGETS="qinfer cuda_ops_test cuda_decode_test cuda_model_test cuda_kernels_test cuda_prefill_attention_test"
bash scripts/gpu-check.sh > "$OUT/check-build.txt" 2>&1; grep -E "build|PASS|FAIL|OPEN|gpu " "$OUT/summary.txt" | tail -9
echo "built + logits at $(el) s"
B=build-gpu; M=${QINFER_BENCH_MODELS:-/tmp/qinfer-models}
tg() { [ $(el) -gt $LIM ] && { echo "skip tg128 $*"; return; }
  env "$@" timeout 60 $B/qinfer bench -m "$M/qwen35-4b-q4_k_m.gguf" -ngl all -p 0 -n 128 -r 2 -o md 2>&1 |
    grep -E "tg|rror" | sed "s/^/$* /"; }
dd() { [ $(el) -gt $LIM ] && { echo "skip depth $*"; return; }
  env "$@" timeout 60 $B/qinfer bench -m "$M/qwen35-4b-q4_k_m.gguf" -ngl all -ctk q8_0 -ctv q8_0 -p 0 -n 64 \
    -d 512,32768 -r 2 -o md 2>&1 | grep -E "tg|rror" | sed "s/^/$* /"; }
for i in 1 2; do for x in 0 1 2; do tg QINFER_CUDA_PDL_TRIGGER=$x; done; done
for x in 0 1 2; do dd QINFER_CUDA_PDL_TRIGGER=$x; done
# which kernels carry the difference: mode 1 in one source file at a time
for f in matvec deltanet ops quantize attention; do tg QINFER_CUDA_PDL_TRIGGER=1 QINFER_CUDA_PDL_TRIGGER_FILES=$f; done
echo "benchmarks at $(el) s"
QINFER_GPU_STEPS="25" bash scripts/gpu-check.sh > "$OUT/check25.txt" 2>&1; grep -E "PASS|FAIL" "$OUT/summary.txt" | tail -7
export QINFER_REFERENCE_DIR="$PWD/.gpu-data"
for t in decode model; do
  timeout 100 $B/tests/cuda_${t}_test > "$OUT/t-$t.txt" 2>&1
  echo "cuda_${t}_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/t-$t.txt" | tr '\n' ' ')"
  grep -E "^\[  FAILED" "$OUT/t-$t.txt" | head -5
done
echo "done at $(el) s"
