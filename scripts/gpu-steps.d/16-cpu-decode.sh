#!/usr/bin/env bash
# Where CPU decode loses against the host's read bandwidth (decode at -ngl 0
# reads ~65 of ~120 GB/s on the 16-core H200 host): the matvec kernels alone
# at 1 / 2 / all threads against the streaming read, and whole-model decode by
# thread count with the layers / head split (QINFER_STEP_TIMES).
#   bash 16-cpu-decode.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
. "$(dirname "$0")/lib/common.sh" "$@"
QB="$BUILD/bench/quant_bench"
echo "== host"
lscpu 2>/dev/null | grep -E '^(Model name|Socket|Core|Thread|CPU\(s\)|CPU max MHz|L3|NUMA node\(s\))' || true
if [ -x "$QB" ]; then
  echo "== matvec kernels (GB/s of weights) and streaming read"
  timeout 240 "$QB" --benchmark_filter='BM_MemRead|BM_Matvec/type:(12|14)/K:(2560/N:9216|9216/N:2560)|BM_MatvecL2/type:1[24]' \
    --benchmark_min_time=0.2 2>&1 | grep -E "^BM_" | sed -E 's/ +[0-9]+ ns +[0-9]+ ns +[0-9]+//'
fi
need_bench_model
echo "== decode by thread count, -ngl 0 (layers vs head per token)"
for t in 4 8 12 16; do
  QINFER_STEP_TIMES=1 timeout 120 "$Q" bench -m "$f" -p 0 -n 32 -r 2 -t "$t" -ngl 0 -o md 2>&1 \
    | grep -E "tg32|^  decode" | sed "s/^/t=$t /"
done
echo "== CPU op profile of decode, 16 threads (QINFER_CPU_PROFILE; includes the warm-up run)"
for ngl in 0 24; do
  QINFER_CPU_PROFILE=1 timeout 120 "$Q" bench -m "$f" -p 0 -n 32 -r 1 -t 16 -ngl "$ngl" -o md 2>&1 \
    | grep -E -A22 "^CPU op profile|tg32" | sed "s/^/ngl=$ngl /"
done
echo "== long rows in chunks (default) vs one pass per row (QINFER_CPU_CHUNK_ROWS=0), -ngl 0 decode"
for v in 1 0; do
  QINFER_CPU_CHUNK_ROWS=$v timeout 120 "$Q" bench -m "$f" -p 0 -n 32 -r 2 -t 16 -ngl 0 -o md 2>/dev/null \
    | grep -E "tg32" | sed "s/^/chunk-rows=$v /"
done
