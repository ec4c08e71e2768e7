#!/usr/bin/env bash
# The random-weight Qwen3.5-4B-shaped Q4_K_M model that the benchmark, placement
# and server steps share, generated once per machine into $QINFER_BENCH_MODELS
# (default /tmp/qinfer-models). 30-cuda-bench adds the Qwen3-4B one.
#   bash 05-models.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
. "$(dirname "$0")/lib/common.sh" "$@"
mkdir -p "$M"
[ -f "$f" ] && { echo "have $f"; exit 0; }
t0=$(date +%s)
timeout 600 "$Q" convert --random qwen35-4b --outtype q4_k_m "$f" > "$OUT/gen-qwen35-4b.log" 2>&1 \
  || { echo "generating qwen35-4b FAILED"; tail -3 "$OUT/gen-qwen35-4b.log"; rm -f "$f"; exit 0; }
echo "generated $f ($(stat -c %s "$f") bytes) in $(( $(date +%s) - t0 )) s"
