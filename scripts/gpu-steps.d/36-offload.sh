#!/usr/bin/env bash
# Prompt offload on the 4B-shaped Q4_K_M model: prompt speed by batch size at
# -ngl 0/16/24 (weights streamed from the pinned file pages), the staging-ring
# fallback for comparison, and where offload starts to beat the CPU.
#   bash 36-offload.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
. "$(dirname "$0")/lib/common.sh" "$@"
need_bench_model
T=$(( $(nproc) ))
echo "== prompt offload from 1 token, pinned weights: pp32..512 and TTFT"
for ngl in 0 16 24; do
  timeout 200 "$Q" bench -m "$f" -p 32,64,128,512 -n 0 -r 2 -t "$T" -ngl "$ngl" --op-offload-min-batch 1 -o md 2>>"$OUT/offload.err" \
    | grep -E "pp[0-9]|TTFT" | sed "s/^/ngl $ngl pinned /" || echo "ngl $ngl FAILED"
done
echo "== the staging ring instead (QINFER_CUDA_NO_PIN=1), -ngl 0"
QINFER_CUDA_NO_PIN=1 timeout 200 "$Q" bench -m "$f" -p 128,512 -n 0 -r 2 -t "$T" -ngl 0 --op-offload-min-batch 1 -o md 2>>"$OUT/offload.err" \
  | grep -E "pp[0-9]|TTFT" | sed "s/^/ngl 0 staged /"
echo "== placement as loaded (-ngl 16)"
QINFER_CUDA_VERBOSE=1 timeout 120 "$Q" bench -m "$f" -p 64 -n 0 -r 1 -ngl 16 -o json 2>&1 | grep -oE '"placement": *"[^"]*"|unpinned[^"]*' | head -3
grep -iE "error|warning" "$OUT/offload.err" | sort | uniq -c | head -5
