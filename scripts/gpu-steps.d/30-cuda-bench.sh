#!/usr/bin/env bash
# Kernel bandwidth and whole-model speed on random-weight 4B-shaped Q4_K_M models.
#   bash 30-cuda-bench.sh BUILD_DIR REF_DIR OUT_DIR
# Models are generated once per machine into $QINFER_BENCH_MODELS (default /tmp/qinfer-models).
set -uo pipefail
BUILD=$1; REF=$2; OUT=$3
B="$BUILD/bench/cuda_bench"; Q="$BUILD/qinfer"
M="${QINFER_BENCH_MODELS:-/tmp/qinfer-models}"; mkdir -p "$M"
[ -x "$B" ] || { echo "cuda_bench missing"; exit 0; }
echo "== kernels"
timeout 300 "$B" --kernels 2>&1 | tee "$OUT/bench-kernels.txt"
for preset in qwen35-4b qwen3-4b; do
  f="$M/$preset-q4_k_m.gguf"
  if [ ! -f "$f" ]; then
    t0=$(date +%s)
    timeout 600 "$Q" convert --random "$preset" --outtype q4_k_m "$f" > "$OUT/gen-$preset.log" 2>&1 || { echo "generating $preset FAILED"; tail -3 "$OUT/gen-$preset.log"; rm -f "$f"; continue; }
    echo "generated $f in $(( $(date +%s) - t0 )) s"
  fi
done
run() {  # preset args...
  local f="$M/$1-q4_k_m.gguf"; shift
  [ -f "$f" ] || return
  echo "== $(basename "$f")"
  QINFER_CUDA_VERBOSE=1 timeout 600 "$B" --model "$f" "$@" 2>&1 | tee -a "$OUT/bench-models.txt"
}
: > "$OUT/bench-models.txt"
run qwen35-4b --pp 512 --tg 128 --ttft 4096 --long 32768
run qwen35-4b --pp 512 --tg 64 --ttft 0 --variants
run qwen3-4b --pp 512 --tg 128
echo
echo "CUDA speed (targets: qwen35-4b tg128 >= 1000, pp512 >= 22000, ttft4096 <= 175 ms, tg@32k >= 0.9 x tg@512; qwen3-4b tg128 >= 1100, pp512 >= 26000)"
grep -E "^model|^pp|^tg|^ttft|^QINFER|uploaded" "$OUT/bench-models.txt"
echo
echo "== qinfer bench A/B (Qwen3.5-4B Q4_K_M, -ngl all): default, fused norms off, serial delta rule, no programmatic dependent launch"
f="$M/qwen35-4b-q4_k_m.gguf"
if [ -f "$f" ]; then
  for v in "" "QINFER_CUDA_FUSE_NORM=0" "QINFER_CUDA_GDR=serial" "QINFER_CUDA_PDL=0"; do
    env $v timeout 200 "$Q" bench -m "$f" -ngl all -p 512,4096 -n 128 -r 3 -o md 2>/dev/null | grep -E "pp|tg|TTFT" | sed "s/^/${v:-default} /"
  done
fi
echo
echo "== KV cache type (decode at 512 and 32768 keys): f16 against q8_0 (half the bytes)"
if [ -f "$f" ]; then
  for kv in f16 q8_0; do
    timeout 300 "$Q" bench -m "$f" -ngl all -ctk $kv -ctv $kv -p 0 -n 64 -d 512,32768 -r 3 -o md 2>&1 \
      | grep -E "tg|rror" | sed "s/^/$kv /"
  done
fi
