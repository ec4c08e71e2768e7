#!/usr/bin/env bash
# On a GPU machine: decode speed of this tree under several environment
# settings, alternating on one warm GPU (for switches such as
# QINFER_CUDA_SMALL_TRIGGER_TOP that choose between forms of the same binary).
#   scripts/gpu-env-ab.sh "" "QINFER_CUDA_SMALL_TRIGGER_TOP=1" "A=1 B=2" ...
# Each argument is one variant ("" = the defaults). Builds only `qinfer` through
# scripts/gpu-check.sh (no tests), generates the Qwen3.5-4B and Qwen3-4B shaped
# Q4_K_M models once, then runs `qinfer bench -ngl all -p 0 -n 128 -r 2` for
# ROUNDS (default 2) rounds of every variant per model and prints one line each.
# QINFER_AB_MODELS picks the presets; QINFER_AB_ARGS replaces the bench arguments.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/qinfer-gpu-out}"; mkdir -p "$OUT"
[ $# -gt 0 ] || { echo "gpu-env-ab: name at least one variant (\"\" for the defaults)"; exit 1; }
QINFER_GPU_STEPS=05 QINFER_SKIP_CTEST=1 QINFER_BUILD_TARGETS=qinfer bash scripts/gpu-check.sh > "$OUT/env-ab-check.txt" 2>&1
grep -E "^(gpu|build)" "$OUT/summary.txt"
Q=build-gpu/qinfer
[ -x "$Q" ] || { echo "gpu-env-ab: the tree did not build (see $OUT/env-ab-check.txt)"; exit 1; }
M="${QINFER_BENCH_MODELS:-/tmp/qinfer-models}"; mkdir -p "$M"
MODELS="${QINFER_AB_MODELS:-qwen35-4b qwen3-4b}"
for m in $MODELS; do
  f="$M/$m-q4_k_m.gguf"
  [ -f "$f" ] || timeout 600 "$Q" convert --random "$m" --outtype q4_k_m "$f" > /dev/null 2>&1 || echo "gpu-env-ab: cannot generate $m"
done
ARGS="${QINFER_AB_ARGS:--p 0 -n 128 -r 2}"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for m in $MODELS; do
    for v in "$@"; do
      t=$(env $v timeout 300 "$Q" bench -m "$M/$m-q4_k_m.gguf" -ngl all $ARGS -o md 2>&1 \
        | grep -E "^\| .*(tg|pp)[0-9]|rror" | awk -F'|' '{gsub(/ +/, " ", $8); printf "%s", $8}')
      echo "$m r$round [${v:-defaults}]: $t"
    done
  done
done | tee "$OUT/env-ab.txt"
echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); args: $ARGS"
