#!/usr/bin/env bash
# Whole-model A/B on the 4B-shaped Qwen3.5 Q4_K_M, all layers on the GPU:
# the default against each switch in QINFER_AB_VARIANTS (space-separated
# items of VAR=value, several joined by commas; default: programmatic
# dependent launch off). QINFER_AB_ARGS replaces the bench arguments
# (default -p 512,4096 -n 128 -r 3).
#   bash 31-decode-ab.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
. "$(dirname "$0")/lib/common.sh" "$@"
need_bench_model
args=${QINFER_AB_ARGS:--p 512,4096 -n 128 -r 3}
echo "== qinfer bench A/B: -ngl all $args"
for v in "" ${QINFER_AB_VARIANTS:-QINFER_CUDA_PDL=0}; do
  # shellcheck disable=SC2086
  env ${v//,/ } timeout 150 "$Q" bench -m "$f" -ngl all $args -o md 2>/dev/null \
    | grep -E "pp|tg|TTFT" | sed "s/^/${v:-default} /"
done
